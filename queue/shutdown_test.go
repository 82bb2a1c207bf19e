package queue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// A job the pool had fetched but not started when Stop was called is handed
// back, not started while the running job finishes (the README: fetching
// stops, running jobs get --shutdown-timeout to finish, jobs fetched and
// not started are handed back as they were), unless it is on its last
// delivery: handed back, it would be dead-lettered without having run, so
// it runs while Stop waits.
func TestStopHandsBackFetchedJobsUnstarted(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		maxDeliver int
		noLedger   bool
		wantRun    bool
	}{
		{"spare deliveries", 3, false, false},
		{"spare deliveries, no ledger", 3, true, false},
		{"last delivery", 1, false, true},
		{"last delivery, no ledger", 1, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{Workers: 1, MaxDeliver: tt.maxDeliver, NoLedger: tt.noLedger})
			release := make(chan struct{})
			started := make(chan string, 4)
			c := newCounter()
			p := queue.NewPool(b.obj, c.wrap(func(ctx context.Context, job *data.Job) error {
				started <- job.ID
				if job.ID == "first" {
					<-release
				}
				return nil
			}), servertest.Logger(t))
			if err := p.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			b.enqueue(t, "job.s", "first", "x")
			if id := <-started; id != "first" {
				t.Fatalf("started %s, want first", id)
			}
			b.enqueue(t, "job.s", "waiting", "x")
			b.waitAckPending(t, 2) // fetched, its worker busy with "first"

			stopped := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				stopped <- p.Stop(ctx)
			}()
			time.Sleep(500 * time.Millisecond) // shutdown has begun: fetching stopped
			close(release)                     // the running job finishes well within the timeout
			if err := <-stopped; err != nil {
				t.Fatalf("stop: %v", err)
			}
			switch ran := c.get("waiting") == 1; {
			case ran != tt.wantRun:
				t.Fatalf("job \"waiting\" on delivery 1 of %d, fetched before shutdown: ran %d times during it, want run %v", tt.maxDeliver, c.get("waiting"), tt.wantRun)
			case tt.wantRun:
				b.waitDrained(t) // its ack lands
				if st := b.status(t); st.DLQ.Messages != 0 {
					t.Errorf("after stop: DLQ holds %d; want both run and acked", st.DLQ.Messages)
				}
			default:
				// "first"'s ack lands; "waiting" stays, handed back.
				waitFor(t, 20*time.Second, func() error {
					if st := b.status(t); st.Stream.Messages != 1 {
						return fmt.Errorf("after stop: JOB holds %d jobs; want \"waiting\" alone, handed back", st.Stream.Messages)
					}
					return nil
				})
				b.wantNextDelivery(t, "waiting", 2)
			}
			if tt.wantRun && !tt.noLedger {
				if rec := b.record(t, "waiting"); rec.State != data.StateDone {
					t.Errorf("\"waiting\" ran at shutdown; its record is %+v, want done", rec)
				}
			}
		})
	}
}

// A job whose admission is failing (the ledger refuses the pool's lease)
// when Stop is called goes back at once if it has deliveries to spare, so
// Stop does not wait on the ledger for it. On its last delivery it is held
// while Stop waits, and runs once the ledger answers, rather than being
// handed back to be dead-lettered unrun.
func TestStopAndAJobWhoseAdmissionWaits(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		maxDeliver int
	}{{"spare deliveries", 3}, {"last delivery", 1}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			last := tt.maxDeliver == 1
			c := newCounter()
			b, p := leaseRefused(t, queue.Config{Workers: 1, MaxDeliver: tt.maxDeliver}, c.wrap(ok))
			b.enqueue(t, "job.s", "J", "x")
			b.waitAckPending(t, 1) // fetched, its admission failing
			stopped := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				stopped <- p.Stop(ctx)
			}()
			if last {
				time.Sleep(500 * time.Millisecond) // shutdown has begun
				if n := c.get("J"); n != 0 {
					t.Fatalf("J ran %d times while the ledger refused its lease; want 0", n)
				}
				setDiscardNewPerSubject(t, b, false)
			}
			select {
			case err := <-stopped:
				if err != nil {
					t.Fatalf("stop: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("Stop still waits on the ledger for J, delivery 1 of %d", tt.maxDeliver)
			}
			st := b.status(t)
			switch n := c.get("J"); {
			case last && n != 1:
				t.Fatalf("J, on its last delivery, ran %d times by the end of shutdown; want once", n)
			case last:
				b.waitDrained(t) // its ack lands
				if st := b.status(t); st.DLQ.Messages != 0 {
					t.Errorf("after stop: DLQ holds %d; want J run and acked", st.DLQ.Messages)
				}
			case !last && (n != 0 || st.Stream.Messages != 1):
				t.Fatalf("after stop: J ran %d times and JOB holds %d jobs; want J handed back unrun", n, st.Stream.Messages)
			case !last:
				setDiscardNewPerSubject(t, b, false)
				b.wantNextDelivery(t, "J", 2)
			}
		})
	}
}

