package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// outcomeMsg records the naks and acks of a stand-in delivered job.
type outcomeMsg struct {
	stubMsg
	naks, acks atomic.Int32
}

func (m *outcomeMsg) Nak() error                       { m.naks.Add(1); return nil }
func (m *outcomeMsg) NakWithDelay(time.Duration) error { m.naks.Add(1); return nil }
func (m *outcomeMsg) Ack() error                       { m.acks.Add(1); return nil }
func (m *outcomeMsg) DoubleAck(context.Context) error  { m.acks.Add(1); return nil }
func (m *outcomeMsg) Headers() nats.Header             { return nats.Header{} }

// A heartbeat's claim renewal that landed but whose answer was lost is the
// job's own: the failed attempt's record (retry, or failed once
// dead-lettered) is written over it, as the done record is, rather than
// the outcome left unrecorded as if another holder had taken the job over.
func TestFailedAttemptAfterARenewalWhoseAnswerWasLostIsRecorded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cause error
		want  data.State
	}{
		{"retry", errors.New("boom"), data.StateRetrying},
		{"dead-lettered", handlers.Permanent(errors.New("bad input")), data.StateFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := objectsWith(t, Config{AckWait: 3 * time.Second, MaxDeliver: 5, RetryBackoff: []time.Duration{100 * time.Millisecond}})
			var it *inflight
			var p *Pool
			p = NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
				p.renew(ctx, it) // the heartbeat renews the claim: stored, answer lost
				return tc.cause
			}), servertest.Logger(t))
			kv := &slowLedger{KeyValue: obj.Ledger}
			kv.doneRefused.Store(true) // only the renewal misbehaves
			p.ledger = data.NewLedger(kv, p.cfg.lease(), nil)
			job := &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 1}
			claim, err := p.ledger.Claim(ctx, job, "w")
			if err != nil {
				t.Fatal(err)
			}
			msg := &outcomeMsg{}
			it = &inflight{msg: msg, job: job, claim: claim}
			if p.runOne(ctx, it) {
				t.Fatal("runOne reported a success")
			}
			rec, err := p.ledger.Get(ctx, "J")
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != tc.want || msg.naks.Load()+msg.acks.Load() == 0 {
				t.Errorf("after the handler failed (%v): J's record is %s (last error %q), naks %d, acks %d; want %s, and the job released or acked: the stored record is J's own renewed claim, not another holder's",
					tc.cause, rec.State, rec.LastError, msg.naks.Load(), msg.acks.Load(), tc.want)
			}
		})
	}
}
