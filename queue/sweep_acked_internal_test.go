package queue

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// A job acked a moment before a sweep looks is still stored for a while:
// on a cluster, WORKER's leader moves its ack floor past the job as it
// takes the ack, and JOB removes the job once its removal was agreed on.
// Run by a pool without the ledger, or by a client outside jobq, no record
// tells it done. The sweep, looking once, dead-lettered such jobs as
// exhausted; it now looks twice, and moves only those stored both times.
func TestSweepLeavesJobsAckedAMomentAgo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nodes := servertest.StartCluster(t, 3)
	js, err := jetstream.New(servertest.ConnectNode(t, nodes[0]))
	if err != nil {
		t.Fatal(err)
	}
	var obj *Objects
	for try := 1; obj == nil; try++ { // the cluster may still elect its leaders
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		obj, err = Provision(pctx, js, Config{NoLedger: true, MaxDeliver: 5, Replicas: 3}, servertest.Logger(t))
		cancel()
		if err != nil && try == 3 {
			t.Fatal(err)
		}
	}
	const n = 2000
	prod := NewProducer(obj.JS, obj.Config)
	defer prod.Close()
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		f, err := prod.EnqueueAsync("job.x", nil, EnqueueOptions{ID: fmt.Sprintf("acked-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		}
	}

	// A worker outside jobq runs them, acking each as it goes, while the
	// pool sweeps, again and again.
	ran := make(chan error, 1)
	go func() {
		for handled := 0; handled < n; {
			batch, err := obj.Worker.Fetch(10, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				ran <- err
				return
			}
			for m := range batch.Messages() {
				if err := m.Ack(); err != nil {
					ran <- err
					return
				}
				handled++
			}
		}
		ran <- nil
	}()
	p := NewPool(obj, nil, servertest.Logger(t))
	p.sweepSettle = 200 * time.Millisecond
	for sweeps := 1; ; sweeps++ {
		if _, err := p.sweep(ctx); err != nil {
			t.Fatalf("sweep %d: %v", sweeps, err)
		}
		select {
		case err := <-ran:
			if err != nil {
				t.Fatalf("outside worker: %v", err)
			}
			info, err := obj.Dead.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs != 0 {
				t.Errorf("%d of %d jobs, acked by their worker, dead-lettered as exhausted in %d sweeps", info.State.Msgs, n, sweeps)
			}
			return
		default:
		}
	}
}

// A pool stopping while its sweep waits between its two looks does not wait
// for the second: Stop returns at once, the job left for the next sweep.
func TestStopDoesNotWaitForTheSweepsSecondLook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{MaxDeliver: 1})
	var logs servertest.LogBuffer
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), zerolog.New(&logs))
	p.sweepSettle = time.Hour
	exhaust(t, obj, 1)
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "looking again"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the sweep never found the job: %s", logs.String())
		}
	}
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := p.Stop(stopCtx); err != nil {
		t.Errorf("stop: %v", err)
	}
	select {
	case <-p.cut:
		t.Error("stop waited for the sweep's second look until its time ran out, and cut the pool off")
	default:
	}
	if info, err := obj.Dead.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Errorf("DLQ: %v, %v; want the job left in JOB for the next sweep", info, err)
	}
}

// A sweep goes on past the jobs it holds between its two looks, so that a
// chunk of jobs left in JOB (DLQ full, say) does not keep it from the rest.
func TestSweepMovesEveryChunk(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{MaxDeliver: 1})
	p := NewPool(obj, nil, servertest.Logger(t))
	p.sweepSettle, p.sweepChunk = 10*time.Millisecond, 2
	exhaust(t, obj, 5)
	if n, err := p.sweep(context.Background()); n != 5 || err != nil {
		t.Errorf("sweep: moved %d, %v; want all 5, in chunks of 2", n, err)
	}
	if info, err := obj.Dead.Info(context.Background()); err != nil || info.State.Msgs != 5 {
		t.Errorf("DLQ: %v, %v; want 5 dead letters", info, err)
	}
}

// exhaust stores n jobs and lets their one delivery (MaxDeliver 1) lapse
// with a worker outside jobq, WORKER's ack wait cut short, until the
// server gave up on them all.
func exhaust(t *testing.T, obj *Objects, n int) {
	t.Helper()
	ctx := context.Background()
	prod := NewProducer(obj.JS, obj.Config)
	for i := range n {
		if _, err := prod.Enqueue(ctx, "job.x", nil, EnqueueOptions{ID: fmt.Sprintf("exhausted-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := obj.Worker.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for range batch.Messages() {
		got++
	}
	if got != n {
		t.Fatalf("fetched %d of %d jobs", got, n)
	}
	ci, err := obj.Worker.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ci.Config
	cfg.AckWait = 100 * time.Millisecond
	if _, err := obj.JS.UpdateConsumer(ctx, StreamJob, cfg); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if ci, err := obj.Worker.Info(ctx); err == nil && ci.NumAckPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the jobs stay pending")
		}
	}
}
