package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// hangingInfo makes WORKER's info requests hang until the caller gives up
// (or release is closed) while hang is set, as when the server does not
// answer (a JetStream API timeout, a meta leader election).
type hangingInfo struct {
	jetstream.Consumer
	hang    *atomic.Bool
	calls   *atomic.Int32
	release chan struct{}
}

func (c hangingInfo) Info(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	if c.hang.Load() {
		c.calls.Add(1)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.release:
		}
	}
	return c.Consumer.Info(ctx)
}

// Stop returns within its ctx, plus the bounded wait for outcomes it
// documents (opTimeout + 5s), even while a sweep's request to the server
// goes unanswered: the sweep is cut off with the handlers, rather than
// hold Stop for its minute, past --shutdown-timeout.
func TestStopReturnsWithinItsTimeoutWhileASweepHangs(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{AckWait: 2 * time.Second, FetchWait: 200 * time.Millisecond})
	var hang atomic.Bool
	var calls atomic.Int32
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	hang.Store(true)
	obj.Worker = hangingInfo{Consumer: obj.Worker, hang: &hang, calls: &calls, release: release}

	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The sweep at start is in its WORKER info request.
	deadline := time.Now().Add(5 * time.Second)
	for calls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sweep never asked for WORKER's info")
		}
		time.Sleep(10 * time.Millisecond)
	}

	const shutdownTimeout = time.Second
	bound := shutdownTimeout + opTimeout + 5*time.Second
	stopped := make(chan error, 1)
	begin := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		stopped <- p.Stop(ctx)
	}()
	select {
	case <-stopped:
		t.Logf("Stop returned after %s", time.Since(begin).Round(time.Millisecond))
	case <-time.After(bound):
		t.Fatalf("Stop with a %s timeout and no job running has not returned after %s", shutdownTimeout, bound)
	}
}

// Stop ends the heartbeat loop before it deletes the pool's lease, and
// returns within its ctx while the loop's last renewal of that lease goes
// unanswered: the renewal is cut off. Before, Stop waited for the renewal,
// which held the lease, for up to opTimeout past its ctx; and a renewal
// that came after the delete wrote the empty lease again, to stay until
// another pool collected it.
func TestStopEndsTheHeartbeatLoopBeforeItDeletesTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second, FetchWait: 200 * time.Millisecond})
	var hang atomic.Bool
	t.Cleanup(func() { hang.Store(false) })
	entered := make(chan struct{}, 1)
	done := make(chan struct{}, 1)
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		done <- struct{}{}
		return nil
	}), servertest.Logger(t))
	p.ledger = data.NewLedger(obj.Ledger, obj.Config.lease(), hangingLeaseWrites{JetStream: obj.JS, hang: &hang, entered: entered})
	if !p.leasing {
		t.Fatal("the pool does not lease: this test needs a bucket with direct gets")
	}
	runJ(t, p, obj, done)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := obj.Ledger.Get(ctx, data.Key("J")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("J's record was never stored")
		}
	}
	// J left the lease: the loop's next renewal writes it once more, and
	// that write does not answer.
	hang.Store(true)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the heartbeat loop never renewed the lease J left")
	}

	const shutdownTimeout = time.Second
	stopped := make(chan error, 1)
	begin := time.Now()
	go func() {
		sctx, cancel := context.WithTimeout(ctx, shutdownTimeout)
		defer cancel()
		stopped <- p.Stop(sctx)
	}()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Stop returned after %s", time.Since(begin).Round(time.Millisecond))
	case <-time.After(shutdownTimeout + 5*time.Second):
		t.Fatalf("Stop with a %s timeout and no job running has not returned after %s: it waits for a lease renewal that does not answer", shutdownTimeout, shutdownTimeout+5*time.Second)
	}
	select {
	case <-p.beatsDone:
	default:
		t.Fatal("the heartbeat loop outlived Stop")
	}
	hang.Store(false)
	// No write of the loop comes after Stop's delete.
	time.Sleep(2 * obj.Config.heartbeat())
	if entry, err := obj.Ledger.Get(ctx, data.LeasePrefix+p.lease.owner); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the pool's lease is still in the bucket after Stop (%v, %v)", entry, err)
	}
}

// A second Stop, called while a first one waits for the running jobs, is
// bounded by its own ctx plus the documented wait (opTimeout + 5s), as a
// first Stop is: a caller's shorter timeout cuts the jobs off. Before, it
// waited for the first Stop's ctx, a minute here.
func TestSecondStopHonoursItsOwnCtx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second, FetchWait: 200 * time.Millisecond})
	started := make(chan struct{}, 1)
	p := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, _ *data.Job) error {
		started <- struct{}{}
		select { // it stops when told; otherwise it runs 25s
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(25 * time.Second):
			return nil
		}
	}), servertest.Logger(t))
	runJ(t, p, obj, started)
	first := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		first <- p.Stop(sctx)
	}()
	time.Sleep(200 * time.Millisecond)
	const shutdownTimeout = 300 * time.Millisecond
	bound := shutdownTimeout + opTimeout + 5*time.Second
	second := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, shutdownTimeout)
		defer cancel()
		second <- p.Stop(sctx)
	}()
	select {
	case err := <-second:
		if err != nil {
			t.Errorf("second Stop: %v", err)
		}
	case <-time.After(bound):
		t.Fatalf("a second Stop with a %s timeout has not returned after %s: it waits for the first Stop's ctx", shutdownTimeout, bound)
	}
	select {
	case err := <-first:
		if err != nil {
			t.Errorf("first Stop: %v", err)
		}
	case <-time.After(bound):
		t.Fatal("the first Stop did not return once the second cut the jobs off")
	}
	if got := p.Stop(ctx); got != nil {
		t.Errorf("a Stop after the pool stopped: %v", got)
	}
}

