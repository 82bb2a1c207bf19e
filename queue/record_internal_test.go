package queue

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// slowLedger stores every update, but: the first done record is refused
// (as a bucket at a limit does), and the first claim renewal lands while
// its answer is lost (as when the answer comes after the caller's
// timeout, a bucket leader moving).
type slowLedger struct {
	jetstream.KeyValue
	doneRefused, renewLost atomic.Bool
}

func (k *slowLedger) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	switch {
	case bytes.Contains(value, []byte(`"state":"done"`)) && k.doneRefused.CompareAndSwap(false, true):
		return 0, errors.New("nats: API error: code=503 err_code=10077 description=maximum messages exceeded")
	case bytes.Contains(value, []byte(`"state":"running"`)) && k.renewLost.CompareAndSwap(false, true):
		if _, err := k.KeyValue.Update(ctx, key, value, rev); err != nil {
			return 0, err
		}
		return 0, nats.ErrTimeout // stored, but the answer did not come in time
	}
	return k.KeyValue.Update(ctx, key, value, rev)
}

// A held job's own claim renewal (recordAgain renews the claim while the
// record is retried) that landed but whose answer was lost is taken for
// what it is: the done record is written over it, rather than the job
// given up as taken over (data.ErrClaimLost) though no one else holds it.
func TestHeldJobsOwnLandedRenewalIsNotALostClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second})
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	kv := &slowLedger{KeyValue: obj.Ledger}
	p.ledger = data.NewLedger(kv, p.cfg.lease(), nil) // synchronous writes
	job := &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 1}
	claim, err := p.ledger.Claim(ctx, job, "w")
	if err != nil {
		t.Fatal(err)
	}
	it := &inflight{msg: stubMsg{}, job: job, claim: claim, ran: true}
	if it.write, err = p.ledger.DoneAsync(&it.claim, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	err = it.write.Wait(ctx)
	if err == nil || errors.Is(err, data.ErrClaimLost) {
		t.Fatalf("first done write: %v, want refused", err)
	}

	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := p.recordAgain(rctx, it, err); err != nil {
		rec, _ := p.ledger.Get(ctx, "J")
		t.Errorf("recordAgain: %v; want the done record stored (the stored record is this job's own renewed claim: state %s, worker %s)", err, rec.State, rec.Worker)
	}
}

// refusingLedger refuses every done record (a bucket at a limit) and stores
// the first claim renewal while losing its answer (a bucket leader moving).
type refusingLedger struct {
	jetstream.KeyValue
	renewLost atomic.Bool
}

func (k *refusingLedger) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	switch {
	case bytes.Contains(value, []byte(`"state":"done"`)):
		return 0, errors.New("nats: API error: code=503 err_code=10077 description=maximum messages exceeded")
	case bytes.Contains(value, []byte(`"state":"running"`)) && k.renewLost.CompareAndSwap(false, true):
		if _, err := k.KeyValue.Update(ctx, key, value, rev); err != nil {
			return 0, err
		}
		return 0, nats.ErrTimeout
	}
	return k.KeyValue.Update(ctx, key, value, rev)
}

// nakMsg records the delay of its NakWithDelay.
type nakMsg struct {
	stubMsg
	delay atomic.Int64
}

func (m *nakMsg) NakWithDelay(d time.Duration) error { m.delay.Store(int64(d)); return nil }

// A held job given up unrecorded (jobq next's 10s, shutdown) is released
// once its claim has ended, also when its last renewal landed though its
// answer was lost, which leaves the worker's copy of the claim with the
// older end: the redelivery does not find the stored claim live, so it is
// not handed back and spends no delivery.
func TestUnrecordedWaitsOutALandedRenewalWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 6 * time.Second, RetryBackoff: []time.Duration{100 * time.Millisecond}})
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	p.ledger = data.NewLedger(&refusingLedger{KeyValue: obj.Ledger}, p.cfg.lease(), nil)
	job := &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 1}
	claim, err := p.ledger.Claim(ctx, job, "w")
	if err != nil {
		t.Fatal(err)
	}
	msg := &nakMsg{}
	it := &inflight{msg: msg, job: job, claim: claim, ran: true}
	time.Sleep(3 * time.Second) // the handler runs (lease 4s, heartbeat every 2s)
	if it.write, err = p.ledger.DoneAsync(&it.claim, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	err = it.write.WaitOnce(ctx)
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond) // given up soon (jobq next, shutdown)
	defer cancel()
	if err = p.recordAgain(rctx, it, err); err == nil || errors.Is(err, data.ErrClaimLost) {
		t.Fatalf("recordAgain: %v, want the done record refused", err)
	}
	p.unrecorded(it, err)
	delay := time.Duration(msg.delay.Load())
	stored, _ := p.ledger.Get(ctx, "J")
	time.Sleep(delay) // the redelivery
	_, err = p.ledger.Claim(ctx, &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 2}, "w2")
	if errors.Is(err, data.ErrClaimed) {
		t.Errorf("redelivered after %s, the job found its stored claim live until %s (worker's copy said %s): handed back, spending a delivery",
			delay, stored.LeaseUntil.Format(time.StampMilli), claim.Record.LeaseUntil.Format(time.StampMilli))
	}
}

// A heartbeat's claim renewal that landed but whose answer was lost leaves
// the worker's claim a revision behind, so the done record written after
// the handler succeeded fails its compare-and-set. The acker tells the
// job's own renewal from another holder's claim and writes the record over
// it, rather than leave the job unrecorded to run again after the ack wait.
func TestDoneAfterAHeartbeatRenewalWhoseAnswerWasLostIsStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second})
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	kv := &slowLedger{KeyValue: obj.Ledger}
	kv.doneRefused.Store(true) // done records are stored as they come
	p.ledger = data.NewLedger(kv, p.cfg.lease(), obj.JS)
	defer p.ledger.Close()
	job := &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 1}
	claim, err := p.ledger.Claim(ctx, job, "w")
	if err != nil {
		t.Fatal(err)
	}
	it := &inflight{msg: stubMsg{}, job: job, claim: claim, ran: true}
	p.renew(ctx, it) // the heartbeat loop renews the claim while the handler runs: stored, answer lost
	it.mu.Lock()
	it.recording = true // the handler succeeded (runOne)
	it.mu.Unlock()
	if it.write, err = p.ledger.DoneAsync(&it.claim, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	p.dones <- it
	close(p.dones)
	p.ackAll(ctx)
	if rec, _ := p.ledger.Get(ctx, "J"); rec.State != data.StateDone {
		t.Errorf("J's record is %s (worker %s), want done: its done record was given up as another holder's claim, but the stored record is J's own renewed claim", rec.State, rec.Worker)
	}
}
