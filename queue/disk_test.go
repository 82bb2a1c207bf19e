package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server"
	"github.com/jobq/jobq/server/servertest"
)

// TestFullStoreRefusesNewJobsAndKeepsStoredOnes simulates a full disk with
// the server's storage limit: JOB is capped below it, so publishing fails
// with a clear error while the ledger still has room to finish every stored
// job, and publishing works again once the workers drained JOB.
func TestFullStoreRefusesNewJobsAndKeepsStoredOnes(t *testing.T) {
	t.Parallel()
	const maxStore = 4 << 20
	srv := servertest.StartConfig(t, server.Config{MaxStore: maxStore, Logger: servertest.Logger(t)})
	b := setupOn(t, srv, queue.Config{MaxBytes: maxStore / 4})
	payload := strings.Repeat("x", 16<<10)
	var stored []string
	var full error
	for i := range 1000 {
		id := fmt.Sprintf("big-%d", i)
		_, err := b.prod.Enqueue(context.Background(), "job.big", []byte(payload), queue.EnqueueOptions{ID: id})
		if err != nil {
			full = err
			break
		}
		stored = append(stored, id)
	}
	if full == nil {
		t.Fatalf("stored 1000 jobs of 16 KiB under a 1 MiB cap, want a refusal")
	}
	if !errors.Is(full, queue.ErrFull) || !strings.Contains(full.Error(), "full") {
		t.Errorf("refusal: got %q, want ErrFull that says JOB is full", full)
	}
	t.Logf("stored %d jobs, then: %v", len(stored), full)

	c := newCounter()
	b.startPool(t, c.wrap(ok))
	b.waitDrained(t)
	for _, id := range stored {
		if got := c.get(id); got != 1 {
			t.Errorf("job %s ran %d times, want 1", id, got)
		}
		if rec := b.record(t, id); rec.State != data.StateDone {
			t.Errorf("job %s: got %s, want done", id, rec.State)
		}
	}
	if _, err := b.prod.Enqueue(context.Background(), "job.big", []byte(payload), queue.EnqueueOptions{ID: "after"}); err != nil {
		t.Errorf("enqueue after draining: %v", err)
	}
}

// TestFullLedgerHoldsAFinishedJobUntilItIsRecorded fills the ledger while a
// job runs: its done record is refused. The job is held, not run again and
// not dead-lettered on its last delivery, and acked once the ledger has
// room for its record.
func TestFullLedgerHoldsAFinishedJobUntilItIsRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 1, AckWait: 3 * time.Second})
	var lapsed atomic.Int32 // the server gave up on a delivery of J
	sub, err := b.nc.Subscribe(queue.AdvisoryMaxDeliveries, func(*nats.Msg) { lapsed.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	c, finish := b.runBlocked(t, "J")
	setLedgerFull(t, b, true)
	finish()

	// Retries are refused over more than two ack waits: the job's
	// heartbeats keep its only delivery alive meanwhile.
	time.Sleep(7 * time.Second)
	if st := b.status(t); st.Stream.Messages != 1 || st.Consumer.AckPending != 1 {
		t.Errorf("with its record refused, JOB holds %d jobs, %d ack pending; want J held: 1 and 1", st.Stream.Messages, st.Consumer.AckPending)
	}
	if n := lapsed.Load(); n != 0 {
		t.Errorf("%d MAX_DELIVERIES advisories for J while it was held: its ack wait ran out", n)
	}
	if _, err := data.NewLedger(b.obj.Ledger, time.Minute, nil).Get(ctx, "J"); !errors.Is(err, data.ErrNotFound) {
		t.Errorf("J's record in a full ledger: %v, want none", err)
	}

	setLedgerFull(t, b, false)
	b.waitDrained(t)
	c.wantOnce(t, "J")
	if rec := b.record(t, "J"); rec.State != data.StateDone {
		t.Errorf("J: got %s, want done", rec.State)
	}
	if st := b.status(t); st.DLQ.Messages != 0 {
		t.Errorf("DLQ holds %d dead letters, want none: J succeeded", st.DLQ.Messages)
	}
}

// setLedgerFull makes the ledger bucket refuse new keys, as a bucket at its
// limit does, or take them again. Existing keys, such as leases, can still
// be rewritten.
func setLedgerFull(t *testing.T, b *testBundle, full bool) {
	t.Helper()
	b.editLedger(t, func(cfg *jetstream.StreamConfig, st jetstream.StreamState) {
		cfg.MaxMsgs = -1
		if full {
			cfg.MaxMsgs = int64(st.Msgs)
		}
	})
}

// With --max-store, DLQ has a cap of its own (an eighth): dead letters
// nobody cleared filled the room kept for the ledger, after which no job
// could be recorded, the good ones neither. A dead letter over the cap is
// refused, its job stays in JOB, and the log says what to do; once there
// is room again, the sweep moves it. No job is lost.
func TestFullDLQKeepsItsJobsInJOB(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const capBytes = 200 << 10
	b := setup(t, queue.Config{DeadMaxBytes: capBytes, MaxDeliver: 1, AckWait: time.Second})
	logs := &servertest.LogBuffer{}
	p := queue.NewPool(b.obj, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		if job.Subject == "job.bad" {
			return handlers.Permanent(errors.New("broken"))
		}
		return nil
	}), zerolog.New(logs))
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopPool(t, p) })
	payload := strings.Repeat("x", 60<<10)
	for i := range 6 {
		b.enqueue(t, "job.bad", fmt.Sprintf("bad-%d", i), payload)
	}
	waitFor(t, 20*time.Second, func() error {
		st := b.status(t)
		if st.DLQ.Messages != 3 || st.Stream.Messages != 3 || !strings.Contains(logs.String(), "jobq dlq purge") {
			return fmt.Errorf("JOB holds %d jobs, DLQ %d (%d bytes); want 3 each, and the full DLQ's way out logged; logs:\n%s", st.Stream.Messages, st.DLQ.Messages, st.DLQ.Bytes, logs)
		}
		return nil
	})
	// The ledger still takes records: a good job runs and is done.
	b.enqueue(t, "job.good", "good", "ok")
	b.waitState(t, "good", data.StateDone)
	// Room again: the jobs left in JOB are dead-lettered, none lost.
	if _, err := queue.PurgeDeadLetters(ctx, b.obj); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() error {
		if st := b.status(t); st.DLQ.Messages != 3 || st.Stream.Messages != 0 {
			return fmt.Errorf("after the purge: JOB holds %d jobs, DLQ %d; want 0 and 3", st.Stream.Messages, st.DLQ.Messages)
		}
		return nil
	})
}