// One stop hands each fetched job back once: not into the pull still open
// at the stop, from which it would come back to be handed back again, a
// delivery spent each time. Here the jobs wait on a ledger that refuses the
// pool's lease, so they go back as soon as Stop begins.
func TestStopHandsBackEachJobOnce(t *testing.T) {
	t.Parallel()
	const jobs = 40
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			t.Parallel()
			b, p := leaseRefused(t, queue.Config{Workers: 1, MaxDeliver: 5}, handlers.HandlerFunc(ok))
			for i := range jobs {
				b.enqueue(t, "job.s", fmt.Sprintf("j%d", i), "x")
			}
			b.waitAckPending(t, jobs)
			time.Sleep(200 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := p.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			setDiscardNewPerSubject(t, b, false)
			var mu sync.Mutex
			attempts := map[string]int{}
			b.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
				mu.Lock()
				defer mu.Unlock()
				attempts[job.ID] = job.Attempt
				return nil
			}))
			b.waitDrained(t)
			mu.Lock()
			defer mu.Unlock()
			var again []string
			for id, n := range attempts {
				if n != 2 {
					again = append(again, fmt.Sprintf("%s on delivery %d", id, n))
				}
			}
			if len(attempts) != jobs || len(again) > 0 {
				t.Errorf("after one stop, %d of %d jobs ran; these not on delivery 2: %v", len(attempts), jobs, again)
			}
		})
	}
}

// jobq next holds a job whose done record the ledger refuses for a while (a
// bucket at its limit), as a pool does, and acks it once the record is
// stored: it neither reports success with the job unrecorded nor leaves
// it to run again, or with MaxDeliver 1 to be dead-lettered though it
// succeeded.
func TestNextHoldsAJobWhoseDoneRecordIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 1, AckWait: 3 * time.Second})
	b.enqueue(t, "job.x", "J", "x")
	var once sync.Once
	found, err := queue.Next(ctx, b.obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		once.Do(func() {
			setLedgerFull(t, b, true)
			time.AfterFunc(time.Second, func() { setLedgerFull(t, b, false) })
		})
		return nil
	}), 5*time.Second, servertest.Logger(t))
	if err != nil || !found {
		t.Fatalf("Next: got %v, %v; want J run and recorded once the ledger had room", found, err)
	}
	rec, rerr := data.NewLedger(b.obj.Ledger, time.Minute, nil).Get(ctx, "J")
	if st := b.status(t); rerr != nil || rec.State != data.StateDone || st.Stream.Messages != 0 {
		t.Errorf("after Next: J's record is %+v (%v) and JOB holds %d jobs; want J recorded done and acked", rec, rerr, st.Stream.Messages)
	}
	// A pool's sweep finds nothing to dead-letter.
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	b.waitDrained(t)
	if st := b.status(t); st.DLQ.Messages != 0 {
		dl, _ := queue.ListDeadLetters(ctx, b.obj, 0)
		t.Errorf("J's handler succeeded under jobq next, yet DLQ holds %d: %+v", st.DLQ.Messages, dl)
	}
}

// jobq next --wait 0 takes a job that is waiting, as next --no-ack --wait 0
// shows it.
func TestNextWithNoWaitTakesAWaitingJob(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	b.enqueue(t, "job.n", "w0", "x")
	if found, err := queue.Peek(context.Background(), b.obj, 0, func(*data.Job) error { return nil }); err != nil || !found {
		t.Fatalf("peek --wait 0: got %v %v, want the waiting job", found, err)
	}
	found, err := queue.Next(context.Background(), b.obj, handlers.HandlerFunc(ok), 0, servertest.Logger(t))
	if err != nil || !found {
		t.Errorf("next --wait 0 with a job waiting: got %v %v, want it taken", found, err)
	}
}

// wantNextDelivery runs the jobs left in JOB in a new pool and fails t
// unless job id, the only one left, runs once, on delivery n: a stop that
// handed it back once spent one delivery, not more.
func (b *testBundle) wantNextDelivery(t *testing.T, id string, n int) {
	t.Helper()
	var mu sync.Mutex
	var got []int
	b.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		mu.Lock()
		defer mu.Unlock()
		if job.ID == id {
			got = append(got, job.Attempt)
		}
		return nil
	}))
	b.waitDrained(t)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != n {
		t.Errorf("after the stop, %s ran on deliveries %v; want once, on delivery %d", id, got, n)
	}
}

