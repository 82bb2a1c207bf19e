package queue_test

// Objects changed by an operator (nats CLI, another client) between runs of
// jobq: provisioning at the next start must either bring them back into
// shape or refuse with a clear error; never run on under a configuration
// in which stored jobs are lost, never run, or run with the wrong input.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// reprovision provisions b again, as jobq does when it starts again after
// an operator changed its objects, which puts them back in shape.
func (b *testBundle) reprovision(t *testing.T) {
	t.Helper()
	obj, err := queue.Provision(context.Background(), b.js, b.cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("provision again: %v", err)
	}
	b.obj = obj
}

// payloads records the payload each job ran with.
type payloads struct {
	mu   sync.Mutex
	seen map[string][]string
}

func (p *payloads) handler() handlers.Handler {
	return handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.seen[job.ID] = append(p.seen[job.ID], string(job.Payload))
		return nil
	})
}

func (p *payloads) get(id string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen[id]...)
}

// An operator turned on headers-only delivery on WORKER (nats consumer edit
// JOB WORKER --headers-only). Started again, jobq must not run jobs without
// their payload and record them done.
func TestHeadersOnlyWorkerDoesNotRunJobsWithoutPayload(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	b.editWorker(t, func(c *jetstream.ConsumerConfig) { c.HeadersOnly = true })
	b.reprovision(t)
	p := &payloads{seen: map[string][]string{}}
	b.startPool(t, p.handler())
	b.enqueue(t, "job.pay", "pay-1", `{"amount":1500}`)
	b.waitState(t, "pay-1", data.StateDone)
	if got := p.get("pay-1"); len(got) != 1 || got[0] != `{"amount":1500}` {
		t.Errorf("job pay-1 ran with payloads %q, recorded done; want one run with {\"amount\":1500}", got)
	}
}

// An operator narrowed WORKER to one subject (nats consumer edit JOB WORKER
// --filter job.a.>). Started again, jobq must run every job under job.>, or
// refuse to start.
func TestFilteredWorkerStillRunsEveryJob(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: 2 * time.Second})
	b.editWorker(t, func(c *jetstream.ConsumerConfig) { c.FilterSubject = "job.a.>" })
	b.reprovision(t)
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	b.enqueue(t, "job.b.x", "b-1", "x")
	b.enqueue(t, "job.a.x", "a-1", "x")
	b.waitState(t, "a-1", data.StateDone)
	waitFor(t, 15*time.Second, func() error {
		rec, err := data.NewLedger(b.obj.Ledger, time.Minute, nil).Get(context.Background(), "b-1")
		if err != nil {
			return fmt.Errorf("job b-1: %w (never ran: JOB holds %d jobs)", err, b.status(t).Stream.Messages)
		}
		if rec.State != data.StateDone || c.get("b-1") != 1 {
			return fmt.Errorf("job b-1: state %s after %d runs, last error %q; want done after 1 run", rec.State, c.get("b-1"), rec.LastError)
		}
		return nil
	})
}

// An operator set limits on JOB that make the server delete stored jobs
// (nats stream edit JOB --max-age 1s, --max-msgs-per-subject 1). Started
// again, jobq must not keep them: every stored job must still run.
func TestJobStreamLimitsThatDeleteJobsAreNotKept(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  queue.Config
		edit func(*jetstream.StreamConfig)
	}{
		// The dedupe window may not be longer than the max age.
		{"max age", queue.Config{DedupeWindow: time.Second}, func(c *jetstream.StreamConfig) { c.MaxAge = time.Second }},
		{"max msgs per subject", queue.Config{}, func(c *jetstream.StreamConfig) { c.MaxMsgsPerSubject = 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.cfg)
			b.editJobs(t, tt.edit)
			b.reprovision(t)
			// Two jobs wait for workers (a backlog), longer than a second.
			b.enqueue(t, "job.mail", "mail-1", "x")
			b.enqueue(t, "job.mail", "mail-2", "y")
			time.Sleep(2 * time.Second)
			c := newCounter()
			b.startPool(t, c.wrap(ok))
			for _, id := range []string{"mail-1", "mail-2"} {
				waitFor(t, 10*time.Second, func() error {
					if c.get(id) != 1 {
						return fmt.Errorf("job %s, stored with its ack, ran %d times (JOB holds %d jobs); want 1",
							id, c.get(id), b.status(t).Stream.Messages)
					}
					return nil
				})
			}
		})
	}
}

