package queue

import (
	"context"
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
