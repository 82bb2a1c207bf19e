package queue

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// ackLog is an ackOrder's send that notes the jobs acked, in order.
type ackLog struct {
	mu    sync.Mutex
	acked []*inflight
	sent  chan struct{} // one per ack
}

func loggedAckOrder(t *testing.T, hold time.Duration) (*ackOrder, *ackLog) {
	t.Helper()
	l := &ackLog{sent: make(chan struct{}, 1000)}
	a := newAckOrder(func(it *inflight) {
		l.mu.Lock()
		l.acked = append(l.acked, it)
		l.mu.Unlock()
		l.sent <- struct{}{}
	}, hold)
	t.Cleanup(a.close)
	return a, l
}

// heldAcks counts the acks a holds.
func (a *ackOrder) heldAcks() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for i := range a.queue.len() {
		if a.queue.at(i).ack == ackWanted {
			n++
		}
	}
	return n
}

func (l *ackLog) got() []*inflight {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.acked)
}

func fetchedJobs(a *ackOrder, n int) []*inflight {
	its := make([]*inflight, n)
	for i := range its {
		its[i] = new(inflight)
		a.add(its[i])
	}
	return its
}

func TestAcksGoInTheOrderTheJobsWereFetched(t *testing.T) {
	a, l := loggedAckOrder(t, time.Hour)
	its := fetchedJobs(a, 5)
	// Done 2, 4, 1, 3 (5 let go of without an ack), then 0.
	a.ack(its[2])
	a.ack(its[4])
	a.ack(its[1])
	a.drop(its[3])
	a.drop(its[2]) // after its ack: no change
	if got := l.got(); len(got) != 0 {
		t.Fatalf("%d acks sent before the first job was done", len(got))
	}
	a.ack(its[0])
	want := []*inflight{its[0], its[1], its[2], its[4]}
	if got := l.got(); !slices.Equal(got, want) {
		t.Fatalf("acked %v, want %v", indexes(its, got), indexes(its, want))
	}
	if a.queue.len() != 0 || a.heldAcks() != 0 {
		t.Fatalf("%d jobs left in the order, %d acks held", a.queue.len(), a.heldAcks())
	}
}

func TestJobsDroppedAtTheFrontLetTheAcksBehindThemGo(t *testing.T) {
	a, l := loggedAckOrder(t, time.Hour)
	its := fetchedJobs(a, 3)
	a.ack(its[2])
	a.drop(its[0])
	if got := l.got(); len(got) != 0 {
		t.Fatalf("%d acks sent while job 1 was still in the pool", len(got))
	}
	a.drop(its[1])
	if got := l.got(); !slices.Equal(got, its[2:]) {
		t.Fatalf("acked %v, want [2]", indexes(its, got))
	}
}

// A job that stays long in the pool holds the acks after it back for the
// hold at most; it then loses its place, and its own ack goes out at once.
func TestAnAckWaitsForAnEarlierJobAtMostTheHold(t *testing.T) {
	a, l := loggedAckOrder(t, 20*time.Millisecond)
	its := fetchedJobs(a, 4)
	a.ack(its[1])
	a.ack(its[2])
	for range 2 {
		select {
		case <-l.sent:
		case <-time.After(10 * time.Second):
			t.Fatal("the acks behind a job still in the pool were held for good")
		}
	}
	if got := l.got(); !slices.Equal(got, its[1:3]) {
		t.Fatalf("acked %v, want [1 2]", indexes(its, got))
	}
	// The timer's goroutine is through sending: an ack due while it sends
	// is its to send, after ack returned.
	a.mu.Lock()
	for a.sending {
		a.idle.Wait()
	}
	a.mu.Unlock()
	// Job 0 lost its place: its ack goes out when it is done, and job 3's
	// waits for no one.
	a.ack(its[3])
	a.ack(its[0])
	if got := l.got(); !slices.Equal(got, []*inflight{its[1], its[2], its[3], its[0]}) {
		t.Fatalf("acked %v, want [1 2 3 0]", indexes(its, got))
	}
	a.drop(its[0]) // released after its ack: nothing more
	if a.queue.len() != 0 || a.heldAcks() != 0 || len(l.got()) != 4 {
		t.Fatalf("%d jobs left in the order, %d acks held, %d sent", a.queue.len(), a.heldAcks(), len(l.got()))
	}
}