// An operator capped DLQ's message size (nats stream edit DLQ
// --max-msg-size 512). Started again, jobq must not keep that: every dead
// letter larger was refused, and a job that failed for good ran again on
// each delivery and never left JOB.
func TestDeadLetterSizeCapIsNotKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 2, AckWait: time.Second})
	s, err := b.js.Stream(ctx, queue.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	c := s.CachedInfo().Config
	c.MaxMsgSize = 512
	if _, err := b.js.UpdateStream(ctx, c); err != nil {
		t.Fatal(err)
	}
	b.reprovision(t)
	var runs atomic.Int32
	b.startPool(t, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		runs.Add(1)
		return handlers.Permanent(errors.New("broken"))
	}))
	b.enqueue(t, "job.d", "big", strings.Repeat("x", 1024))
	waitFor(t, 10*time.Second, func() error {
		if st := b.status(t); st.DLQ.Messages != 1 || st.Stream.Messages != 0 {
			return fmt.Errorf("JOB holds %d jobs, DLQ %d, after %d runs of a job that failed for good; want it dead-lettered", st.Stream.Messages, st.DLQ.Messages, runs.Load())
		}
		return nil
	})
	if n := runs.Load(); n != 1 {
		t.Errorf("the job ran %d times; want 1", n)
	}
}

// An operator let the ledger drop its oldest records when full (nats
// stream edit KV_processed --discard old --max-msgs 2). Started again,
// jobq must not keep that: a done job's record must live its TTL.
func TestLedgerThatDropsOldRecordsIsNotKept(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{DedupeWindow: time.Second})
	b.editLedger(t, func(c *jetstream.StreamConfig, _ jetstream.StreamState) {
		c.Discard, c.MaxMsgs = jetstream.DiscardOld, 3
	})
	b.reprovision(t)
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	for i := range 5 {
		id := fmt.Sprintf("drop-%d", i)
		b.enqueue(t, "job.d", id, "x")
		b.waitState(t, id, data.StateDone)
	}
	b.republishAfterWindow(t, "job.d", "drop-0", "x")
	b.waitDrained(t)
	c.wantOnce(t, "drop-0")
}

// An operator turned off JOB's publish acks (nats stream edit JOB
// --no-ack). Started again, an enqueue must be acknowledged, not fail
// with the job stored anyway.
func TestJobStreamWithoutAcksIsNotKept(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	b.editJobs(t, func(c *jetstream.StreamConfig) { c.NoAck = true })
	b.reprovision(t)
	prod := queue.NewProducer(b.js, b.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := prod.Enqueue(ctx, "job.noack", []byte("x"), queue.EnqueueOptions{ID: "noack-1"})
	if err != nil {
		t.Errorf("enqueue failed: %v; JOB holds %d jobs", err, b.status(t).Stream.Messages)
	}
}

// An operator sealed JOB or DLQ, or made it deny deletes or persist
// asynchronously, none of which the server lets be undone. jobq refuses to
// start, saying which, rather than leave handled jobs stuck in JOB or
// dead letters in DLQ, or take answers to writes a crash can lose.
func TestProvisionRefusesStreamsItCannotWorkWith(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		stream string
		edit   func(*jetstream.StreamConfig)
		want   string
	}{
		{"JOB denies deletes", queue.StreamJob, func(c *jetstream.StreamConfig) { c.DenyDelete = true }, "stream JOB denies message deletes"},
		{"DLQ denies deletes", queue.StreamDLQ, func(c *jetstream.StreamConfig) { c.DenyDelete = true }, "stream DLQ denies message deletes"},
		{"JOB sealed", queue.StreamJob, func(c *jetstream.StreamConfig) { c.Sealed = true }, "stream JOB is sealed"},
		{"bucket sealed", "KV_" + queue.BucketProcessed, func(c *jetstream.StreamConfig) { c.Sealed = true }, "bucket processed is sealed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{})
			ctx := context.Background()
			s, err := b.js.Stream(ctx, tt.stream)
			if err != nil {
				t.Fatal(err)
			}
			cfg := s.CachedInfo().Config
			tt.edit(&cfg)
			if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			_, err = queue.Provision(ctx, b.js, b.cfg, servertest.Logger(t))
			if !errors.Is(err, queue.ErrConflict) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "nothing was changed") {
				t.Errorf("provision: got %v, want a conflict saying %q", err, tt.want)
			}
		})
	}
}

