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

// landedThenNoResponders: the first record update lands but its answer
// times out; from then on reads get no responders, as while the bucket's
// leader moves.
type landedThenNoResponders struct {
	jetstream.KeyValue
	landed *atomic.Bool
}

func (k landedThenNoResponders) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	r, err := k.KeyValue.Update(ctx, key, value, rev)
	if err == nil && k.landed.CompareAndSwap(false, true) {
		return 0, nats.ErrTimeout
	}
	return r, err
}

func (k landedThenNoResponders) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if k.landed.Load() {
		return nil, nats.ErrNoResponders
	}
	return k.KeyValue.Get(ctx, key)
}

// A claim whose first write landed (its answer lost) is retried; the
// retry's Create finds the key (its own claim), and the read that follows
// fails. Stop waits that claim out, as for any claim a try of which may
// have landed, whatever the last try's error: handed back at once, its next
// delivery, its last, found the claim and went back again, dead-lettered
// without ever running (see TestStopWaitsOutAClaimThatMayHaveLanded).
func TestStopWaitsOutAClaimThatLandedThoughALaterTryWasRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{MaxDeliver: 2, AckWait: 6 * time.Second})
	l := failedBefore(t, obj, "J") // J has a record: it is claimed first
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	landed := new(atomic.Bool)
	p.ledger = data.NewLedger(landedThenNoResponders{KeyValue: obj.Ledger, landed: landed}, obj.Config.lease(), obj.JS)
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !landed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("J's claim never landed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // its retries read with no responders
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := p.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	runs, dead := runsAfterStop(t, obj)
	rec, _ := l.Get(ctx, "J")
	if runs != 1 || dead != 0 {
		t.Errorf("J, on delivery 1 of 2 at a stop, its landed claim's retry read with no responders: ran %d times after it (want 1), DLQ holds %d (want 0); record %+v", runs, dead, rec)
	}
}
