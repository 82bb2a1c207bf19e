package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// failingUpdates fails the ledger's record updates, a claim's renewal
// among them, while fail is set, as a slow or unreachable bucket would.
type failingUpdates struct {
	jetstream.KeyValue
	fail *atomic.Bool
}

func (k failingUpdates) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if k.fail.Load() {
		return 0, nats.ErrTimeout
	}
	return k.KeyValue.Update(ctx, key, value, rev)
}

// A job that runs on a claim of its own (it has a record: an earlier
// attempt failed) is cancelled before its claim runs out when the claim
// cannot be renewed, as a job on the pool's lease is: otherwise another
// pool claims a copy of it (here a re-drive) once the claim ended, and runs
// it beside the first run.
func TestClaimThatCannotBeRenewedStopsItsHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second, MaxDeliver: 20, RetryBackoff: []time.Duration{10 * time.Millisecond}, FetchWait: 200 * time.Millisecond})

	l := data.NewLedger(obj.Ledger, obj.Config.lease(), nil)
	c, err := l.Claim(ctx, &data.Job{ID: "J", Subject: "job.x", Seq: 1000, Attempt: 1}, "earlier")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Retry(ctx, &c, time.Millisecond, "boom"); err != nil {
		t.Fatal(err)
	}

	var aRunning, overlap atomic.Bool
	aStarted, aCause := make(chan struct{}), make(chan error, 1)
	var fail atomic.Bool
	a := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		aRunning.Store(true)
		defer aRunning.Store(false)
		close(aStarted)
		select {
		case <-ctx.Done():
			aCause <- context.Cause(ctx)
			return ctx.Err()
		case <-time.After(8 * time.Second):
			return nil
		}
	}), servertest.Logger(t))
	a.ledger = data.NewLedger(failingUpdates{KeyValue: obj.Ledger, fail: &fail}, obj.Config.lease(), obj.JS)
	startPool(t, a)
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-aStarted:
	case <-time.After(10 * time.Second):
		t.Fatal("pool A never ran J")
	}
	fail.Store(true) // A's renewals of J's claim fail from now on

	bRan := make(chan struct{}, 16)
	b := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		if aRunning.Load() {
			overlap.Store(true)
		}
		bRan <- struct{}{}
		return nil
	}), servertest.Logger(t))
	startPool(t, b)
	m := nats.NewMsg("job.x") // a copy of J, as dlq retry publishes one
	m.Header.Set(nats.MsgIdHdr, "copy-of-J")
	m.Header.Set(HeaderJobID, "J")
	if _, err := obj.JS.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bRan:
	case <-time.After(7 * time.Second):
	}
	if overlap.Load() {
		t.Fatal("pool B ran J while pool A's handler of J still ran: A's claim ran out unrenewed and A never cancelled its handler")
	}
	select {
	case err := <-aCause:
		if !errors.Is(err, data.ErrClaimLost) {
			t.Errorf("A's handler cancelled with %v, want ErrClaimLost", err)
		}
	default:
		t.Error("A's handler was not cancelled though its claim could not be renewed")
	}
}

// A lease given up between runOne's look at the job and its handler's
// start does not let the handler run: the heartbeat loop found no handler
// to cancel yet, so run sees the loss itself. The test holds the metrics
// lock that runOne takes in between, to widen a window of a few
// instructions.
func TestLeaseLostAsTheHandlerStartsStopsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := leasingPool(t, leasingObjects(t))
	m := NewMetrics(prometheus.NewRegistry())
	p.cfg.Metrics = m
	var ran atomic.Bool
	p.handler = handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		ran.Store(true)
		return nil
	})
	it, _ := recJob("K", 1)
	it.job.Subject = "job.fresh"
	p.beats.add(it)
	if leased, _, _ := p.admitBatch(ctx, checkOf(t, p, []*inflight{it})); len(leased) != 1 {
		t.Fatal("K not leased")
	}
	hctx, hcancel := context.WithCancelCause(ctx)
	defer hcancel(nil)
	it.hctx = handlerCtx{ctx: hctx, cancel: hcancel}

	m.mu.Lock() // runOne stops in jobStarted, past its look at it.lost
	done := make(chan bool)
	go func() { done <- p.runOne(ctx, it) }()
	time.Sleep(100 * time.Millisecond)
	p.beats.loseLeased(errors.Join(data.ErrClaimLost, errors.New("lease not renewed in time")))
	m.mu.Unlock()
	if succeeded := <-done; succeeded || ran.Load() {
		t.Errorf("K's lease was given up as its handler started, yet the handler ran (%v) and runOne reported success (%v)", ran.Load(), succeeded)
	}
}
