package queue_test

import (
	"context"
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
// not started are handed back as they were).
func TestStopHandsBackFetchedJobsUnstarted(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{Workers: 1})
	release := make(chan struct{})
	started := make(chan string, 4)
	var mu sync.Mutex
	ran := map[string]bool{}
	p := queue.NewPool(b.obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		mu.Lock()
		ran[job.ID] = true
		mu.Unlock()
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
	mu.Lock()
	defer mu.Unlock()
	if ran["waiting"] {
		t.Errorf("job \"waiting\" was fetched before shutdown but started after it began; want it handed back unstarted")
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
