package queue

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// failedBefore gives job id a record of an earlier attempt that failed, so
// that its next one is claimed first, and returns a ledger on obj.
func failedBefore(t *testing.T, obj *Objects, id string) *data.Ledger {
	t.Helper()
	ctx := context.Background()
	l := data.NewLedger(obj.Ledger, obj.Config.lease(), nil)
	c, err := l.Claim(ctx, &data.Job{ID: id, Subject: "job.x", Seq: 1000, Attempt: 1}, "earlier")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Retry(ctx, &c, time.Millisecond, "boom"); err != nil {
		t.Fatal(err)
	}
	return l
}

// stuckUpdates fails the ledger's record updates, a claim's renewal among
// them, while stuck is set: at once, as a refusing bucket does, or, with
// hang, once the caller gives up, as while the client is cut off from the
// server.
type stuckUpdates struct {
	jetstream.KeyValue
	stuck *atomic.Bool
	hang  bool
}

func (k stuckUpdates) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	switch {
	case !k.stuck.Load():
		return k.KeyValue.Update(ctx, key, value, rev)
	case k.hang:
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return 0, nats.ErrTimeout
}

// A job that runs on a claim of its own (it has a record: an earlier
// attempt failed) is cancelled before its claim runs out when the claim
// cannot be renewed, whether the renewals fail or hang, as a job on the
// pool's lease is: otherwise another pool claims a copy of it (here a
// re-drive) once the claim ended, and runs it beside the first run.
func TestClaimThatCannotBeRenewedStopsItsHandler(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		hang bool
	}{{"renewals fail", false}, {"renewals hang", true}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := objectsWith(t, Config{AckWait: 3 * time.Second, MaxDeliver: 20, RetryBackoff: []time.Duration{10 * time.Millisecond}, FetchWait: 200 * time.Millisecond})

			failedBefore(t, obj, "J") // J has a record: it is claimed first

			var aRunning, overlap atomic.Bool
			aStarted, aCause := make(chan struct{}), make(chan error, 1)
			var stuck atomic.Bool
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
			a.ledger = data.NewLedger(stuckUpdates{KeyValue: obj.Ledger, stuck: &stuck, hang: tt.hang}, obj.Config.lease(), obj.JS)
			startPool(t, a)
			if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-aStarted:
			case <-time.After(10 * time.Second):
				t.Fatal("pool A never ran J")
			}
			stuck.Store(true) // A's renewals of J's claim fail from now on
			a.fetchCancel()   // A takes no more jobs: the copy below goes to B

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
				t.Fatal("pool B never ran the copy of J")
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
		})
	}
}

// A lease given up before its job's handler starts keeps the handler from
// starting, and writes nothing: no attempt ran that a record should tell
// of. runOne looks at the loss and registers the handler's cancel in one
// critical section, so a loss after that cancels the handler instead.
func TestLeaseLostBeforeTheHandlerStartsStopsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := leasingPool(t, leasingObjects(t))
	var ran atomic.Bool
	p.handler = handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		ran.Store(true)
		return nil
	})
	it, _ := recJob("K", 1)
	p.beats.add(it)
	leaseOne(t, p, it)
	hctx, hcancel := context.WithCancelCause(ctx)
	defer hcancel(nil)
	it.hctx = handlerCtx{ctx: hctx, cancel: hcancel}

	p.beats.loseLeased(errors.Join(data.ErrClaimLost, errors.New("lease not renewed in time")))
	if succeeded := p.runOne(ctx, it); succeeded || ran.Load() {
		t.Errorf("K's lease was given up before its handler started, yet the handler ran (%v) and runOne reported success (%v)", ran.Load(), succeeded)
	}
	if rec, err := p.ledger.Get(ctx, "K"); !errors.Is(err, data.ErrNotFound) {
		t.Errorf("K's ledger record: got %+v, %v; want none, as no attempt ran", rec, err)
	}
}