// leaseRefused starts a pool over h that has written its lease, then makes
// the ledger refuse the lease's writes: the jobs fetched from then on wait
// in their admission, retried. The test stops the pool.
func leaseRefused(t *testing.T, cfg queue.Config, h handlers.Handler) (*testBundle, *queue.Pool) {
	t.Helper()
	b := setup(t, cfg)
	p := queue.NewPool(b.obj, h, servertest.Logger(t))
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, "job.s", "a", "x") // the pool's lease is written
	b.waitDrained(t)
	setDiscardNewPerSubject(t, b, true)
	return b, p
}

// A handler that stops its own pool, as the README says (go pool.Stop):
// its job is recorded done and acked, and Stop returns nil once it did.
func TestHandlerStopsItsOwnPool(t *testing.T) {
	t.Parallel()
	for _, noLedger := range []bool{false, true} {
		t.Run(fmt.Sprintf("no ledger %v", noLedger), func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{Workers: 2, NoLedger: noLedger})
			stopped := make(chan error, 1)
			var p *queue.Pool
			p = queue.NewPool(b.obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
				go func() {
					sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					stopped <- p.Stop(sctx)
				}()
				return nil
			}), servertest.Logger(t))
			if err := p.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			b.enqueue(t, "job.quit", "quit", "x")
			if err := <-stopped; err != nil {
				t.Fatalf("Stop from the handler's goroutine: %v", err)
			}
			if p.Running() {
				t.Error("pool runs after Stop returned")
			}
			b.waitDrained(t)
			if !noLedger {
				if rec := b.waitState(t, "quit", data.StateDone); rec.Attempts != 1 {
					t.Errorf("job quit: %d attempts, want 1", rec.Attempts)
				}
			}
		})
	}
}

// A backlog across restarts: a job fetched behind a long one is handed back
// by each stop, a delivery spent each time; on its last one it is kept, but
// the stop's time runs out and it goes back unstarted again. It was then
// dead-lettered, "deliveries exhausted … released by shutdown before it
// started", with 3 attempts, though it never ran and never failed. It is
// enqueued again instead, and runs once.
func TestBacklogJobIsNotDeadLetteredUnrunAcrossStops(t *testing.T) {
	for _, withID := range []bool{true, false} {
		t.Run(fmt.Sprintf("with an ID %v", withID), func(t *testing.T) {
			t.Parallel()
			backlogAcrossStops(t, withID)
		})
	}
}

// backlogAcrossStops runs TestBacklogJobIsNotDeadLetteredUnrunAcrossStops,
// its waiting job published with an ID of its own, or without one (known by
// its stream sequence, seq-2).
func backlogAcrossStops(t *testing.T, withID bool) {
	b := setup(t, queue.Config{Workers: 1, AckWait: 2 * time.Second})
	waiting := "waiting"
	if !withID {
		waiting = data.SeqID(2)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	block := func(ctx context.Context, job *data.Job) error {
		mu.Lock()
		runs[job.ID]++
		mu.Unlock()
		if job.ID == "first" {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	for round := 1; round <= 3; round++ {
		p := queue.NewPool(b.obj, handlers.HandlerFunc(block), servertest.Logger(t))
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if round == 1 {
			b.enqueue(t, "job.s", "first", "x")
			waitFor(t, 10*time.Second, func() error {
				mu.Lock()
				defer mu.Unlock()
				if runs["first"] == 0 {
					return fmt.Errorf("first not running")
				}
				return nil
			})
			if withID {
				b.enqueue(t, "job.s", "waiting", "x")
			} else if _, err := b.js.Publish(context.Background(), "job.s", []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		b.waitAckPending(t, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		if err := p.Stop(ctx); err != nil {
			t.Fatalf("stop %d: %v", round, err)
		}
		cancel()
	}
	b.startPool(t, handlers.HandlerFunc(block))
	b.waitState(t, waiting, data.StateDone)
	waitFor(t, 30*time.Second, func() error {
		if left := b.storedJobs(t); len(left) != 0 {
			return fmt.Errorf("JOB still holds %+v", left)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if n := runs[waiting]; n != 1 {
		t.Errorf("job %s ran %d times, want once", waiting, n)
	}
	if _, err := queue.DeadLetterOf(context.Background(), b.obj, waiting); err == nil {
		t.Errorf("job %s, which never failed, has a dead letter", waiting)
	}
	// first ran three times, cut off each time: in DLQ, as it should be.
	if _, err := queue.DeadLetterOf(context.Background(), b.obj, "first"); err != nil {
		t.Errorf("job first, cut off on each of its deliveries: %v, want its dead letter", err)
	}
}
