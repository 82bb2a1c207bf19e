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
