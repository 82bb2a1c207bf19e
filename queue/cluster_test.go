package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// onCluster provisions jobq through every node of a cluster, as jobq serve
// --server on each would, and returns each node's objects.
func onCluster(t *testing.T, nodes []*natsserver.Server, cfg queue.Config) []*queue.Objects {
	t.Helper()
	var objs []*queue.Objects
	for _, n := range nodes {
		js, err := jetstream.New(servertest.ConnectNode(t, n))
		if err != nil {
			t.Fatal(err)
		}
		// A request through a node that its routes do not carry yet
		// goes unanswered: in a cluster just started, the interest of
		// the others can still be on its way.
		var obj *queue.Objects
		for try := 1; ; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			obj, err = queue.Provision(ctx, js, cfg, servertest.Logger(t))
			cancel()
			if err == nil {
				break
			}
			if try == 3 || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("provision through %s: %v", n.Name(), err)
			}
			t.Logf("provision through %s: %v; trying again", n.Name(), err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// TestPoolsOnAClusterRunEveryJobOnce runs jobq against a real three-node
// NATS cluster, as jobq serve --server does: objects provisioned through
// every node, jobs enqueued through one, a pool on each of the two others.
func TestPoolsOnAClusterRunEveryJobOnce(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 3} {
		t.Run(fmt.Sprintf("replicas_%d", replicas), func(t *testing.T) {
			t.Parallel()
			objs := onCluster(t, servertest.StartCluster(t, 3), queue.Config{Workers: 4, Replicas: replicas})
			b := &testBundle{js: objs[0].JS, obj: objs[0], prod: queue.NewProducer(objs[0].JS, objs[0].Config), cfg: objs[0].Config}
			c := newCounter()
			for _, obj := range objs[1:] {
				(&testBundle{obj: obj}).startPool(t, c.wrap(ok))
			}
			const n = 300
			for i := range n {
				b.enqueue(t, "job.cluster", fmt.Sprintf("job-%d", i), "x")
			}
			b.waitDrained(t)
			for i := range n {
				if id := fmt.Sprintf("job-%d", i); c.get(id) != 1 {
					t.Errorf("job %s ran %d times, want 1", id, c.get(id))
				}
			}
			if c.overlap != 0 {
				t.Errorf("%d runs overlapped", c.overlap)
			}
			for _, s := range []jetstream.Stream{objs[0].Jobs, objs[0].Dead} {
				if got := s.CachedInfo().Config.Replicas; got != replicas {
					t.Errorf("stream %s has %d replicas, want %d", s.CachedInfo().Config.Name, got, replicas)
				}
			}
			st, err := objs[0].Ledger.Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			// A follower could answer a direct get with a record it has
			// not got yet.
			cfg := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
			if cfg.Replicas != replicas || cfg.AllowDirect != (replicas == 1) {
				t.Errorf("bucket has %d replicas, direct gets %v; want %d, %v", cfg.Replicas, cfg.AllowDirect, replicas, replicas == 1)
			}
		})
	}
}

// TestReplicatedJobqSurvivesANodesLoss shuts down the node that leads JOB
// while two pools on the other nodes run its jobs: every job still ends
// done, none runs beside itself, and one that runs again is told it is
// resumed.
func TestReplicatedJobqSurvivesANodesLoss(t *testing.T) {
	t.Parallel()
	nodes := servertest.StartCluster(t, 3)
	objs := onCluster(t, nodes, queue.Config{Workers: 4, Replicas: 3, AckWait: 3 * time.Second})
	info, err := objs[0].Jobs.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	lead := -1
	for i, n := range nodes {
		if n.Name() == info.Cluster.Leader {
			lead = i
		}
	}
	if lead < 0 {
		t.Fatalf("no node leads JOB (leader %q)", info.Cluster.Leader)
	}
	// The producer and the pools are on the others, so that only the
	// cluster's failover is tested, not the clients' reconnects.
	var others []*queue.Objects
	for i, obj := range objs {
		if i != lead {
			others = append(others, obj)
		}
	}
	b := &testBundle{js: others[0].JS, obj: others[0], prod: queue.NewProducer(others[0].JS, others[0].Config), cfg: others[0].Config}
	const n = 400
	for i := range n {
		b.enqueue(t, "job.cluster", fmt.Sprintf("job-%d", i), "x")
	}
	var mu sync.Mutex
	resumed := map[string]bool{}
	c := newCounter()
	h := c.wrap(func(_ context.Context, job *data.Job) error {
		mu.Lock()
		resumed[job.ID] = resumed[job.ID] || job.Resumed
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		return nil
	})
	for _, obj := range others {
		(&testBundle{obj: obj}).startPool(t, h)
	}
	waitFor(t, 20*time.Second, func() error {
		if done := c.total(); done < n/4 {
			return fmt.Errorf("%d jobs ran", done)
		}
		return nil
	})
	nodes[lead].Shutdown()
	nodes[lead].WaitForShutdown()
	waitFor(t, 60*time.Second, func() error {
		st, err := queue.ReadStatus(context.Background(), b.obj)
		if err != nil {
			return err
		}
		if st.Stream.Messages != 0 || st.Consumer.AckPending != 0 {
			return fmt.Errorf("JOB holds %d jobs, %d ack pending; want 0 and 0", st.Stream.Messages, st.Consumer.AckPending)
		}
		return nil
	})
	for i := range n {
		id := fmt.Sprintf("job-%d", i)
		switch runs := c.get(id); {
		case runs == 0:
			t.Errorf("job %s never ran", id)
		case runs > 1 && !resumed[id]:
			t.Errorf("job %s ran %d times, never as resumed", id, runs)
		}
		if rec := b.record(t, id); rec.State != data.StateDone {
			t.Errorf("job %s is %s, want done", id, rec.State)
		}
	}
	if c.overlap != 0 {
		t.Errorf("%d runs overlapped", c.overlap)
	}
	t.Logf("ran %d times for %d jobs", c.total(), n)
}

// total is how many runs c counted.
func (c *counter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.runs {
		n += r
	}
	return n
}

// TestProvisionKeepsTheReplicasItFinds: jobq does not change an object's
// replicas, nor, on a replicated bucket, turn direct gets back on, which
// would let a follower answer the ledger's reads.
func TestProvisionKeepsTheReplicasItFinds(t *testing.T) {
	t.Parallel()
	nodes := servertest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := onCluster(t, nodes[:1], queue.Config{Replicas: 3})[0].JS
	log := servertest.Logger(t)
	_, err := queue.Provision(ctx, js, queue.Config{}, log)
	if !errors.Is(err, queue.ErrConflict) || !strings.Contains(err.Error(), "stream JOB has 3 replicas, --replicas is 1; pass --replicas 3") {
		t.Errorf("provision with 1 replica over 3: got %v, want a conflict naming JOB's replicas", err)
	}

	// A new TTL is the one edit; the bucket stays as it was otherwise.
	if _, err := queue.Provision(ctx, js, queue.Config{Replicas: 3, ProcessedTTL: 48 * time.Hour}, log); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "KV_"+queue.BucketProcessed)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if cfg.MaxAge != 48*time.Hour || cfg.Replicas != 3 || cfg.AllowDirect {
		t.Errorf("bucket after a TTL edit: ttl %s, %d replicas, direct gets %v; want 48h, 3, false", cfg.MaxAge, cfg.Replicas, cfg.AllowDirect)
	}

	cfg.AllowDirect = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	_, err = queue.Provision(ctx, js, queue.Config{Replicas: 3, ProcessedTTL: 48 * time.Hour}, log)
	if !errors.Is(err, queue.ErrConflict) || !strings.Contains(err.Error(), "--no-allow-direct") {
		t.Errorf("provision over a replicated bucket with direct gets: got %v, want a conflict saying how to turn them off", err)
	}
}