// A claim that the ledger cannot settle for a while (here its writes fail)
// is tried again while the job waits, rather than count as a failed
// attempt: on the job's only delivery, that would dead-letter a job that
// never ran.
func TestClaimIsRetriedWhileTheLedgerFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{MaxDeliver: 1})
	l := failedBefore(t, obj, "J") // J has a record: it is claimed first

	var runs atomic.Int32
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		runs.Add(1)
		return nil
	}), servertest.Logger(t))
	var stuck atomic.Bool
	stuck.Store(true)
	p.ledger = data.NewLedger(stuckUpdates{KeyValue: obj.Ledger, stuck: &stuck}, obj.Config.lease(), obj.JS)
	startPool(t, p)
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // a few claims fail
	stuck.Store(false)

	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := l.Get(ctx, "J")
		if err == nil && rec.State == data.StateDone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("J's record: %+v, %v; want done once the ledger takes writes again", rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("J ran %d times, want 1", n)
	}
	info, err := obj.Dead.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Errorf("DLQ holds %d dead letters, want none: J never failed", info.State.Msgs)
	}
}

// jobq next gives up on a ledger that lets no job be claimed, with an
// error, and hands the job back rather than wait for it forever.
func TestNextGivesUpOnAStuckLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	failedBefore(t, obj, "J") // J has a record: it is claimed first
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Bool
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { ran.Store(true); return nil }), servertest.Logger(t))
	var stuck atomic.Bool
	stuck.Store(true)
	p.ledger = data.NewLedger(stuckUpdates{KeyValue: obj.Ledger, stuck: &stuck}, obj.Config.lease(), obj.JS)
	t.Cleanup(p.ledger.Close)
	msg, err := fetchOne(ctx, obj, nil, 5*time.Second)
	if err != nil || msg == nil {
		t.Fatalf("fetch J: %v, %v", msg, err)
	}
	if err := p.processOne(ctx, msg); err == nil || !strings.Contains(err.Error(), "could not check or claim") {
		t.Errorf("processOne with a stuck ledger: got %v, want an error that says the ledger could not claim the job", err)
	}
	if ran.Load() {
		t.Error("J ran without a claim")
	}
	// Handed back: delivered again at once, not after the ack wait.
	if again, err := fetchOne(ctx, obj, nil, 5*time.Second); err != nil || again == nil {
		t.Errorf("fetch J again: %v, %v; want J handed back", again, err)
	}
}

// landedTimeout stores the first record update but answers it with a
// timeout, as when the bucket's ack is lost on the way back.
type landedTimeout struct {
	jetstream.KeyValue
	once *atomic.Bool
}

func (k landedTimeout) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	r, err := k.KeyValue.Update(ctx, key, value, rev)
	if err == nil && k.once.CompareAndSwap(false, true) {
		return 0, nats.ErrTimeout
	}
	return r, err
}

// A claim whose write landed but whose answer timed out is retried; the
// retry finds the pool's own claim on this very copy of the job, and waits
// it out rather than release the job: released, it would spend its only
// delivery and be dead-lettered without running.
func TestClaimWhoseLostAnswerLandedIsWaitedOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{MaxDeliver: 1, AckWait: 3 * time.Second})
	l := failedBefore(t, obj, "J") // J has a record: it is claimed first
	var runs atomic.Int32
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		runs.Add(1)
		return nil
	}), servertest.Logger(t))
	p.ledger = data.NewLedger(landedTimeout{KeyValue: obj.Ledger, once: new(atomic.Bool)}, obj.Config.lease(), obj.JS)
	startPool(t, p)
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(12 * time.Second)
	for time.Now().Before(deadline) && runs.Load() == 0 {
		time.Sleep(50 * time.Millisecond)
	}
	info, _ := obj.Dead.Info(ctx)
	rec, _ := l.Get(ctx, "J")
	if runs.Load() != 1 || info.State.Msgs != 0 {
		t.Errorf("J ran %d times (want 1), DLQ holds %d (want 0); record %+v", runs.Load(), info.State.Msgs, rec)
	}
}

