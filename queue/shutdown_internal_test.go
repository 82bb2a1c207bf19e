package queue

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// A job with a delivery to spare that waits out its own claim, whose write
// landed though its answer was lost, goes on waiting when Stop begins.
// Handed back at once with that claim still live, its next delivery (its
// last) would find the live claim and be released again: dead-lettered
// without ever having run.
//
// So does one whose shutdown timeout comes first: it goes back only once
// that claim has ended.
func TestStopWaitsOutAClaimThatMayHaveLanded(t *testing.T) {
	t.Parallel()
	for _, timeout := range []time.Duration{20 * time.Second, time.Second} {
		t.Run(timeout.String(), func(t *testing.T) {
			t.Parallel()
			stopWaitingOutALandedClaim(t, timeout)
		})
	}
}

func stopWaitingOutALandedClaim(t *testing.T, shutdownTimeout time.Duration) {
	ctx := context.Background()
	obj := objectsWith(t, Config{MaxDeliver: 2, AckWait: 6 * time.Second})
	l := failedBefore(t, obj, "J") // J has a record: it is claimed first
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	p.ledger = data.NewLedger(landedTimeout{KeyValue: obj.Ledger, once: new(atomic.Bool)}, obj.Config.lease(), obj.JS)
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	// J's claim landed, its answer lost: the pool waits it out.
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec, err := l.Get(ctx, "J")
		if err == nil && rec.State == data.StateRunning && rec.Seq != 1000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("J not claimed: %+v %v", rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // in the wait
	sctx, cancel := context.WithTimeout(ctx, shutdownTimeout)
	defer cancel()
	if err := p.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	runs, dead := runsAfterStop(t, obj)
	rec, _ := l.Get(ctx, "J")
	if runs != 1 || dead != 0 {
		t.Errorf("J, on delivery 1 of 2 at a stop with a %s timeout, ran %d times after it (want 1), DLQ holds %d (want 0); record %+v", shutdownTimeout, runs, dead, rec)
	}
}

// runsAfterStop starts another pool on obj, after one stopped, and reports
// how often it ran the job and how many dead letters DLQ holds once the
// job ran or was dead-lettered (or 15s passed).
func runsAfterStop(t *testing.T, obj *Objects) (runs int32, dead uint64) {
	t.Helper()
	ctx := context.Background()
	var n atomic.Int32
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		n.Add(1)
		return nil
	}), servertest.Logger(t))
	startPool(t, p)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && n.Load() == 0 {
		if info, _ := obj.Dead.Info(ctx); info != nil && info.State.Msgs > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	info, err := obj.Dead.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return n.Load(), info.State.Msgs
}