// Every done job waits at most the hold, counted from when it was done:
// one done earlier is not held on while jobs before it finish one after
// the other, each within the hold of the last look.
func TestEveryAckWaitsAtMostTheHold(t *testing.T) {
	a, l := loggedAckOrder(t, time.Hour) // the timer is the test's
	var clock time.Time
	a.now = func() time.Time { return clock }
	its := fetchedJobs(a, 5) // job 0 runs long
	a.ack(its[4])
	clock = clock.Add(36 * time.Minute)
	a.ack(its[3])
	clock = clock.Add(24 * time.Minute) // job 4 waited the hold, job 3 less
	a.expire()
	if got := l.got(); !slices.Equal(got, []*inflight{its[3], its[4]}) {
		t.Fatalf("acked %v once job 4 waited the hold, want [3 4]", indexes(its, got))
	}
	// Jobs 0 to 2 lost their place: their acks go out when they are done.
	a.ack(its[2])
	a.ack(its[1])
	a.ack(its[0])
	if got := l.got(); !slices.Equal(got, []*inflight{its[3], its[4], its[2], its[1], its[0]}) {
		t.Fatalf("acked %v, want [3 4 2 1 0]", indexes(its, got))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.queue.len() != 0 || a.waiting.len() != 0 {
		t.Fatalf("%d jobs left in the order, %d waiting", a.queue.len(), a.waiting.len())
	}
}

// Jobs let go of without an ack behind one that stays in the pool are let
// go of after the hold too, not kept (with their payloads) as long as it.
func TestJobsDroppedBehindALongJobAreNotKept(t *testing.T) {
	a, _ := loggedAckOrder(t, 20*time.Millisecond)
	long := new(inflight)
	a.add(long)
	for range 1000 {
		it := new(inflight)
		a.add(it)
		a.drop(it)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.mu.Lock()
		n, w := a.queue.len(), a.waiting.len()
		a.mu.Unlock()
		if n == 0 && w == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d jobs kept in the order behind one still in the pool, %d waiting", n, w)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCloseSendsTheHeldAcks(t *testing.T) {
	a, l := loggedAckOrder(t, time.Hour)
	its := fetchedJobs(a, 3)
	a.ack(its[2])
	a.ack(its[1])
	a.close()
	if got := l.got(); !slices.Equal(got, []*inflight{its[1], its[2]}) {
		t.Fatalf("acked %v at close, want [1 2]", indexes(its, got))
	}
	// After close, an ack goes out at once, and a job fetched then is in
	// no order.
	a.ack(its[0])
	late := new(inflight)
	a.add(late)
	a.ack(late)
	if got := l.got(); !slices.Equal(got, []*inflight{its[1], its[2], its[0], late}) {
		t.Fatalf("acked %d jobs after close, want 2", len(got)-2)
	}
}

// An ack whose send waits (as for a look-up of JOB) holds up no fetch,
// and no worker whose ack is due after it: the goroutine sending sends
// those too, in order. Close waits for it.
func TestAnAckThatWaitsHoldsUpNoFetch(t *testing.T) {
	gate, atGate := make(chan struct{}), make(chan struct{})
	its := []*inflight{new(inflight), new(inflight), new(inflight)}
	var mu sync.Mutex
	var acked []int
	a := newAckOrder(func(it *inflight) {
		if it == its[0] {
			close(atGate)
			<-gate
		}
		mu.Lock()
		acked = append(acked, slices.Index(its, it))
		mu.Unlock()
	}, time.Hour)
	a.add(its[0])
	a.add(its[1])
	sending := make(chan struct{})
	go func() {
		defer close(sending)
		a.ack(its[0]) // sends, and waits at the gate
	}()
	<-atGate
	returned := func(f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() {
			defer close(done)
			f()
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("held up by the ack waiting to be sent")
		}
	}
	// Both wait for job 0's ack to be sent, not for the lock over it.
	returned(func() { a.add(its[2]) })
	returned(func() { a.ack(its[1]) })
	returned(func() { a.drop(its[2]) })
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		a.close()
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case <-closed:
		t.Fatal("close returned while an ack was still being sent")
	default:
	}
	close(gate)
	<-closed
	<-sending
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(acked, []int{0, 1}) {
		t.Fatalf("acked %v, want [0 1]", acked)
	}
}

func TestTheOrderGrowsAndWrapsAround(t *testing.T) {
	a, l := loggedAckOrder(t, time.Hour)
	var want []*inflight
	// Rounds of 50 fetched, acked last to first, so that the ring wraps
	// around and grows past its first size with jobs in it.
	for range 5 {
		its := fetchedJobs(a, 50)
		more := fetchedJobs(a, 100)
		for i := len(its) - 1; i >= 0; i-- {
			a.ack(its[i])
		}
		for _, it := range more {
			a.ack(it)
		}
		want = append(append(want, its...), more...)
	}
	if got := l.got(); !slices.Equal(got, want) {
		t.Fatalf("acked %d jobs, want %d in fetch order", len(got), len(want))
	}
}

// indexes names each of got by its place in its.
func indexes(its, got []*inflight) []int {
	out := make([]int, len(got))
	for i, it := range got {
		out[i] = slices.Index(its, it)
	}
	return out
}

// slowThenFast starts a pool on obj whose first job, slow, runs until its
// context ends, and enqueues it and then n fast ones. It returns once the
// fast ones ran.
func slowThenFast(t *testing.T, obj *Objects, p func(handlers.Handler) *Pool, n int) *Pool {
	t.Helper()
	ctx := context.Background()
	ran := make(chan string, n+1)
	pool := p(handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		ran <- job.ID
		if job.ID == "slow" {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}))
	if err := pool.Start(ctx); err != nil {
		t.Fatal(err)
	}
	prod := NewProducer(obj.JS, obj.Config)
	if _, err := prod.Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "slow"}); err != nil {
		t.Fatal(err)
	}
	if got := <-ran; got != "slow" {
		t.Fatalf("ran %s first", got)
	}
	for i := range n {
		if _, err := prod.Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "fast-" + strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Fatal("the fast jobs did not all run")
		}
	}
	return pool
}