// Stop's bound holds with the lease's delete: once its ctx ended, it waits
// at most opTimeout + 5s more in all. A handler that takes 9s to honour
// the cancellation is within that; the delete of the pool's lease after
// it, which the ledger does not answer (a bucket leader moving), gets
// what is left. Before, it got opTimeout of its own, and Stop returned
// that much past the bound.
func TestStopBoundIncludesTheLeaseDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second, FetchWait: 200 * time.Millisecond})
	var hang atomic.Bool
	t.Cleanup(func() { hang.Store(false) })
	started := make(chan struct{}, 1)
	p := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, _ *data.Job) error {
		started <- struct{}{}
		<-ctx.Done()
		time.Sleep(9 * time.Second) // slow to stop, within opTimeout + 5s
		return ctx.Err()
	}), servertest.Logger(t))
	p.ledger = data.NewLedger(hangingDeletes{KeyValue: obj.Ledger, hang: &hang}, obj.Config.lease(), obj.JS)
	if !p.leasing {
		t.Fatal("the pool does not lease: this test needs a bucket with direct gets")
	}
	runJ(t, p, obj, started)
	hang.Store(true) // the ledger answers no delete
	const shutdownTimeout = time.Second
	bound := shutdownTimeout + opTimeout + 5*time.Second
	sctx, cancel := context.WithTimeout(ctx, shutdownTimeout)
	defer cancel()
	begin := time.Now()
	err := p.Stop(sctx)
	took := time.Since(begin)
	t.Logf("Stop returned %v after %s", err, took.Round(100*time.Millisecond))
	if took > bound+500*time.Millisecond {
		t.Errorf("Stop with a %s timeout returned after %s, past its bound of %s (ctx + opTimeout + 5s)", shutdownTimeout, took.Round(100*time.Millisecond), bound)
	}
}

// Stop and Start called at once race on nothing (run under -race), and
// the pool does not run on: a Stop that comes first makes Start fail, one
// that comes after stops the pool Start started. So does a Stop while
// Start waits for the server, without waiting for it.
func TestStopRacingStart(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second, FetchWait: 200 * time.Millisecond})
	for range 5 {
		p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
		started := make(chan error, 1)
		go func() { started <- p.Start(context.Background()) }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := p.Stop(ctx); err != nil {
			t.Error(err)
		}
		if err := <-started; err != nil && !errors.Is(err, errPoolStopped) {
			t.Fatal(err)
		}
		cancel()
		if p.Running() {
			t.Error("the pool runs on after Stop")
		}
	}

	// Start waits for the server (the bucket's info) while Stop is called.
	release := make(chan struct{})
	slow := *obj
	slow.JS = hangingStreamLookups{JetStream: obj.JS, release: release}
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	p.obj, p.leasingErr = &slow, errors.New("not yet known") // Start asks the server again
	started := make(chan error, 1)
	go func() { started <- p.Start(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	begin := time.Now()
	if err := p.Stop(ctx); err != nil {
		t.Error(err)
	}
	if took := time.Since(begin); took > 5*time.Second {
		t.Errorf("Stop waited %s for a Start that waits for the server", took)
	}
	close(release)
	if err := <-started; !errors.Is(err, errPoolStopped) {
		t.Errorf("Start after Stop was called: got %v, want %v", err, errPoolStopped)
	}
	if p.Running() {
		t.Error("the pool runs on after Stop")
	}
}

// hangingStreamLookups makes stream look-ups wait until release is closed
// (or the caller gives up), as when the server does not answer.
type hangingStreamLookups struct {
	jetstream.JetStream
	release chan struct{}
}

func (j hangingStreamLookups) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-j.release:
	}
	return j.JetStream.Stream(ctx, name)
}

// Start after Stop fails at once, and a Stop after it returns: a pool runs
// once. Before, Start got past its "already started" check once the pool
// had stopped, and hung refilling the pool's room, and so did every later
// Stop.
func TestStartAfterStopFails(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second, FetchWait: 200 * time.Millisecond})
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- p.Start(context.Background()) }()
	select {
	case err := <-started:
		if !errors.Is(err, errPoolStopped) {
			t.Errorf("Start after Stop: got %v, want %v", err, errPoolStopped)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start after Stop has not returned after 5s")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- p.Stop(ctx) }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("Stop again: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a Stop after Start after Stop has not returned after 5s")
	}
}

// runJ starts p, enqueues job J, and waits until p's handler says on ran
// that J runs. The caller stops p.
func runJ(t *testing.T, p *Pool, obj *Objects, ran <-chan struct{}) {
	t.Helper()
	ctx := context.Background()
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("J never ran")
	}
}