// On a server that takes small messages (jobq serve --max-payload 1024:
// 65 KiB), the pool's lease stays under half of that: it was bounded at
// 256 KiB, as if every server took 1 MiB, and with long job IDs every
// lease write was refused and no job ran.
func TestLeaseFitsASmallMaxPayload(t *testing.T) {
	t.Parallel()
	srv := servertest.StartConfig(t, server.Config{MaxPayload: 1024 + 64<<10, Logger: servertest.Logger(t)})
	b := setupOn(t, srv, queue.Config{MaxPayload: 1024})
	c := newCounter()
	var ids []string
	for i := range 600 {
		id := fmt.Sprintf("order %03d ", i) + strings.Repeat("x", 290) // not plain: a longer key
		ids = append(ids, id)
		b.enqueue(t, "job.x", id, "p")
	}
	b.startPool(t, c.wrap(ok))
	b.waitDrained(t)
	for _, id := range ids {
		if got := c.get(id); got != 1 {
			t.Errorf("job %.12q… ran %d times, want 1", id, got)
		}
	}
}

// The sweep goes on past a job whose dead letter a full DLQ refuses: a
// smaller one after it that fits is moved. It stopped at the first, and
// left every exhausted job after it in JOB.
func TestSweepGoesOnPastAJobAFullDLQRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{DeadMaxBytes: 100 << 10, MaxDeliver: 1, AckWait: time.Second})
	logs := &servertest.LogBuffer{}
	p := queue.NewPool(b.obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		return handlers.Permanent(errors.New("broken for good"))
	}), zerolog.New(logs))
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopPool(t, p) })
	kib := func(n int) string { return strings.Repeat("x", n<<10) }
	waitDLQ := func(n uint64) {
		t.Helper()
		waitFor(t, 20*time.Second, func() error {
			if st := b.status(t); st.DLQ.Messages != n {
				return fmt.Errorf("DLQ holds %d dead letters, want %d", st.DLQ.Messages, n)
			}
			return nil
		})
	}
	b.enqueue(t, "job.bad", "a1", kib(40))
	waitDLQ(1)
	b.enqueue(t, "job.bad", "a2", kib(30))
	waitDLQ(2) // 70 of 100 KiB taken

	b.enqueue(t, "job.bad", "big", kib(65))   // never fits
	b.enqueue(t, "job.bad", "small", kib(35)) // fits once a2 is gone
	waitFor(t, 20*time.Second, func() error {
		if !strings.Contains(logs.String(), `"jobs":2,"message":"exhausted jobs left in JOB: DLQ is full`) {
			return fmt.Errorf("no sweep left both in JOB yet; logs:\n%s", logs)
		}
		return nil
	})
	if err := b.obj.Dead.DeleteMsg(ctx, 2); err != nil { // nats stream rmm DLQ 2
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() error {
		if st := b.status(t); st.DLQ.Messages != 2 || st.Stream.Messages != 1 {
			return fmt.Errorf("JOB holds %d jobs, DLQ %d; want the small one moved, the big one left", st.Stream.Messages, st.DLQ.Messages)
		}
		return nil
	})
	if _, err := queue.DeadLetterOf(ctx, b.obj, "small"); err != nil {
		t.Errorf("dead letter of the small job: %v", err)
	}
}