// waitStored waits until JOB holds want jobs.
func waitStored(t *testing.T, obj *Objects, want uint64, why string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := obj.Jobs.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: JOB holds %d jobs, want %d", why, info.State.Msgs, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A job whose handler runs long holds back the acks of the jobs fetched
// after it for the hold at most: they leave JOB while it runs.
func TestJobsDoneBehindALongJobAreAcked(t *testing.T) {
	t.Parallel()
	for _, noLedger := range []bool{false, true} {
		t.Run("no_ledger="+strconv.FormatBool(noLedger), func(t *testing.T) {
			t.Parallel()
			obj := objectsWith(t, Config{NoLedger: noLedger})
			slowThenFast(t, obj, func(h handlers.Handler) *Pool {
				p := NewPool(obj, h, servertest.Logger(t))
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					defer cancel()
					p.Stop(ctx)
				})
				return p
			}, 20)
			waitStored(t, obj, 1, "20 jobs done while the slow one runs")
		})
	}
}

// Acks the pool holds at Stop go out before it returns: once the job they
// wait for is cut off, or when its handler ignores the cut-off and Stop
// gives up on it (after opTimeout + 5s).
func TestStopSendsTheAcksItHeld(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		noLedger bool
		stuck    bool
	}{{"ledger", false, false}, {"no_ledger", true, false}, {"ledger/stuck", false, true}, {"no_ledger/stuck", true, true}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			obj := objectsWith(t, Config{NoLedger: tt.noLedger})
			stuck := make(chan struct{})
			t.Cleanup(func() { close(stuck) })
			pool := slowThenFast(t, obj, func(h handlers.Handler) *Pool {
				if tt.stuck {
					h = ignoresCancel(h, stuck)
				}
				p := NewPool(obj, h, servertest.Logger(t))
				p.acks.hold = time.Hour
				return p
			}, 20)
			// Their acks wait for the slow job.
			deadline := time.Now().Add(10 * time.Second)
			for {
				held := pool.acks.heldAcks()
				if held == 20 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d acks held, want 20", held)
				}
				time.Sleep(10 * time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if err := pool.Stop(ctx); (err != nil) != tt.stuck {
				t.Fatalf("Stop: %v", err)
			}
			// The slow job, cut off, stays for its next run.
			waitStored(t, obj, 1, "Stop returned")
		})
	}
}

// ignoresCancel makes h's job slow go on after its context ends, until
// stuck is closed.
func ignoresCancel(h handlers.Handler, stuck <-chan struct{}) handlers.Handler {
	return handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		err := h.Process(ctx, job)
		if job.ID == "slow" {
			<-stuck
		}
		return err
	})
}
