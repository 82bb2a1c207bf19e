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

// landedTimeoutFor stores the first record update of each of its keys but
// answers it with a timeout, as when the bucket's ack is lost on the way
// back (landedTimeout, for chosen keys).
type landedTimeoutFor struct {
	jetstream.KeyValue
	keys map[string]*atomic.Bool
}

func (k landedTimeoutFor) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	r, err := k.KeyValue.Update(ctx, key, value, rev)
	if once := k.keys[key]; err == nil && once != nil && once.CompareAndSwap(false, true) {
		return 0, nats.ErrTimeout
	}
	return r, err
}

// Without leases (a server before 2.11, or a bucket without direct gets),
// every job is claimed as soon as it is fetched, and the claims are settled
// one at a time, in order; nothing renews a claim before it is settled. A
// job ahead that waits out its own landed claim (its answer was lost) can
// hold the others until their claims ended in the ledger, for another pool
// to take over (here a re-drive's copy). Such a claim is renewed before its
// job runs, or the job goes back: the two never run at once.
func TestClaimThatEndedWhileQueuedIsRenewedOrReleased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := claimingObjects(t, Config{AckWait: 3 * time.Second, MaxDeliver: 20, Workers: 4,
		RetryBackoff: []time.Duration{10 * time.Millisecond}, FetchWait: 200 * time.Millisecond})
	l := failedBefore(t, obj, "H1") // H1 and H2 have records: claimed synchronously
	failedBefore(t, obj, "H2")

	prod := NewProducer(obj.JS, obj.Config)
	for _, id := range []string{"H1", "H2", "X"} { // one batch, claimed in this order
		if _, err := prod.Enqueue(ctx, "job.x", []byte(id), EnqueueOptions{ID: id}); err != nil {
			t.Fatal(err)
		}
	}

	var bRunning, overlap atomic.Bool
	aRanX := make(chan struct{}, 4)
	a := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		if job.ID != "X" {
			return nil
		}
		if bRunning.Load() {
			overlap.Store(true)
		}
		aRanX <- struct{}{}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
			return nil
		}
	}), servertest.Logger(t))
	if a.leasing {
		t.Fatal("pool A leases: want every job claimed first")
	}
	a.ledger = data.NewLedger(landedTimeoutFor{KeyValue: obj.Ledger, keys: map[string]*atomic.Bool{"H1": new(atomic.Bool), "H2": new(atomic.Bool)}}, obj.Config.lease(), obj.JS)
	startPool(t, a)

	// X's async claim landed; A takes no more jobs, so the copy goes to B.
	var xClaim data.Record
	waitUntil := time.Now().Add(5 * time.Second)
	for {
		rec, err := l.Get(ctx, "X")
		if err == nil && rec.State == data.StateRunning {
			xClaim = rec
			break
		}
		if time.Now().After(waitUntil) {
			t.Fatalf("X never claimed: %+v, %v", rec, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	a.fetchCancel()
	time.Sleep(time.Until(xClaim.LeaseUntil) + 200*time.Millisecond)
	select {
	case <-aRanX:
		t.Fatal("A ran X before its claim ended: the head-of-line wait did not happen")
	default:
	}

	// X's claim ended unrenewed while A held X behind H1 and H2. A copy
	// of X (as dlq retry publishes) is claimed by B, which takes the
	// ended claim over.
	bRan := make(chan struct{}, 4)
	b := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		if job.ID != "X" {
			return nil
		}
		bRunning.Store(true)
		defer bRunning.Store(false)
		bRan <- struct{}{}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(4 * time.Second):
			return nil
		}
	}), servertest.Logger(t))
	startPool(t, b)
	m := nats.NewMsg("job.x")
	m.Header.Set(nats.MsgIdHdr, "copy-of-X")
	m.Header.Set(HeaderJobID, "X")
	if _, err := obj.JS.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bRan:
	case <-time.After(5 * time.Second):
		t.Fatal("B never ran the copy of X")
	}
	select {
	case <-aRanX:
	case <-time.After(6 * time.Second):
		return // A never ran X on its ended claim: fine
	}
	if overlap.Load() {
		t.Fatalf("A started X on a claim that had ended in the ledger (lease_until %s) while B, which took it over, ran X: two handlers of X at once", xClaim.LeaseUntil.Format(time.RFC3339Nano))
	}
}
