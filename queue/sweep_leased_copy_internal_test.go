package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// The leasing sibling of TestSweepLeavesALiveClaimOfAnotherCopyAlone:
// copy A of job X has no record (it never ran) and its deliveries ran out;
// pool P takes copy B of X (no record: it would run on P's lease) at each
// step of the sweep of A. Whatever P then runs must get its outcome
// recorded. The sweep used to look at the leases and then create X's
// failed record outside any lease: B, leased in between, ran, its done
// record was refused as "claim lost", and, unacked, it ran again on its
// redelivery though it had succeeded. The sweep now takes X into its own
// pool's lease first, as a pool takes a job it runs.
func TestSweepAndAPoolTakingAnotherCopyAgree(t *testing.T) {
	t.Parallel()
	for _, step := range []string{"lease write", "record write", "dead letter"} {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := objectsWith(t, Config{FetchWait: 200 * time.Millisecond})
			dlq, mA, bMsg := twoCopiesOfX(t, obj)
			obj.JS = dlq.JetStream // P's writes go past the hooks
			pp := leasingPool(t, obj)

			// The sweep's pool, its writes hooked.
			fired := false
			var takeB func()
			before := func(at string) {
				if at == step && !fired {
					fired = true
					takeB()
				}
			}
			sweepObj := *obj
			dlq.before = func() { before("dead letter") }
			sweepObj.JS = &leaseWriteHook{dlqHook: dlq, before: func() { before("lease write") }}
			sweepObj.Ledger = &recordWriteHook{KeyValue: obj.Ledger, key: data.Key("X"), before: func() { before("record write") }}
			p := NewPool(&sweepObj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
			t.Cleanup(p.ledger.Close)
			if !p.leasing {
				t.Fatal("the sweep's pool does not lease")
			}

			// P takes B, and runs it if it may, while the sweep goes on:
			// its outcome must be recorded.
			itB := stubJob("X", bMsg.Sequence)
			itB.job.Subject, itB.job.EnqueuedAt = "job.x", bMsg.Time
			var claimB *data.Claim
			takeB = func() {
				leased, claimFirst, later := pp.admitBatch(ctx, checkOf(t, pp, []*inflight{itB}))
				switch {
				case len(leased) == 1:
					claimB = &itB.claim
				case len(claimFirst) == 1:
					if c, err := pp.ledger.Claim(ctx, itB.job, "p"); err == nil {
						claimB = &c
					}
				case len(later) != 0:
					t.Errorf("P is to check B again: %d", len(later))
				}
			}
			if _, err := p.sweepOne(ctx, mA); err != nil {
				t.Fatalf("sweep A: %v", err)
			}
			if !fired {
				t.Fatalf("the sweep of A made no %s", step)
			}
			ran := claimB != nil
			if ran {
				if err := pp.ledger.Done(ctx, claimB, time.Millisecond); err != nil {
					t.Errorf("P ran B, and its done record was refused: %v", err)
				}
			}
			if p.lease.size != 0 || len(p.lease.jobs) != 0 {
				t.Errorf("the sweep's pool leases %d jobs after the sweep, want none", len(p.lease.jobs))
			}
			// A is dead-lettered, or removed as X is done, or left in
			// JOB for the next sweep while B runs on P's lease.
			_, gerr := obj.Jobs.GetMsg(ctx, mA.Sequence)
			_, derr := DeadLetterOf(ctx, obj, "X")
			rec, rerr := pp.ledger.Get(ctx, "X")
			done := rerr == nil && rec.State == data.StateDone
			switch left := gerr == nil; {
			case !left && !errors.Is(gerr, jetstream.ErrMsgNotFound):
				t.Fatal(gerr)
			case left && derr == nil:
				t.Errorf("A is dead-lettered and still in JOB")
			case !left && derr != nil && !done:
				t.Errorf("A is gone from JOB with no dead letter, and X is not done: %v", derr)
			case left && !ran:
				t.Errorf("A is left in JOB, and no copy of X ran")
			}
		})
	}
}

