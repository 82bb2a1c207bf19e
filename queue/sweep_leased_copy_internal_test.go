package queue

import (
	"context"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// The leasing sibling of TestSweepLeavesALiveClaimOfAnotherCopyAlone:
// copy A of X has no record (it never ran), so the sweep looks for a live
// lease, finds none, and dead-letters A; meanwhile pool P leases copy B of
// X (no record: it goes into P's lease and runs on a prepared claim).
// FailUnclaimed then creates X's failed record: B's done record, which
// creates the record, is refused as "claim lost", and B, unacked, runs
// again on its redelivery though it succeeded.
func TestSweepLeavesALeasedCopyAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{FetchWait: 200 * time.Millisecond})
	hook, mA, bMsg := twoCopiesOfX(t, obj)
	pp := leasingPool(t, obj)
	itB := stubJob("X", bMsg.Sequence)
	itB.job.Subject, itB.job.EnqueuedAt = "job.x", bMsg.Time
	var leased []*inflight
	hook.before = func() { // pool P leases B just now
		hook.before = nil
		leased, _, _ = pp.admitBatch(ctx, checkOf(t, pp, []*inflight{itB}))
	}
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	t.Cleanup(p.ledger.Close)
	if _, err := p.sweepOne(ctx, mA); err != nil {
		t.Fatalf("sweep A: %v", err)
	}
	if len(leased) != 1 {
		t.Fatalf("pool P did not lease B (%d leased)", len(leased))
	}
	if err := pp.ledger.Done(ctx, &itB.claim, time.Millisecond); err != nil {
		t.Errorf("P records B done: %v; the sweep created X's failed record while P's lease held B", err)
	}
}
