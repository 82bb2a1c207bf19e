package queue_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// Jobs a stopping pool took into its lease and hands back unstarted go to
// another pool at once, on their next delivery, while the stopping pool's
// stored lease still lists them (it is rewritten at its next renewal, or
// deleted once the pool's last running job is through). Each is handed
// back through its prepared claim, whose record, written after the lease,
// says that its run there is over. Without it, the other pool would find
// them held by a live lease and release them until that lease ended: a
// delivery spent each, and two thirds of an ack wait lost, at every
// rolling restart of pools with a backlog.
func TestStopHandsLeasedJobsToAnotherPoolAtOnce(t *testing.T) {
	t.Parallel()
	// The lease ends 20s after each write: a job released until then runs
	// past the wait below.
	cfg := queue.Config{Workers: 2, MaxDeliver: 5, AckWait: 30 * time.Second}
	a := setup(t, cfg)
	// The other pool's metrics: each job it runs is a first run, whose
	// wait since its enqueue is observed.
	reg := prometheus.NewRegistry()
	ocfg := cfg
	ocfg.Metrics = queue.NewMetrics(reg)
	other := setupOn(t, a.srv, ocfg)

	// Both workers busy: "long" runs through the stop, "first" ends
	// once it began, and its worker hands the others back.
	c := newCounter()
	started := make(chan string, 2)
	releaseFirst, releaseLong := make(chan struct{}), make(chan struct{})
	pa := queue.NewPool(a.obj, c.wrap(func(ctx context.Context, job *data.Job) error {
		started <- job.ID
		release := releaseFirst
		if job.ID == "long" {
			release = releaseLong
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}), servertest.Logger(t))
	if err := pa.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.enqueue(t, "job.s", "long", "x")
	a.enqueue(t, "job.s", "first", "x")
	<-started
	<-started
	var waiting []string
	for i := range 5 {
		id := "waiting-" + strconv.Itoa(i)
		waiting = append(waiting, id)
		a.enqueue(t, "job.s", id, "x")
	}
	// The pool's stored lease lists them: taken in, their worker busy.
	ledger := data.NewLedger(a.obj.Ledger, time.Minute, nil)
	waitFor(t, 10*time.Second, func() error {
		leases, err := ledger.ReadLeases(context.Background())
		if err != nil {
			return err
		}
		n := 0
		for _, ls := range leases {
			for _, j := range ls.Jobs {
				if slices.Contains(waiting, j.Key) {
					n++
				}
			}
		}
		if n != len(waiting) {
			return fmt.Errorf("the stored lease lists %d of the %d waiting jobs", n, len(waiting))
		}
		return nil
	})

	var mu sync.Mutex
	attempts := map[string][]int{}
	resumed := map[string]bool{}
	other.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		mu.Lock()
		defer mu.Unlock()
		attempts[job.ID] = append(attempts[job.ID], job.Attempt)
		resumed[job.ID] = resumed[job.ID] || job.Resumed
		return nil
	}))

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- pa.Stop(ctx)
	}()
	time.Sleep(500 * time.Millisecond) // shutdown has begun: fetching stopped
	close(releaseFirst)
	waitFor(t, 15*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(attempts) != len(waiting) {
			return fmt.Errorf("while a job ran on in the stopping pool, the other pool ran %d of the %d jobs it handed back (%v)", len(attempts), len(waiting), attempts)
		}
		return nil
	})
	close(releaseLong)
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range waiting {
		if got := attempts[id]; !slices.Equal(got, []int{2}) {
			t.Errorf("job %s ran in the other pool on deliveries %v; want [2]: handed back once, run on the next", id, got)
		}
		if resumed[id] {
			t.Errorf("job %s ran in the other pool as a resumed attempt; want a first one: it never ran before", id)
		}
	}
	for _, id := range []string{"long", "first"} {
		if got := c.get(id); got != 1 {
			t.Errorf("%s ran %d times in the stopping pool; want 1", id, got)
		}
	}
	if got := histogramCount(t, reg, "jobq_enqueue_to_start_seconds", "job.s"); got != uint64(len(waiting)) {
		t.Errorf("the other pool observed %d waits from enqueue to first start, want %d: the jobs handed back unrun start their first run there", got, len(waiting))
	}
}
