package queue

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// Pool A's claim of job J lapsed while A's handler ran (its renewals came
// too late), and pool B took J over: B runs it, or has recorded it done.
// A's handler then failed for good. A published J's dead letter and acked J
// before its record of the failure, a compare-and-set on its claim, was
// refused (logged as "record dead-lettered job"): J was both done (or
// running) in B and dead-lettered in DLQ. Only the holder of a job's claim,
// or of its place in the pool's lease, may dead-letter it; A leaves the
// outcome to B, and neither acks nor releases J.
func TestAJobWhoseClaimWasTakenOverIsNotDeadLetteredByItsFormerHolder(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		leased bool // J runs in A on the pool's lease, not a claim of its own
		bDone  bool // B recorded J done before A's handler returned
	}{
		{"claim, B runs it", false, false},
		{"claim, B recorded it done", false, true},
		{"lease, B recorded it done", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := objectsWith(t, Config{AckWait: 3 * time.Second, MaxDeliver: 5, RetryBackoff: []time.Duration{100 * time.Millisecond}})
			var takeOver func()
			a := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
				takeOver() // A's claim or lease lapsed while its handler ran
				return handlers.Permanent(errors.New("bad input"))
			}), servertest.Logger(t))
			t.Cleanup(a.ledger.Close)
			b := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
			t.Cleanup(b.ledger.Close)

			msg := &outcomeMsg{}
			var itA *inflight
			var claimB data.Claim
			if tt.leased {
				itA = stubJob("J", 1)
				itA.job.Subject = "job.x"
				leaseOne(t, a, itA)
				takeOver = func() {
					// A's lease is not renewed in time: it ends (as in
					// TestARecordStoredLateByALapsedLeaseKeepsItsJobToOnePool),
					// and B leases J's redelivery as a resumed attempt.
					past := time.Now().Add(-time.Second).UTC()
					seq, err := a.ledger.WriteLease(ctx, a.lease.owner, data.Lease{Worker: "a", Until: past, Jobs: []data.LeasedJob{{Key: "J", Seq: 1}}}, a.lease.last)
					if err != nil {
						t.Error(err)
						return
					}
					a.lease.mu.Lock()
					a.lease.last, a.lease.until = seq, past
					a.lease.mu.Unlock()
					itB := stubJob("J", 1)
					itB.job.Subject, itB.job.Attempt = "job.x", 2
					leaseOne(t, b, itB)
					claimB = itB.claim
					if err := b.ledger.Done(ctx, &claimB, time.Millisecond); err != nil {
						t.Errorf("B records J done: %v", err)
					}
				}
			} else {
				job := &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 1}
				// A's claim, which is not renewed: it ends at once.
				claimA, err := data.NewLedger(obj.Ledger, 50*time.Millisecond, nil).Claim(ctx, job, "a")
				if err != nil {
					t.Fatal(err)
				}
				itA = &inflight{job: job, claim: claimA}
				takeOver = func() {
					jobB := &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 2}
					deadline := time.Now().Add(5 * time.Second)
					for {
						claimB, err = b.ledger.Claim(ctx, jobB, "b")
						if !errors.Is(err, data.ErrClaimed) || time.Now().After(deadline) {
							break
						}
						time.Sleep(20 * time.Millisecond)
					}
					if err != nil {
						t.Errorf("B claims J once A's claim ended: %v", err)
						return
					}
					if tt.bDone {
						if err := b.ledger.Done(ctx, &claimB, time.Millisecond); err != nil {
							t.Errorf("B records J done: %v", err)
						}
					}
				}
			}
			itA.msg = msg

			if a.runOne(ctx, itA) {
				t.Fatal("runOne reported a success")
			}
			a.release(itA)
			if t.Failed() {
				return
			}
			if n, err := DeadLetterCount(ctx, obj); err != nil || n != 0 {
				t.Errorf("DLQ holds %d dead letters (%v), want 0: A dead-lettered J after B took it over", n, err)
			}
			if acks, naks := msg.acks.Load(), msg.naks.Load(); acks != 0 || naks != 0 {
				t.Errorf("A acked J %d times and released it %d times; want neither: J's outcome is B's to record", acks, naks)
			}
			if !tt.bDone {
				if err := b.ledger.Done(ctx, &claimB, time.Millisecond); err != nil {
					t.Errorf("B records J done: %v", err)
				}
			}
			rec, err := b.ledger.Get(ctx, "J")
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != data.StateDone {
				t.Errorf("J's record is %s (last error %q), want done, as B recorded it", rec.State, rec.LastError)
			}
		})
	}
}

// failedRecordsLost stores no failed record, as when the process is killed
// after a job's dead letter and before its record of it.
type failedRecordsLost struct{ jetstream.KeyValue }

func (k failedRecordsLost) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if strings.Contains(string(value), `"state":"failed"`) {
		return 0, nats.ErrTimeout
	}
	return k.KeyValue.Update(ctx, key, value, rev)
}

// A pool killed after a job's dead letter was stored, and before the job
// was recorded failed and acked, left the record a claim, which lapsed: the
// job's redelivery took it over and ran the job again, as a resumed attempt
// of a job that had failed for good and was in DLQ. Its record says that
// it awaits its dead letter before the dead letter is stored: the
// redelivery is dead-lettered (DLQ keeps one) and acked without running.
func TestAJobKilledAfterItsDeadLetterDoesNotRunAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second, MaxDeliver: 5, RetryBackoff: []time.Duration{100 * time.Millisecond}})
	a := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		return handlers.Permanent(errors.New("bad input"))
	}), servertest.Logger(t))
	t.Cleanup(a.ledger.Close)
	a.ledger = data.NewLedger(failedRecordsLost{obj.Ledger}, a.cfg.lease(), nil)
	t.Cleanup(a.ledger.Close)
	stored := time.Now().Add(-time.Minute).UTC()
	job := &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 1, EnqueuedAt: stored}
	// A's claim, as a killed pool leaves it: it ends at once.
	claimA, err := data.NewLedger(obj.Ledger, 50*time.Millisecond, nil).Claim(ctx, job, "a")
	if err != nil {
		t.Fatal(err)
	}
	if a.runOne(ctx, &inflight{msg: &outcomeMsg{}, job: job, claim: claimA}) {
		t.Fatal("runOne reported a success")
	}
	// A was killed there: its ack never went out. J is delivered again,
	// once A's claim ended, to pool B.
	time.Sleep(time.Until(claimA.Record.LeaseUntil) + 50*time.Millisecond)
	b := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	t.Cleanup(b.ledger.Close)
	msgB := &outcomeMsg{}
	itB := &inflight{msg: msgB, job: &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 2, EnqueuedAt: stored}}
	if b.claimed(ctx, itB) {
		t.Fatal("J's redelivery is handed to B's handler: J, in DLQ already, runs again")
	}
	if n, err := DeadLetterCount(ctx, obj); err != nil || n != 1 {
		t.Errorf("DLQ holds %d dead letters (%v), want J's one", n, err)
	}
	if acks := msgB.acks.Load(); acks != 1 {
		t.Errorf("J's redelivery acked %d times, want once", acks)
	}
	if rec, err := b.ledger.Get(ctx, "J"); err != nil || rec.State != data.StateFailed {
		t.Errorf("J's record: %+v, %v; want it failed", rec, err)
	}
}
