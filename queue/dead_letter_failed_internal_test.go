package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// dlqHiccup fails the first fails publishes to DLQ's subjects, as a
// publish whose answer timed out (a DLQ leader moving, a busy store).
type dlqHiccup struct {
	jetstream.JetStream
	fails atomic.Int32
}

func (j *dlqHiccup) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if strings.HasPrefix(m.Subject, SubjectDLQPrefix) && j.fails.Add(-1) >= 0 {
		return nil, fmt.Errorf("publish to %s: %w", m.Subject, nats.ErrTimeout)
	}
	return j.JetStream.PublishMsg(ctx, m, opts...)
}

// A job that failed for good, whose dead letter's publish failed once for
// a reason other than a full DLQ (here a timeout), was left unacked and
// unrecorded: "left in JOB for the sweep", though the sweep takes only jobs
// whose deliveries ran out. It was delivered again after the ack wait and
// its handler ran again, as a resumed attempt. A job that failed for good
// must not run again: as with a full DLQ, it waits for its dead letter.
func TestAJobFailedForGoodDoesNotRunAgainWhenItsDeadLetterFails(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		claim      bool
		maxDeliver int
		wantRuns   int32
		wantErr    string
	}{
		{"leasing", false, 10, 1, "broken for good"},
		{"claiming", true, 10, 1, "broken for good"},
		// On its last delivery: the sweep dead-letters it, with the
		// last attempt's error, not the one before.
		{"last delivery", false, 2, 2, "deliveries exhausted (max deliver 2): broken on attempt 2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cfg := Config{MaxDeliver: tt.maxDeliver, AckWait: time.Second, RetryBackoff: []time.Duration{100 * time.Millisecond}, FetchWait: 200 * time.Millisecond}
			var obj *Objects
			if tt.claim {
				obj = claimingObjects(t, cfg)
			} else {
				obj = objectsWith(t, cfg)
			}
			js := &dlqHiccup{JetStream: obj.JS}
			js.fails.Store(1)
			obj.JS = js
			var runs atomic.Int32
			p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
				n := runs.Add(1)
				if tt.maxDeliver == 2 {
					if n == 1 {
						js.fails.Store(0)
					} else {
						js.fails.Store(1)
					}
					return fmt.Errorf("broken on attempt %d", n)
				}
				return handlers.Permanent(errors.New("broken for good"))
			}), servertest.Logger(t))
			if err := p.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				p.Stop(sctx)
			})
			if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(20 * time.Second)
			for {
				n, err := DeadLetterCount(ctx, obj)
				if err != nil {
					t.Fatal(err)
				}
				info, err := obj.Jobs.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if n == 1 && info.State.Msgs == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("DLQ holds %d, JOB %d; want 1 and 0", n, info.State.Msgs)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if n := runs.Load(); n != tt.wantRuns {
				t.Errorf("the job ran %d times; want %d", n, tt.wantRuns)
			}
			d, err := DeadLetterOf(ctx, obj, "J")
			if err != nil {
				t.Fatal(err)
			}
			if d.Error != tt.wantErr {
				t.Errorf("dead letter's error %q, want %q", d.Error, tt.wantErr)
			}
		})
	}
}

// dlqHook runs before each publish to DLQ's subjects.
type dlqHook struct {
	jetstream.JetStream
	before func()
}

func (j *dlqHook) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if strings.HasPrefix(m.Subject, SubjectDLQPrefix) && j.before != nil {
		j.before()
	}
	return j.JetStream.PublishMsg(ctx, m, opts...)
}

// The sweep dead-letters copy A of job X, whose deliveries ran out, while
// another copy B of X (the same ID enqueued again after the dedupe window,
// or a re-drive) is claimed by a pool between the sweep's look at the
// record and its record of the dead letter. FailUnclaimed wrote its failed
// record over B's live claim: B's holder lost its claim (its handler is
// cancelled, its done record refused, as "claim lost"), and B, unacked,
// ran again on its redelivery, though it had succeeded. A live claim must
// be left to its holder.
func TestSweepLeavesALiveClaimOfAnotherCopyAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := claimingObjects(t, Config{FetchWait: 200 * time.Millisecond})
	hook, mA, bMsg := twoCopiesOfX(t, obj)
	ledger := data.NewLedger(obj.Ledger, time.Minute, nil)
	var claimB data.Claim
	var claimErr error
	hook.before = func() { // pool P claims B just now
		hook.before = nil
		jobB := &data.Job{ID: "X", Subject: "job.x", Seq: bMsg.Sequence, Attempt: 1, EnqueuedAt: bMsg.Time}
		claimB, claimErr = ledger.Claim(ctx, jobB, "pool-P")
	}
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	if _, err := p.sweepOne(ctx, mA); err != nil {
		t.Fatalf("sweep A: %v", err)
	}
	if claimErr != nil {
		t.Fatalf("claim B: %v", claimErr)
	}
	if err := ledger.Done(ctx, &claimB, time.Millisecond); err != nil {
		t.Errorf("B's holder records B done: %v; the sweep wrote over B's live claim", err)
	}
}

// twoCopiesOfX stores job X (copy A, its first, which the test sweeps) and
// copy B of it under its own Nats-Msg-Id, as after the dedupe window, and
// hooks obj's dead-letter publishes.
func twoCopiesOfX(t *testing.T, obj *Objects) (*dlqHook, *jetstream.RawStreamMsg, *jetstream.RawStreamMsg) {
	t.Helper()
	ctx := context.Background()
	hook := &dlqHook{JetStream: obj.JS}
	obj.JS = hook
	a, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("a"), EnqueueOptions{ID: "X"})
	if err != nil {
		t.Fatal(err)
	}
	bAck, err := obj.JS.PublishMsg(ctx, jobCopy("job.x", []byte("b"), nil, "X", "X-again"))
	if err != nil {
		t.Fatal(err)
	}
	mA, err := obj.Jobs.GetMsg(ctx, a.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	mB, err := obj.Jobs.GetMsg(ctx, bAck.Sequence)
	if err != nil {
		t.Fatal(err)
	}
	return hook, mA, mB
}