// leaseWriteHook calls before ahead of each lease write.
type leaseWriteHook struct {
	*dlqHook
	before func()
}

func (j *leaseWriteHook) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if strings.Contains(m.Subject, "."+data.LeasePrefix) {
		j.before()
	}
	return j.dlqHook.PublishMsg(ctx, m, opts...)
}

// recordWriteHook calls before ahead of each write of key's record.
type recordWriteHook struct {
	jetstream.KeyValue
	key    string
	before func()
}

func (kv *recordWriteHook) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if key == kv.key {
		kv.before()
	}
	return kv.KeyValue.Create(ctx, key, value, opts...)
}

func (kv *recordWriteHook) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if key == kv.key {
		kv.before()
	}
	return kv.KeyValue.Update(ctx, key, value, revision)
}

// A copy of X that runs on the sweeping pool's own lease keeps X: the
// sweep leaves A in JOB, with no dead letter and no record, until that
// copy's outcome is recorded.
func TestSweepLeavesAJobItsOwnPoolRunsOnItsLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{FetchWait: 200 * time.Millisecond})
	_, mA, bMsg := twoCopiesOfX(t, obj)
	p := leasingPool(t, obj)
	itB := stubJob("X", bMsg.Sequence)
	itB.job.Subject, itB.job.EnqueuedAt = "job.x", bMsg.Time
	leaseOne(t, p, itB)
	if moved, err := p.sweepOne(ctx, mA); err != nil || moved {
		t.Fatalf("sweep A: moved %v, %v; want A left to B's run", moved, err)
	}
	if _, err := obj.Jobs.GetMsg(ctx, mA.Sequence); err != nil {
		t.Errorf("A is gone from JOB: %v", err)
	}
	if d, err := DeadLetterOf(ctx, obj, "X"); err == nil {
		t.Errorf("X is dead-lettered (seq %d) while B runs", d.Seq)
	}
	if rec, err := p.ledger.Get(ctx, "X"); !errors.Is(err, data.ErrNotFound) {
		t.Errorf("X has a record (%+v, %v) while B runs on its prepared claim", rec, err)
	}
	if j, held, _ := p.lease.find(data.Key("X")); !held || !j.mine(itB) {
		t.Errorf("the pool's lease no longer holds B")
	}
}

// A job that a lease that ended lists may have run there: the sweep records
// it failed and resumed, so that its re-drive's run is resumed too. One
// that no lease lists is not.
func TestSweepRecordsAJobThatALeaseThatEndedListsResumed(t *testing.T) {
	t.Parallel()
	for _, listed := range []bool{true, false} {
		t.Run(fmt.Sprintf("listed=%v", listed), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := objectsWith(t, Config{FetchWait: 200 * time.Millisecond})
			_, mA, _ := twoCopiesOfX(t, obj)
			p := leasingPool(t, obj)
			if listed {
				ended := data.Lease{Worker: "gone", Until: time.Now().Add(-time.Minute), Jobs: []data.LeasedJob{{Key: data.Key("X"), Seq: mA.Sequence}}}
				if _, err := p.ledger.WriteLease(ctx, "gone", ended, 0); err != nil {
					t.Fatal(err)
				}
			}
			if moved, err := p.sweepOne(ctx, mA); err != nil || !moved {
				t.Fatalf("sweep A: moved %v, %v; want it dead-lettered", moved, err)
			}
			rec, err := p.ledger.Get(ctx, "X")
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != data.StateFailed || rec.Resumed != listed || !rec.DeadLettered(&data.Job{ID: "X", Seq: mA.Sequence, EnqueuedAt: mA.Time}) {
				t.Errorf("X's record: %s, resumed %v, of seq %d; want failed, resumed %v, of A (seq %d)", rec.State, rec.Resumed, rec.Seq, listed, mA.Sequence)
			}
			if len(p.lease.jobs) != 0 {
				t.Errorf("the sweep's pool leases %d jobs after the sweep, want none", len(p.lease.jobs))
			}
		})
	}
}
