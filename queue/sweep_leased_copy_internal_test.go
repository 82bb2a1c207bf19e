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
