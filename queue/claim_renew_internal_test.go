package queue

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// failFirstUpdateOf fails the first record update of key at once, as a
// bucket whose leader is moving does (no responders): it stores nothing.
type failFirstUpdateOf struct {
	jetstream.KeyValue
	key  string
	once *atomic.Bool
}

func (k failFirstUpdateOf) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if key == k.key && k.once.CompareAndSwap(false, true) {
		return 0, nats.ErrNoResponders
	}
	return k.KeyValue.Update(ctx, key, value, rev)
}

// A claim settled close to its give-up moment is renewed before its job
// starts. When that renewal fails (one transient ledger error), the claim
// is settled again, the job held with heartbeats, as for a claim whose
// answer was lost: no delivery is spent. Handed back at once, its
// redelivery found the pool's own live claim and went back again, and with
// --max-deliver 2 the job was dead-lettered having never run.
func TestRenewalFailureBeforeStartSpendsNoDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := hAheadOfX(t, 2)
	var xRuns atomic.Int32
	p := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		if job.ID == "X" {
			xRuns.Add(1)
		}
		return nil
	}), servertest.Logger(t))
	if p.leasing {
		t.Fatal("pool leases: want every job claimed first")
	}
	// H's claim settles 2.7s after the fetch, so X's claim is renewed
	// before X starts; that renewal fails once, storing nothing.
	var kv jetstream.KeyValue = slowFirstUpdateOf{KeyValue: obj.Ledger, key: "H", delay: 2700 * time.Millisecond, once: new(atomic.Bool)}
	kv = failFirstUpdateOf{KeyValue: kv, key: "X", once: new(atomic.Bool)}
	p.ledger = data.NewLedger(kv, obj.Config.lease(), obj.JS)
	startPool(t, p)

	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && xRuns.Load() == 0 {
		di, err := obj.Dead.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if di.State.Msgs > 0 {
			rec, _ := data.NewLedger(obj.Ledger, 0, nil).Get(ctx, "X")
			t.Fatalf("X was dead-lettered without ever running (runs %d), after one failed renewal of its claim; record %+v", xRuns.Load(), rec)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if xRuns.Load() != 1 {
		t.Fatalf("X ran %d times in 15s, want 1", xRuns.Load())
	}
}

// hAheadOfX provisions a bucket without direct gets, so that every job is
// claimed first, with an ack wait of 6s (heartbeat 2s, claim 4s, give-up
// 3s after the claim) and maxDeliver, and enqueues H, which has a record
// (claimed synchronously), then X, whose claim is settled after H's.
func hAheadOfX(t *testing.T, maxDeliver int) *Objects {
	t.Helper()
	obj := claimingObjects(t, Config{AckWait: 6 * time.Second, MaxDeliver: maxDeliver, Workers: 1,
		RetryBackoff: []time.Duration{10 * time.Millisecond}, FetchWait: 200 * time.Millisecond})
	failedBefore(t, obj, "H")
	prod := NewProducer(obj.JS, obj.Config)
	for _, id := range []string{"H", "X"} {
		if _, err := prod.Enqueue(context.Background(), "job.x", []byte(id), EnqueueOptions{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	return obj
}
