package queue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	for i := range n {
		if _, err := prod.EnqueueAsync("job.x", nil, EnqueueOptions{ID: fmt.Sprintf("acked-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	<-obj.JS.PublishAsyncComplete()

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