// A job on a claim of its own whose renewals fail, and whose handler,
// cancelled, finishes its work and returns nil: it succeeded, and its done
// record, a compare-and-set on the claim that no one took over, is
// written. Its success was taken for a lost claim, the job left to wait
// out the ack wait, and it ran again.
func TestClaimedJobThatSucceedsAfterItsClaimWasLostRunsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second, MaxDeliver: 20, RetryBackoff: []time.Duration{10 * time.Millisecond}, FetchWait: 200 * time.Millisecond})
	failedBefore(t, obj, "J") // J has a record: it is claimed first
	var runs atomic.Int32
	var stuck atomic.Bool
	started := make(chan struct{})
	p := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		if runs.Add(1) == 1 {
			close(started)
			<-ctx.Done()
			stuck.Store(false) // the ledger takes writes again
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	}), servertest.Logger(t))
	p.ledger = data.NewLedger(stuckUpdates{KeyValue: obj.Ledger, stuck: &stuck}, obj.Config.lease(), obj.JS)
	startPool(t, p)
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	<-started
	stuck.Store(true)           // the claim's renewals fail until the handler was cancelled
	time.Sleep(5 * time.Second) // past an ack wait: a job left unacked came back
	if n := runs.Load(); n != 1 {
		t.Errorf("J's handler returned nil on its first run, yet J ran %d times; want 1", n)
	}
	if rec, err := p.ledger.Get(ctx, "J"); err != nil || rec.State != data.StateDone {
		t.Errorf("J's record: %+v (%v), want done", rec, err)
	}
}

// A claimed job's attempt fails, and the ledger refuses its retrying record
// (a full store, a bucket leader moving): the job is released, but not
// before its claim, still stored as running, ends. Redelivered after the
// retry's backoff alone, it met its own live claim, was handed back, and
// spent a delivery: here, its last, so it was dead-lettered after one run.
func TestRefusedRetryRecordSpendsNoDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second, MaxDeliver: 2, RetryBackoff: []time.Duration{10 * time.Millisecond}, FetchWait: 200 * time.Millisecond})
	failedBefore(t, obj, "J") // J has a record: it is claimed first
	var runs atomic.Int32
	var stuck atomic.Bool
	p := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		if runs.Add(1) == 1 {
			stuck.Store(true) // the retrying record is refused
			go func() {
				time.Sleep(500 * time.Millisecond)
				stuck.Store(false)
			}()
			return errors.New("not yet")
		}
		return nil
	}), servertest.Logger(t))
	p.ledger = data.NewLedger(stuckUpdates{KeyValue: obj.Ledger, stuck: &stuck}, obj.Config.lease(), obj.JS)
	startPool(t, p)
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec, err := p.ledger.Get(ctx, "J")
		if err == nil && (rec.State == data.StateDone || rec.State == data.StateFailed && rec.Attempts > 0) {
			if rec.State != data.StateDone || runs.Load() != 2 {
				t.Errorf("J ran %d times, record %s after %d attempts; want run twice, done", runs.Load(), rec.State, rec.Attempts)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("J ran %d times, record %+v (%v); want it done", runs.Load(), rec, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A job on the pool's lease, cut off by shutdown, whose cut-off record the
// ledger refuses, is released once its place in the lease ends. Its place
// is marked an orphan's in the stopping pool's memory only: the pool never
// writes its lease again, nor deletes it. Released after its backoff alone,
// the job's redelivery to the pool started next (a restart) met that
// stored lease, which lists it as running, and was handed back, spending a
// delivery: here its last, so it was dead-lettered having run once, cut off.
func TestCutOffLeasedJobWhoseRecordIsRefusedSpendsNoDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{MaxDeliver: 2, AckWait: 6 * time.Second, RetryBackoff: []time.Duration{10 * time.Millisecond}, FetchWait: 200 * time.Millisecond})
	var stuck atomic.Bool
	started := make(chan struct{}, 1)
	p := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		started <- struct{}{}
		<-ctx.Done()
		stuck.Store(true) // the cut-off record is refused
		return ctx.Err()
	}), servertest.Logger(t))
	if !p.leasing {
		t.Fatal("the pool does not lease: the test needs a job on the pool's lease")
	}
	p.ledger = data.NewLedger(stuckUpdates{KeyValue: obj.Ledger, stuck: &stuck}, obj.Config.lease(), obj.JS)
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "L"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("L did not start")
	}
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	p.Stop(sctx)
	runs, dead := runsAfterStop(t, obj)
	if runs != 1 || dead != 0 {
		t.Errorf("L, cut off on delivery 1 of 2 with its cut-off record refused, ran %d times after the restart (want 1), DLQ holds %d (want 0)", runs, dead)
	}
}