// An operator deleted WORKER while a pool runs (nats consumer rm JOB
// WORKER). The pool makes it anew, with jobq's settings, and goes on
// running jobs, rather than pull from nothing for good.
func TestPoolMakesADeletedWorkerAnew(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 5})
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	b.enqueue(t, "job.before", "before-1", "x")
	b.waitState(t, "before-1", data.StateDone)
	if err := b.js.DeleteConsumer(context.Background(), queue.StreamJob, queue.ConsumerWorker); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, "job.after", "after-1", "x")
	b.waitState(t, "after-1", data.StateDone)
	b.waitDrained(t)
	info, err := b.obj.Worker.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxDeliver != 5 {
		t.Errorf("WORKER made anew with max deliver %d, want 5", info.Config.MaxDeliver)
	}
	c.wantOnce(t, "before-1")
	c.wantOnce(t, "after-1")
}

// An operator turned off direct gets on the ledger (nats stream edit
// KV_processed --no-allow-direct) while a pool runs a job on its lease. A
// pool started then would claim each job rather than lease it, and could
// run a copy of that job (a re-drive, a republish after the dedupe window)
// beside it: it refuses to start, naming the lease, until the leased jobs
// ended.
func TestClaimingPoolWaitsForTheLeasesOfOthers(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: 3 * time.Second})
	c := newCounter()
	h, started, release := c.held(1)
	b.startPool(t, h)
	b.enqueue(t, "job.long", "long-1", "x")
	<-started
	b.editLedger(t, func(c *jetstream.StreamConfig, _ jetstream.StreamState) { c.AllowDirect = false })

	// A jobq started now binds the bucket as it is.
	obj, err := b.obj.Bind(context.Background(), b.js)
	if err != nil {
		t.Fatal(err)
	}
	claiming := queue.NewPool(obj, c.wrap(ok), servertest.Logger(t))
	err = claiming.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "leases jobs on bucket processed") {
		t.Fatalf("a claiming pool beside a leased job: Start gave %v, want a refusal naming the lease", err)
	}
	close(release)
	fresh := &testBundle{js: b.js, obj: obj, cfg: b.cfg}
	fresh.waitState(t, "long-1", data.StateDone)
	waitFor(t, 10*time.Second, func() error { return claiming.Start(context.Background()) })
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		claiming.Stop(ctx)
	})
	c.wantOnce(t, "long-1")
}

// An operator deleted DLQ (nats stream rm DLQ) while a pool runs. The next
// dead letter finds no stream: the pool creates DLQ again with jobq's
// settings, as it does WORKER, rather than leave every failed job in JOB,
// for the sweep to fail on again and again until jobq is restarted.
func TestPoolMakesADeletedDLQAnew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 1, AckWait: 3 * time.Second})
	b.startPool(t, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		return handlers.Permanent(errors.New("broken"))
	}))
	if err := b.js.DeleteStream(ctx, queue.StreamDLQ); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, "job.d", "dl-1", "x")
	b.waitState(t, "dl-1", data.StateFailed)
	b.waitDrained(t)
	letters, err := queue.ListDeadLetters(ctx, b.obj, 0)
	if err != nil || len(letters) != 1 || letters[0].ID != "dl-1" {
		t.Fatalf("dead letters: got %+v, %v; want dl-1's", letters, err)
	}
	s, err := b.js.Stream(ctx, queue.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; !slices.Equal(c.Subjects, []string{queue.SubjectDLQPrefix + ">"}) || c.Discard != jetstream.DiscardNew || c.Storage != jetstream.FileStorage {
		t.Errorf("DLQ made anew with %+v, want jobq's settings", c)
	}
}