// A replicated WORKER sends a pull's jobs once their delivery is agreed on,
// and the word that ends the pull at once, so that word can come ahead of
// the pull's last jobs. A pool takes them still: every job of a backlog
// runs once, on its first delivery, and none is dead-lettered. Ended on
// the word, the pull handed them back, a delivery spent each time, and
// after three they were dead-lettered unrun.
func TestReplicatedPullsKeepTheirLastJobs(t *testing.T) {
	t.Parallel()
	objs := onCluster(t, servertest.StartCluster(t, 3), queue.Config{Workers: 4, Prefetch: 4, Replicas: 3, AckWait: 3 * time.Second})
	b := &testBundle{js: objs[0].JS, obj: objs[0], prod: queue.NewProducer(objs[0].JS, objs[0].Config), cfg: objs[0].Config}
	const n = 200
	for i := range n {
		b.enqueue(t, "job.backlog", fmt.Sprintf("job-%d", i), "x")
	}
	var mu sync.Mutex
	late := map[string]int{}
	c := newCounter()
	(&testBundle{obj: objs[1]}).startPool(t, c.wrap(func(_ context.Context, job *data.Job) error {
		if job.Attempt > 1 {
			mu.Lock()
			late[job.ID] = job.Attempt
			mu.Unlock()
		}
		return nil
	}))
	b.waitDrained(t)
	for i := range n {
		if id := fmt.Sprintf("job-%d", i); c.get(id) != 1 {
			t.Errorf("job %s ran %d times, want 1", id, c.get(id))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(late) > 0 {
		t.Errorf("%d jobs ran on a later delivery, with no failure (e.g. %v): their first deliveries were handed back", len(late), late)
	}
	if st := b.status(t); st.DLQ.Messages != 0 {
		t.Errorf("DLQ holds %d dead letters, want none: no job failed", st.DLQ.Messages)
	}
}

// jobq next on a cluster provisioned with --replicas 3: DLQ was deleted
// after next opened the objects, and the job it takes fails for good. DLQ
// is made again with JOB's replicas. Before, it got 1 (the client commands
// open the objects without --replicas), and the next jobq serve
// --replicas 3 refused to start over it.
func TestNextMakesDLQAnewWithTheClustersReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nodes := servertest.StartCluster(t, 3)
	cfg := queue.Config{Replicas: 3, MaxDeliver: 1, AckWait: 3 * time.Second}
	objs := onCluster(t, nodes, cfg)
	js := objs[0].JS
	if _, err := queue.NewProducer(js, objs[0].Config).Enqueue(ctx, "job.d", []byte("x"), queue.EnqueueOptions{ID: "N"}); err != nil {
		t.Fatal(err)
	}
	njs, err := jetstream.New(servertest.ConnectNode(t, nodes[1]))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := queue.Open(ctx, njs) // as jobq next opens them
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, queue.StreamDLQ); err != nil {
		t.Fatal(err)
	}
	ran, err := queue.Next(ctx, obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		return handlers.Permanent(errors.New("cannot print it"))
	}), 10*time.Second, servertest.Logger(t))
	if !ran || err != nil {
		t.Fatalf("next: ran %v, %v", ran, err)
	}
	s, err := js.Stream(ctx, queue.StreamDLQ)
	if err != nil {
		t.Fatalf("DLQ not made again: %v", err)
	}
	if r := s.CachedInfo().Config.Replicas; r != 3 {
		t.Errorf("DLQ made anew with %d replica(s), want 3, as the cluster's objects were provisioned", r)
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := queue.Provision(pctx, js, cfg, servertest.Logger(t)); err != nil {
		t.Errorf("jobq serve --replicas 3 over the DLQ made anew: %v", err)
	}
}