// A job that failed for good while DLQ had no room for its dead letter
// runs once: its record says that it awaits its dead letter, and it is
// dead-lettered without running again, once there is room: by a later
// delivery, or by the sweep once its deliveries ran out. It ran again on
// every delivery.
func TestFullDLQDoesNotRunAFailedJobAgain(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		maxDeliver int
		wantErr    string
	}{
		{"by a delivery", 20, "broken for good"},
		{"by the sweep", 2, "deliveries exhausted (max deliver 2): broken for good"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, queue.Config{DeadMaxBytes: 100 << 10, MaxDeliver: tt.maxDeliver, AckWait: time.Second, RetryBackoff: []time.Duration{300 * time.Millisecond}})
			c := newCounter()
			b.startPool(t, c.wrap(func(context.Context, *data.Job) error {
				return handlers.Permanent(errors.New("broken for good"))
			}))
			payload := strings.Repeat("x", 60<<10)
			b.enqueue(t, "job.bad", "first", payload) // 60 of DLQ's 100 KiB
			waitFor(t, 20*time.Second, func() error {
				if st := b.status(t); st.DLQ.Messages != 1 {
					return fmt.Errorf("DLQ holds %d dead letters, want the first", st.DLQ.Messages)
				}
				return nil
			})
			b.enqueue(t, "job.bad", "victim", payload) // no room for its dead letter
			rec := b.waitState(t, "victim", data.StateRetrying)
			if !strings.HasPrefix(rec.LastError, data.AwaitingDeadLetter) || !strings.HasSuffix(rec.LastError, "broken for good") {
				t.Errorf("victim's record says %q; want it awaiting its dead letter, with its error", rec.LastError)
			}
			time.Sleep(2 * time.Second) // redeliveries, while DLQ is full
			if _, err := queue.PurgeDeadLetters(ctx, b.obj); err != nil {
				t.Fatal(err)
			}
			if d := b.waitState(t, "victim", data.StateFailed); d.LastError != tt.wantErr {
				t.Errorf("victim's failed record says %q, want %q", d.LastError, tt.wantErr)
			}
			dl, err := queue.DeadLetterOf(ctx, b.obj, "victim")
			if err != nil {
				t.Fatal(err)
			}
			if dl.Error != tt.wantErr || dl.Attempts != 1 {
				t.Errorf("victim's dead letter: error %q after %d attempts; want %q after 1", dl.Error, dl.Attempts, tt.wantErr)
			}
			if n := c.get("victim"); n != 1 {
				t.Errorf("the job that failed for good ran %d times; want 1", n)
			}
			waitFor(t, 20*time.Second, func() error {
				if st := b.status(t); st.Stream.Messages != 0 {
					return fmt.Errorf("JOB holds %d jobs; want none", st.Stream.Messages)
				}
				return nil
			})
		})
	}
}

// A pool of a client (jobq next), which knows the store's split only from
// the streams, makes a deleted DLQ anew with its cap: an eighth of the
// store, a sixth of JOB's. It made it uncapped, free to take the ledger's
// room until jobq serve started again.
func TestDLQMadeAnewByAClientKeepsItsCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const store = 8 << 20
	b := setup(t, queue.Config{MaxBytes: store * 3 / 4, DeadMaxBytes: store / 8, MaxDeliver: 1})
	if err := b.js.DeleteStream(ctx, queue.StreamDLQ); err != nil {
		t.Fatal(err)
	}
	obj, err := queue.Open(ctx, b.js)
	if err != nil {
		t.Fatal(err)
	}
	p := queue.NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		return handlers.Permanent(errors.New("broken"))
	}), servertest.Logger(t))
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopPool(t, p) })
	b.enqueue(t, "job.bad", "bad", "x")
	b.waitState(t, "bad", data.StateFailed)
	waitFor(t, 20*time.Second, func() error {
		s, err := b.js.Stream(ctx, queue.StreamDLQ)
		if err != nil {
			return err
		}
		if got := s.CachedInfo().Config.MaxBytes; got != store/8 {
			return fmt.Errorf("DLQ made anew with max bytes %d, want %d", got, store/8)
		}
		return nil
	})
}
