package queue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
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

// remakeJobs deletes JOB, as nats stream rm JOB does, and provisions it
// again: its sequences start over at 1.
func remakeJobs(t *testing.T, b *testBundle, cfg queue.Config) *testBundle {
	t.Helper()
	if err := b.js.DeleteStream(context.Background(), queue.StreamJob); err != nil {
		t.Fatal(err)
	}
	return setupOn(t, b.srv, cfg)
}

// A job published without a Nats-Msg-Id is known by its stream sequence
// (seq-<n>). Once JOB is made anew its sequences start over, and a new job
// at a sequence whose earlier job is recorded done is another job: it
// runs. It was acked unrun, lost, taken for the earlier job done. The pool
// runs on through JOB's making anew, and learns of it from the record.
func TestJobWithoutIDOfAJobStreamMadeAnewRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{})
	var mu sync.Mutex
	var seen []string
	b.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s=%s", job.ID, job.Payload))
		return nil
	}))
	if _, err := b.js.Publish(ctx, "job.a", []byte("first")); err != nil { // no Nats-Msg-Id
		t.Fatal(err)
	}
	b.waitState(t, data.SeqID(1), data.StateDone)
	b.waitDrained(t)

	b2 := remakeJobs(t, b, queue.Config{})
	ack, err := b2.js.Publish(ctx, "job.a", []byte("second"))
	if err != nil {
		t.Fatal(err)
	}
	if ack.Sequence != 1 {
		t.Fatalf("the new job is stored at seq %d, want 1", ack.Sequence)
	}
	waitFor(t, 20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if want := "[seq-1=first seq-1=second]"; fmt.Sprint(seen) != want {
			return fmt.Errorf("handler ran %v, want %s", seen, want)
		}
		return nil
	})
	b2.waitDrained(t)
	rec := b2.waitState(t, data.SeqID(1), data.StateDone)
	if !rec.FirstAt.After(b2.obj.Jobs.CachedInfo().Created) {
		t.Errorf("the record of seq-1 is still the earlier job's: first at %v, JOB made at %v", rec.FirstAt, b2.obj.Jobs.CachedInfo().Created)
	}
}

// The same, for a job of the new JOB whose deliveries ran out with no
// pool running: the sweep dead-letters it. It was removed from JOB with no
// dead letter, taken for the earlier job done.
func TestExhaustedJobWithoutIDOfAJobStreamMadeAnewIsDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{})
	p := b.startPool(t, handlers.HandlerFunc(ok))
	if _, err := b.js.Publish(ctx, "job.a", []byte("first")); err != nil {
		t.Fatal(err)
	}
	b.waitState(t, data.SeqID(1), data.StateDone)
	b.waitDrained(t)
	stopPool(t, p)

	b2 := remakeJobs(t, b, queue.Config{MaxDeliver: 1, AckWait: time.Second})
	if _, err := b2.js.Publish(ctx, "job.a", []byte("second")); err != nil {
		t.Fatal(err)
	}
	exhaust(t, b2, 1)
	b2.startPool(t, handlers.HandlerFunc(ok))
	waitFor(t, 20*time.Second, func() error {
		d, err := queue.DeadLetterOf(ctx, b2.obj, data.SeqID(1))
		if err != nil {
			return err
		}
		if string(d.Payload) != "second" {
			return fmt.Errorf("dead letter of seq-1 holds %q, want the new job's", d.Payload)
		}
		return nil
	})
	b2.waitDrained(t)
	// Recorded failed over the earlier job's done record, which was left:
	// jobq job seq-1 said a dead-lettered job was done.
	rec, err := queue.LookUp(ctx, b2.obj, data.SeqID(1))
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != data.StateFailed {
		t.Errorf("jobq job seq-1 of a dead-lettered job: state %s (first_at %v, JOB made at %v), want failed", rec.State, rec.FirstAt, b2.obj.Jobs.CachedInfo().Created)
	}
}

// JOB refuses, from any client, a job whose dead letter the server could
// not carry: one that filled the server's limit was stored, and once it
// failed for good DLQ refused it every time, leaving it in JOB. The
// largest job JOB takes reaches DLQ whole.
func TestJOBKeepsRoomForTheDeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 1})
	limit := int(b.nc.MaxPayload())
	_, err := b.js.Publish(ctx, "job.big", make([]byte, limit-64)) // a plain client, no producer checks
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamMessageExceedsMaximum {
		t.Fatalf("a job of %d bytes on a server that carries %d: got %v, want JOB to refuse it as too large", limit-64, limit, err)
	}
	largest := int(b.obj.Jobs.CachedInfo().Config.MaxMsgSize)
	if _, err := b.js.Publish(ctx, "job.big", make([]byte, largest)); err != nil {
		t.Fatalf("the largest job JOB takes, %d bytes: %v", largest, err)
	}
	b.startFailing(t)
	waitFor(t, 20*time.Second, func() error {
		d, err := queue.DeadLetterOf(ctx, b.obj, data.SeqID(1)) // the refused job took no sequence
		if err != nil {
			return err
		}
		if len(d.Payload) != largest {
			return fmt.Errorf("dead letter holds %d bytes, want %d", len(d.Payload), largest)
		}
		return nil
	})
	b.waitDrained(t)
	// Its re-drive adds headers, which JOB has no room for: said so.
	d, err := queue.FindDeadLetter(ctx, b.obj, data.SeqID(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queue.RetryDeadLetter(ctx, b.obj, d); err == nil || !strings.Contains(err.Error(), "raise the server's max_payload") {
		t.Errorf("re-drive of a dead letter that fills JOB's limit: got %v, want it refused with what to do", err)
	}
}

// A job stored before JOB kept that room may still fill the server's
// limit. Its dead letter is refused; it stays in JOB, named in the log
// with what to do, and the sweep goes on to the exhausted jobs after it,
// which it used to leave in JOB too.
func TestSweepGoesOnPastAJobTooLargeForDLQ(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 1, AckWait: time.Second})
	b.editJobs(t, func(c *jetstream.StreamConfig) { c.MaxMsgSize = -1 }) // as JOB was
	limit := int(b.nc.MaxPayload())
	if _, err := b.js.Publish(ctx, "job.big", make([]byte, limit-64)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.Publish(ctx, "job.small", []byte("small")); err != nil {
		t.Fatal(err)
	}
	exhaust(t, b, 2)
	logs := &servertest.LogBuffer{}
	p := queue.NewPool(b.obj, handlers.HandlerFunc(ok), zerolog.New(logs))
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopPool(t, p) })
	waitFor(t, 20*time.Second, func() error {
		_, err := queue.DeadLetterOf(ctx, b.obj, data.SeqID(2))
		return err
	})
	waitFor(t, 20*time.Second, func() error {
		if !strings.Contains(logs.String(), "nats stream rmm JOB 1") {
			return fmt.Errorf("no log line names the big job's way out; logs:\n%s", logs)
		}
		return nil
	})
	// The sweep deletes the small job from JOB once its dead letter is
	// stored.
	waitFor(t, 20*time.Second, func() error {
		if st := b.status(t); st.Stream.Messages != 1 {
			return fmt.Errorf("JOB holds %d jobs, want the big one alone", st.Stream.Messages)
		}
		return nil
	})
	if _, err := b.obj.Jobs.GetMsg(ctx, 1); err != nil {
		t.Errorf("the big job is not in JOB: %v", err)
	}
}

// exhaust takes n jobs from WORKER without acking them and waits out the
// ack wait: with MaxDeliver 1 their deliveries ran out, as when the pool
// that took them died.
func exhaust(t *testing.T, b *testBundle, n int) {
	t.Helper()
	msgs, err := b.obj.Worker.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for range msgs.Messages() {
		got++
	}
	if got != n {
		t.Fatalf("fetched %d jobs, want %d", got, n)
	}
	time.Sleep(b.cfg.AckWait + 200*time.Millisecond)
	b.waitAckPending(t, 0)
}

func stopPool(t *testing.T, p *queue.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Errorf("stop pool: %v", err)
	}
}

// A seq-1 job of a JOB made anew that claims over the record of the
// earlier JOB's seq-1 (here failed) keeps none of its times: its own done
// record is not older than JOB. Delivered again once done (WORKER deleted
// while it ran, so its ack went nowhere), it is acked unrun. Its claim
// carried the earlier record's first time over, and its own done record
// was taken for another job's: it ran twice.
func TestDoneJobOfAJobStreamMadeAnewRunsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 1})
	p := b.startFailing(t)
	if _, err := b.js.Publish(ctx, "job.a", []byte("first")); err != nil { // no Nats-Msg-Id
		t.Fatal(err)
	}
	b.waitState(t, data.SeqID(1), data.StateFailed)
	b.waitDrained(t)
	stopPool(t, p)

	b2 := remakeJobs(t, b, queue.Config{AckWait: 3 * time.Second, FetchWait: time.Second})
	c := newCounter()
	started, release := make(chan struct{}, 4), make(chan struct{})
	b2.startPool(t, c.wrap(func(ctx context.Context, job *data.Job) error {
		if c.get(job.ID) == 1 {
			started <- struct{}{}
			<-release
		}
		return nil
	}))
	if _, err := b2.js.Publish(ctx, "job.a", []byte("second")); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := b2.js.DeleteConsumer(ctx, queue.StreamJob, queue.ConsumerWorker); err != nil {
		t.Fatal(err)
	}
	close(release)                                        // done, recorded; its ack goes nowhere
	rec := b2.waitState(t, data.SeqID(1), data.StateDone) // the first run's
	// The pool makes WORKER anew, which delivers the job again: acked,
	// JOB drains.
	waitFor(t, 20*time.Second, func() error {
		_, err := b2.js.Consumer(ctx, queue.StreamJob, queue.ConsumerWorker)
		return err
	})
	b2.waitDrained(t)
	time.Sleep(2 * time.Second)
	if n := c.get(data.SeqID(1)); n != 1 {
		t.Errorf("the new JOB's seq-1 ran %d times, want 1; its first done record's first_at %v (carried over from the earlier JOB's job) is before JOB's creation %v",
			n, rec.FirstAt, b2.obj.Jobs.CachedInfo().Created)
	}
}

// The largest job jobq's producer stores leaves room in JOB's limit for
// its re-drive, which adds Jobq-Job-Id and a longer Nats-Msg-Id
// (jobq-retry-<seq>-<nanos>). Filling JOB's limit, it could never be
// re-driven.
func TestLargestJobOfTheProducerCanBeRedriven(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 1})
	b.startFailing(t)
	// The largest payload the producer takes under ID "big".
	size := int(b.obj.Jobs.CachedInfo().Config.MaxMsgSize)
	for {
		_, err := b.prod.Enqueue(ctx, "job.big", make([]byte, size), queue.EnqueueOptions{ID: "big"})
		if err == nil {
			break
		}
		if !errors.Is(err, queue.ErrPayloadTooLarge) {
			t.Fatalf("enqueue %d bytes: %v", size, err)
		}
		size--
	}
	t.Logf("largest payload enqueued: %d bytes; JOB's MaxMsgSize %d, server max payload %d", size, b.obj.Jobs.CachedInfo().Config.MaxMsgSize, b.nc.MaxPayload())
	b.redriveFailed(t, "big")
}

// The same on a server whose max_payload is above jobq's --max-payload +
// 64 KiB (a NATS server of its own, --server): JOB's limit is below the
// server's, and the producer keeps its re-drive's room against JOB's. It
// kept it against the server's, so it stored a job that filled JOB's
// limit, which once dead-lettered could never be re-driven.
func TestLargestJobOfTheProducerOnABiggerServerCanBeRedriven(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupOn(t, servertest.StartConfig(t, server.Config{MaxPayload: 4 << 20, Logger: servertest.Logger(t)}), queue.Config{MaxDeliver: 1})
	b.startFailing(t)
	payload := make([]byte, b.cfg.MaxPayload) // the largest payload the producer takes
	// The longest header that the producer takes with it: JOB's limit.
	lo, hi := 0, 65000
	for lo < hi {
		mid := (lo + hi + 1) / 2
		_, err := b.prod.Enqueue(ctx, "job.probe", payload, queue.EnqueueOptions{ID: "probe", Header: map[string][]string{"X-Pad": {strings.Repeat("p", mid)}}})
		if err == nil {
			lo = mid
		} else {
			hi = mid - 1
		}
		// each probe that lands is a job of its own (dedupe: stored once)
	}
	t.Logf("largest header value the producer stored: %d bytes; JOB's MaxMsgSize %d, server max payload %d", lo, b.obj.Jobs.CachedInfo().Config.MaxMsgSize, b.nc.MaxPayload())
	if _, err := b.prod.Enqueue(ctx, "job.big", payload, queue.EnqueueOptions{ID: "big", Header: map[string][]string{"X-Pad": {strings.Repeat("p", lo)}}}); err != nil {
		t.Fatal(err)
	}
	b.redriveFailed(t, "big")
}

// JOB is made anew while the pool holds a job of the earlier JOB (seq-2)
// that has not started yet: one worker, busy with seq-1. That job's
// records keep when it was stored (before JOB was made anew), so the new
// JOB's seq-2 tells them from its own, and runs. They went by when the job
// first ran, after JOB was made anew, and the new seq-2 was acked unrun.
func TestJobOfAJobStreamMadeAnewRunsAfterAnEarlierJobStartedLate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{Workers: 1})
	var mu sync.Mutex
	var seen []string
	started, release := make(chan struct{}, 8), make(chan struct{})
	b.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s=%s", job.ID, job.Payload))
		mu.Unlock()
		if string(job.Payload) == "a1" {
			started <- struct{}{}
			<-release
		}
		return nil
	}))
	for _, p := range []string{"a1", "a2"} { // no Nats-Msg-Id: seq-1, seq-2
		if _, err := b.js.Publish(ctx, "job.a", []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	<-started
	b.waitAckPending(t, 2) // a2 is in the pool, waiting for the worker

	b2 := remakeJobs(t, b, queue.Config{Workers: 1})
	for _, p := range []string{"b1", "b2"} { // the new JOB's seq-1, seq-2
		if _, err := b2.js.Publish(ctx, "job.a", []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	close(release)
	b2.waitDrained(t)
	time.Sleep(time.Second)
	mu.Lock()
	defer mu.Unlock()
	got := append([]string(nil), seen...)
	sort.Strings(got)
	if want := "[seq-1=a1 seq-1=b1 seq-2=a2 seq-2=b2]"; fmt.Sprint(got) != want {
		rec := b2.record(t, data.SeqID(2))
		t.Errorf("handler ran %v, want %s; the record of seq-2 is %s with first_at %v, JOB made at %v", got, want, rec.State, rec.FirstAt, b2.obj.Jobs.CachedInfo().Created)
	}
}

// A job without a Nats-Msg-Id (seq-1) of JOB is dead-lettered. JOB is made
// anew, and its own seq-1 runs and is done. The operator then re-drives the
// earlier JOB's dead letter (DLQ outlives JOB): it must run, or stay in
// DLQ. It runs, under an ID of its own (its re-drive's Nats-Msg-Id). Known
// by the ID seq-1, it was taken for the new JOB's done seq-1 and acked
// unrun, its dead letter removed: lost.
func TestRedriveOfAnEarlierJobStreamsDeadLetterRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := &failsFirst{}
	b2 := deadLetterThenRemake(t, h)
	b2.startPool(t, h)
	if _, err := b2.js.Publish(ctx, "job.a", []byte("second")); err != nil { // the new JOB's seq-1
		t.Fatal(err)
	}
	b2.waitState(t, data.SeqID(1), data.StateDone)
	b2.waitDrained(t)

	d, err := queue.DeadLetterOf(ctx, b2.obj, data.SeqID(1))
	if err != nil {
		t.Fatal(err)
	}
	if string(d.Payload) != "first" {
		t.Fatalf("dead letter holds %q", d.Payload)
	}
	r, err := queue.RetryDeadLetter(ctx, b2.obj, d)
	if err != nil {
		t.Fatal(err)
	}
	runsAs := "jobq-retry-1-" + strconv.FormatInt(d.FailedAt.UnixNano(), 10)
	if r.ID != runsAs {
		t.Errorf("re-drive runs under %q, says RetryDeadLetter; want %q", r.ID, runsAs)
	}
	b2.waitDrained(t)
	time.Sleep(time.Second)
	seen := h.ran()
	if want := "[seq-1=first seq-1=second " + runsAs + "=first]"; fmt.Sprint(seen) != want {
		_, derr := queue.DeadLetterOf(ctx, b2.obj, data.SeqID(1))
		t.Errorf("handler ran %v, want %s: the re-driven job of the earlier JOB, under an ID of its own (dead letter lookup: %v)", seen, want, derr)
	}
}

// The other way round: the new JOB's seq-1 waits in JOB (no pool runs)
// when the earlier JOB's dead letter seq-1 is re-driven. Both must run.
func TestNewJobRunsBesideARedriveOfAnEarlierJobStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := &failsFirst{}
	b2 := deadLetterThenRemake(t, h)
	if _, err := b2.js.Publish(ctx, "job.a", []byte("second")); err != nil { // the new JOB's seq-1, waiting
		t.Fatal(err)
	}
	d, err := queue.DeadLetterOf(ctx, b2.obj, data.SeqID(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queue.RetryDeadLetter(ctx, b2.obj, d); err != nil {
		t.Fatal(err)
	}
	b2.startPool(t, h)
	waitFor(t, 20*time.Second, func() error {
		st := b2.status(t)
		if st.Stream.Messages != 0 || st.Consumer.AckPending != 0 {
			return fmt.Errorf("JOB holds %d", st.Stream.Messages)
		}
		return nil
	})
	time.Sleep(time.Second)
	seen := h.ran()
	got := map[string]int{}
	for _, s := range seen[1:] {
		_, payload, _ := strings.Cut(s, "=")
		got[payload]++
	}
	if got["first"] != 1 || got["second"] != 1 {
		t.Errorf("after JOB made anew, handler ran %v, want the re-drive (first) and the new job (second) once each", seen[1:])
	}
}

// The earlier JOB's seq-1 was dead-lettered and re-driven under seq-1 (JOB
// not made anew yet); its copy, at JOB seq 2, runs on a live claim when
// JOB is made anew. The new JOB's seq-1, at seq 1, meets that claim: it
// waits for it to end, and runs. Taken for a duplicate of the running
// job (a claim at another sequence), it was acked unrun.
func TestNewJobBesideALiveRedriveOfAnEarlierJobStreamRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 1, AckWait: 3 * time.Second})
	var mu sync.Mutex
	var seen []string
	started, release := make(chan struct{}, 4), make(chan struct{})
	b.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s@%d=%s", job.ID, job.Seq, job.Payload))
		n := len(seen)
		mu.Unlock()
		if string(job.Payload) == "first" {
			if n == 1 {
				return handlers.Permanent(errors.New("cannot do it yet"))
			}
			started <- struct{}{} // the re-driven copy: runs long
			<-release
		}
		return nil
	}))
	if _, err := b.js.Publish(ctx, "job.a", []byte("first")); err != nil { // no Nats-Msg-Id: seq-1
		t.Fatal(err)
	}
	b.waitState(t, data.SeqID(1), data.StateFailed)
	d, err := queue.DeadLetterOf(ctx, b.obj, data.SeqID(1))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := queue.RetryDeadLetter(ctx, b.obj, d); err != nil || r.ID != data.SeqID(1) { // JOB not made anew: under seq-1
		t.Fatalf("re-drive: %v, under the ID %q; want it under seq-1", err, r.ID)
	}
	<-started // the copy, at JOB seq 2, holds a live claim on seq-1

	b2 := remakeJobs(t, b, queue.Config{AckWait: 3 * time.Second})
	if _, err := b2.js.Publish(ctx, "job.a", []byte("second")); err != nil { // the new JOB's seq-1
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	close(release)
	waitFor(t, 20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range seen {
			if s == "seq-1@1=second" {
				return nil
			}
		}
		st := b2.status(t)
		return fmt.Errorf("handler ran %v; the new JOB's seq-1 (second) never ran; JOB holds %d jobs, %d ack pending", seen, st.Stream.Messages, st.Consumer.AckPending)
	})
}

// jobq job seq-1 after JOB was made anew, its new seq-1 waiting in JOB (no
// pool runs): no record, rather than the earlier JOB's seq-1's, done, for
// a job that never ran.
func TestLookUpOfANewJobIgnoresAnEarlierJobStreamsRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{})
	p := b.startPool(t, handlers.HandlerFunc(ok))
	if _, err := b.js.Publish(ctx, "job.a", []byte("first")); err != nil {
		t.Fatal(err)
	}
	b.waitState(t, data.SeqID(1), data.StateDone)
	b.waitDrained(t)
	stopPool(t, p)

	b2 := remakeJobs(t, b, queue.Config{})
	if _, err := b2.js.Publish(ctx, "job.a", []byte("second")); err != nil { // pending, never run
		t.Fatal(err)
	}
	rec, err := queue.LookUp(ctx, b2.obj, data.SeqID(1))
	if !errors.Is(err, data.ErrNotFound) {
		t.Errorf("jobq job seq-1 of a job waiting in the new JOB: state %s, first at %v (JOB made at %v), err %v; want no record (pending)",
			rec.State, rec.FirstAt, b2.obj.Jobs.CachedInfo().Created, err)
	}
}

// startFailing starts a pool on b whose handler fails every job for good.
func (b *testBundle) startFailing(t *testing.T) *queue.Pool {
	t.Helper()
	return b.startPool(t, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		return handlers.Permanent(errors.New("cannot do it"))
	}))
}

// redriveFailed waits for job id to be dead-lettered and re-drives it,
// which must work.
func (b *testBundle) redriveFailed(t *testing.T, id string) {
	t.Helper()
	b.waitState(t, id, data.StateFailed)
	d, err := queue.FindDeadLetter(context.Background(), b.obj, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queue.RetryDeadLetter(context.Background(), b.obj, d); err != nil {
		t.Errorf("re-drive of job %s, which jobq's producer stored and DLQ holds: %v", id, err)
	}
}

// failsFirst records the jobs it runs (ID=payload), and fails the first it
// runs, with the payload "first", for good.
type failsFirst struct {
	mu   sync.Mutex
	seen []string
}

func (h *failsFirst) Process(_ context.Context, job *data.Job) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, fmt.Sprintf("%s=%s", job.ID, job.Payload))
	if string(job.Payload) == "first" && len(h.seen) == 1 {
		return handlers.Permanent(errors.New("cannot do it yet"))
	}
	return nil
}

func (h *failsFirst) ran() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seen)
}

// deadLetterThenRemake has h's pool dead-letter a job published without
// an ID (seq-1, "first"), then makes JOB anew, with no pool running.
func deadLetterThenRemake(t *testing.T, h *failsFirst) *testBundle {
	t.Helper()
	b := setup(t, queue.Config{MaxDeliver: 1})
	p := b.startPool(t, h)
	if _, err := b.js.Publish(context.Background(), "job.a", []byte("first")); err != nil { // no Nats-Msg-Id
		t.Fatal(err)
	}
	b.waitState(t, data.SeqID(1), data.StateFailed)
	b.waitDrained(t)
	stopPool(t, p)
	return remakeJobs(t, b, queue.Config{MaxDeliver: 1})
}

// A re-drive under an ID of its own (JOB made anew) is stored at the new
// JOB's seq 1, its dead letter's job's own sequence. The record written
// for it before it is published must not make it look like a dead-lettered
// copy of itself when the re-driving client's clock (dlq retry --server,
// from another machine) is ahead of the server's, which stamps the
// re-drive: the record kept the dead letter's sequence, and the re-drive,
// acked unrun with its dead letter removed, was lost.
func TestRedriveUnderItsOwnIDIsNotTakenForADeadLetteredCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b2 := deadLetterThenRemake(t, &failsFirst{})
	d, err := queue.DeadLetterOf(ctx, b2.obj, data.SeqID(1))
	if err != nil {
		t.Fatal(err)
	}
	redriveWithClientAhead(t, b2, d, "jobq-retry-"+strconv.FormatUint(d.Seq, 10)+"-"+strconv.FormatInt(d.FailedAt.UnixNano(), 10))
}

// redriveWithClientAhead re-drives d, which must land at its job's own
// sequence under the ID want, and claims the re-drive as a pool would, as
// stored by a server whose clock is 50ms behind the re-driving client's:
// the re-drive must run.
func redriveWithClientAhead(t *testing.T, b *testBundle, d queue.DeadLetter, want string) {
	t.Helper()
	ctx := context.Background()
	r, err := queue.RetryDeadLetter(ctx, b.obj, d)
	if err != nil {
		t.Fatal(err)
	}
	if r.Sequence != d.JobSeq || r.ID != want {
		t.Fatalf("re-drive %s at seq %d, dead letter's job %s at seq %d: want it under %s at the same sequence", r.ID, r.Sequence, d.ID, d.JobSeq, want)
	}
	l := data.NewLedger(b.obj.Ledger, time.Minute, nil)
	rec, err := l.Get(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	job := &data.Job{ID: r.ID, Subject: d.Subject, Seq: r.Sequence, Attempt: 1, EnqueuedAt: rec.FirstAt.Add(-50 * time.Millisecond)}
	if _, err := l.Claim(ctx, job, "w1"); err != nil {
		t.Errorf("claim of the re-drive: %v; want it claimed, to run (its record: %+v)", err, rec)
	}
}

// The same for a job with an ID of its own (not seq-N), which re-drives
// under that ID: if its record is gone (expired after --processed-ttl, 7d,
// while DLQ keeps the dead letter; or its Fail write failed), KeepRecord
// writes one with the dead letter's JOB sequence and FirstAt from the
// re-driving client's clock. In a JOB made anew, the re-drive is stored at
// that same sequence, and with the client's clock ahead of the server's it
// was taken for a dead-lettered copy of itself: acked unrun, its dead
// letter already removed. Lost.
func TestRedriveOfANamedJobWhoseRecordExpiredIsNotTakenForADeadLetteredCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b2 := expiredDeadLetterThenRemake(t, "welcome-bob")
	d, err := queue.DeadLetterOf(ctx, b2.obj, "welcome-bob")
	if err != nil {
		t.Fatal(err)
	}
	redriveWithClientAhead(t, b2, d, "welcome-bob")
}

// JOB never made anew, but a dead letter's times say it was: written by a
// jobq that kept no stored time in its Nats-Msg-Id (dlq-<seq>), with a
// Jobq-Failed-At from a worker whose clock is behind the server's. Its
// job's copy is still in JOB (its removal lost) and its record is gone.
// JOB still holding the very job tells that it was not made anew: the
// record written for the re-drive keeps the copy's sequence, and the copy,
// delivered again, is told dead-lettered and acked unrun. Taken for made
// anew, the record kept no sequence, and the copy ran beside the re-drive.
func TestRedriveOfAnOldDeadLetterWhoseCopyIsInJOBRunsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 3})
	created := b.obj.Jobs.CachedInfo().Created
	ack := b.enqueue(t, "job.a", "J", "payload") // the copy whose removal was lost
	m := nats.NewMsg(queue.SubjectDLQPrefix + "job.a")
	m.Data = []byte("payload")
	m.Header.Set(queue.HeaderJobID, "J")
	m.Header.Set(queue.HeaderSubject, "job.a")
	m.Header.Set(queue.HeaderSeq, strconv.FormatUint(ack.Sequence, 10))
	m.Header.Set(queue.HeaderAttempts, "1")
	m.Header.Set(queue.HeaderError, "cannot do it")
	m.Header.Set(queue.HeaderFailedAt, created.Add(-2*time.Second).UTC().Format(time.RFC3339Nano))
	m.Header.Set(nats.MsgIdHdr, "dlq-"+strconv.FormatUint(ack.Sequence, 10))
	if _, err := b.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	d, err := queue.DeadLetterOf(ctx, b.obj, "J")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queue.RetryDeadLetter(ctx, b.obj, d); err != nil {
		t.Fatal(err)
	}
	if rec := b.record(t, "J"); rec.Seq != ack.Sequence {
		t.Errorf("record written for the re-drive of J: seq %d, want %d, its dead-lettered copy's", rec.Seq, ack.Sequence)
	}
	var mu sync.Mutex
	var ran []uint64
	b.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		mu.Lock()
		ran = append(ran, job.Seq)
		mu.Unlock()
		return handlers.Permanent(errors.New("cannot do it"))
	}))
	b.waitDrained(t)
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 1 {
		t.Errorf("J ran at JOB seqs %v for one re-drive; want once, the re-drive's (the copy at seq %d is dead-lettered); DLQ holds %d", ran, ack.Sequence, b.status(t).DLQ.Messages)
	}
}

// A named job's dead letter of a JOB since made anew,
// its record gone (expired after --processed-ttl, or purged), whose new
// JOB holds at the dead letter's JobSeq a new copy of the job under the
// same ID (the same NDJSON file imported again into the new JOB, pending
// when the dead letter is re-driven): jobStreamAnewSince takes that new
// copy for the dead letter's very job by its ID alone, unless it compares
// the stored times too: the record written before the re-drive kept the
// sequence, and the new copy, never dead-lettered (nor run), was told
// "dead-lettered already" and acked unrun, ending neither done nor in DLQ.
func TestRedriveDoesNotTakeANewJOBsCopyForItsDeadLetteredJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b2 := expiredDeadLetterThenRemake(t, "A")
	if ack := b2.enqueue(t, "job.a", "A", "second"); ack.Sequence != 1 {
		t.Fatalf("the new copy of A is stored at seq %d, want 1", ack.Sequence)
	}
	d, err := queue.DeadLetterOf(ctx, b2.obj, "A")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queue.RetryDeadLetter(ctx, b2.obj, d); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ran []string
	b2.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, fmt.Sprintf("seq %d=%s", job.Seq, job.Payload))
		return nil
	}))
	// Both copies of A need a claim. On a loaded machine the re-drive may
	// meet the new copy's live claim, and wait for its lease to end (up to
	// two thirds of the ack wait) before it runs.
	waitFor(t, time.Minute, func() error {
		if st := b2.status(t); st.Stream.Messages != 0 || st.Consumer.AckPending != 0 {
			return fmt.Errorf("JOB holds %d jobs, %d ack pending; want 0 and 0", st.Stream.Messages, st.Consumer.AckPending)
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(ran) == 0 || ran[0] != "seq 1=second" {
		t.Errorf("A ran %v; want the new JOB's copy (seq 1, \"second\") run first, never dead-lettered; DLQ holds %d", ran, b2.status(t).DLQ.Messages)
	}
}

// expiredDeadLetterThenRemake dead-letters job id (payload "first", JOB
// seq 1), purges its record as its TTL would while DLQ keeps the dead
// letter, then makes JOB anew, with no pool running.
func expiredDeadLetterThenRemake(t *testing.T, id string) *testBundle {
	t.Helper()
	b := setup(t, queue.Config{MaxDeliver: 1})
	p := b.startFailing(t)
	b.enqueue(t, "job.a", id, "first") // JOB seq 1
	b.waitState(t, id, data.StateFailed)
	b.waitDrained(t)
	stopPool(t, p)
	if err := b.obj.Ledger.Purge(context.Background(), data.Key(id)); err != nil {
		t.Fatal(err)
	}
	return remakeJobs(t, b, queue.Config{MaxDeliver: 1})
}

// A job published again under its ID into a JOB made anew, at the sequence
// of its earlier copy, is not taken for that copy: the earlier copy failed
// for good, its dead letter refused by a full DLQ, and its record (awaiting
// its dead letter) was taken for the new copy's, which was dead-lettered
// with the earlier copy's error, never run. So it was whether the earlier
// copy was running when the new one was stored, or still waited in the
// pool for a worker: its record named any copy stored before its attempt
// began. Records now keep when their copy was stored, for every job.
func TestEarlierJOBsAwaitingRecordIsNotTheNewCopys(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		workers int
		// earlier stores jobs in the first JOB, the earlier copy of X
		// among them, one of which holds a worker; fill stores jobs in
		// the new JOB ahead of X's new copy, so that it lands at the
		// earlier copy's sequence, seq.
		earlier, fill []string
		seq           uint64
	}{
		{"while it ran", 0, []string{"X=old-held"}, nil, 1},
		{"before it started", 1, []string{"L=held", "X=old"}, []string{"F=fill"}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cfg := queue.Config{Workers: tt.workers, DeadMaxBytes: 100 << 10, MaxDeliver: 5, AckWait: 3 * time.Second, RetryBackoff: []time.Duration{200 * time.Millisecond}}
			b := setup(t, cfg)
			var mu sync.Mutex
			var ran []string
			started, release := make(chan struct{}, 4), make(chan struct{})
			b.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
				tag, _, _ := strings.Cut(string(job.Payload), ":")
				mu.Lock()
				ran = append(ran, fmt.Sprintf("%s@%d=%s", job.ID, job.Seq, tag))
				mu.Unlock()
				if strings.HasSuffix(tag, "held") {
					started <- struct{}{}
					<-release
				}
				if strings.HasPrefix(tag, "old") {
					return handlers.Permanent(errors.New("old copy broken for good"))
				}
				return nil
			}))
			// DLQ, 100 KiB, has no room for the old copy's dead letter.
			if _, err := b.js.Publish(ctx, queue.SubjectDLQPrefix+"job.fill", []byte(strings.Repeat("f", 60<<10))); err != nil {
				t.Fatal(err)
			}
			for _, j := range tt.earlier {
				id, tag, _ := strings.Cut(j, "=")
				b.enqueue(t, "job.x", id, tag+":"+strings.Repeat("x", 60<<10))
			}
			<-started
			b.waitAckPending(t, len(tt.earlier))
			b2 := remakeJobs(t, b, cfg)
			for _, j := range tt.fill {
				id, tag, _ := strings.Cut(j, "=")
				b2.enqueue(t, "job.f", id, tag)
			}
			if ack := b2.enqueue(t, "job.x", "X", "new"); ack.Sequence != tt.seq {
				t.Fatalf("new copy stored at seq %d, want %d", ack.Sequence, tt.seq)
			}
			time.Sleep(300 * time.Millisecond)
			close(release) // the old copy fails for good, once it ran
			b2.waitState(t, "X", data.StateDone)
			mu.Lock()
			defer mu.Unlock()
			if want := fmt.Sprintf("X@%d=new", tt.seq); !slices.Contains(ran, want) {
				t.Errorf("the new JOB's copy of X never ran (the handler ran %v)", ran)
			}
		})
	}
}

// heldElsewhere has another worker take n jobs of b's JOB and stop before
// it acks them: they stay ack pending until the ack wait. It returns their
// IDs. It may run on a goroutine of its own.
func heldElsewhere(t *testing.T, b *testBundle, n int) string {
	t.Helper()
	batch, err := b.obj.Worker.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Error(err)
		return ""
	}
	var held []string
	for m := range batch.Messages() {
		held = append(held, m.Headers().Get(nats.MsgIdHdr))
	}
	return fmt.Sprint(held)
}

// remakeWithB1HeldElsewhere makes JOB anew, stores b1 at its seq 1, and
// has another worker hold it (see heldElsewhere).
func remakeWithB1HeldElsewhere(t *testing.T, b *testBundle, cfg queue.Config) *testBundle {
	t.Helper()
	b2 := remakeJobs(t, b, cfg)
	b2.enqueue(t, "job.a", "b1", "x")
	if held := heldElsewhere(t, b2, 1); held != "[b1]" {
		t.Fatalf("the other worker holds %v, want [b1]", held)
	}
	return b2
}

// heldRun is a handler that holds each job it runs until release is
// closed; started and returned tell when it took and let go of one.
type heldRun struct{ started, release, returned chan struct{} }

func newHeldRun() *heldRun {
	return &heldRun{started: make(chan struct{}, 8), release: make(chan struct{}), returned: make(chan struct{}, 8)}
}

func (h *heldRun) Process(context.Context, *data.Job) error {
	h.started <- struct{}{}
	<-h.release
	h.returned <- struct{}{}
	return nil
}

// nextHeld runs jobq next (queue.Next) on obj with a heldRun, and returns
// once its job started: the run, and where Next's error comes.
func nextHeld(t *testing.T, obj *queue.Objects) (*heldRun, <-chan error) {
	t.Helper()
	h := newHeldRun()
	done := make(chan error, 1)
	go func() {
		_, err := queue.Next(context.Background(), obj, h, 5*time.Second, servertest.Logger(t))
		done <- err
	}()
	<-h.started
	return h, done
}

// keptHeld fails t unless JOB still holds n jobs, all ack pending: no
// earlier JOB's ack took them from the worker that holds them.
func keptHeld(t *testing.T, b *testBundle, n int) {
	t.Helper()
	time.Sleep(500 * time.Millisecond) // for the earlier JOB's acks, had they been sent
	if st := b.status(t); st.Stream.Messages != uint64(n) || st.Consumer.AckPending != n {
		t.Errorf("JOB holds %d jobs, %d of them ack pending; want %d and %d: the earlier JOB's acks took the new jobs", st.Stream.Messages, st.Consumer.AckPending, n, n)
	}
}

// A pool holds jobs of JOB when JOB is deleted and made anew, and new jobs
// are stored at their sequences. The server matches an ack by its stream
// sequence alone, so the earlier jobs' acks, sent once their handlers
// return, would take the new jobs at those sequences from another worker
// that holds them, and from JOB: lost, should that worker stop before it
// acks. The pool sends the earlier JOB's jobs no ack, Nak or heartbeat once
// it knows JOB was deleted.
func TestEarlierJOBsJobsDoNotAckTheNewJOBsJobs(t *testing.T) {
	for _, noLedger := range []bool{false, true} {
		t.Run(fmt.Sprintf("no ledger %v", noLedger), func(t *testing.T) {
			t.Parallel()
			cfg := queue.Config{Workers: 1, Prefetch: 1, NoLedger: noLedger}
			b := setup(t, cfg)
			started, release := make(chan string, 8), make(chan struct{})
			returned := make(chan string, 8)
			b.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
				started <- job.ID
				if job.ID == "a1" {
					<-release
				}
				returned <- job.ID
				return nil
			}))
			b.enqueue(t, "job.a", "a1", "x") // seq 1
			b.enqueue(t, "job.a", "a2", "x") // seq 2: held, waiting for the worker
			if id := <-started; id != "a1" {
				t.Fatalf("the worker started %s first, want a1", id)
			}
			b.waitAckPending(t, 2)

			b2 := remakeJobs(t, b, cfg)
			b2.enqueue(t, "job.a", "b1", "x") // the new JOB's seq 1
			b2.enqueue(t, "job.a", "b2", "x") // and seq 2
			if held := heldElsewhere(t, b2, 2); held != "[b1 b2]" {
				t.Fatalf("the other worker holds %v, want [b1 b2]", held)
			}
			close(release)
			for _, want := range []string{"a1", "a2"} {
				select {
				case id := <-returned:
					if id != want {
						t.Fatalf("handler returned for %s, want %s", id, want)
					}
				case <-time.After(20 * time.Second):
					t.Fatalf("handler did not return for %s", want)
				}
			}
			if !noLedger {
				b2.waitState(t, "a2", data.StateDone)
			}
			keptHeld(t, b2, 2)
		})
	}
}

// The same when the server's advisory of JOB's deletion does not go out,
// as it may not while other workers' pulls wait (the deleted stream's loop
// ends before it sends it): the pool learns of it from its own pull's end
// (409 Consumer Deleted), or by looking JOB up.
func TestEarlierJOBsJobsDoNotAckTheNewJOBsJobsWithoutTheAdvisory(t *testing.T) {
	for i := range 10 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			cfg := queue.Config{Workers: 1, Prefetch: 1, NoLedger: true}
			// The other worker's pull must wait ahead of the pool's next
			// one for b1; under load the pool's may come first, and take
			// b1 itself. That set-up is let go, and another made.
			for try := 1; ; try++ {
				b := setup(t, cfg)
				h := newHeldRun()
				b.startPool(t, h)
				b.enqueue(t, "job.a", "a1", "x") // seq 1
				<-h.started
				// 20 idle workers elsewhere, each with a pull waiting.
				nc := servertest.Connect(t, b.srv)
				inbox := nc.NewInbox()
				if _, err := nc.SubscribeSync(inbox); err != nil {
					t.Fatal(err)
				}
				for range 20 {
					if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.JOB.WORKER", inbox, []byte(`{"batch":1,"expires":30000000000}`)); err != nil {
						t.Fatal(err)
					}
				}
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)

				b2 := remakeJobs(t, b, cfg)
				held := make(chan string, 1)
				go func() { held <- heldElsewhere(t, b2, 1) }()
				time.Sleep(50 * time.Millisecond)
				b2.enqueue(t, "job.a", "b1", "x") // the new JOB's seq 1
				got := <-held
				close(h.release)
				if got != "[b1]" {
					if try == 3 {
						t.Fatalf("the other worker holds %v, want [b1] (3 tries)", got)
					}
					continue
				}
				<-h.returned
				keptHeld(t, b2, 1)
				return
			}
		})
	}
}

// jobq next runs a job of JOB while JOB is deleted and made anew: its ack
// must not take the new JOB's job at its sequence either.
func TestNextDoesNotAckTheNewJOBsJob(t *testing.T) {
	for _, noLedger := range []bool{false, true} {
		t.Run(fmt.Sprintf("no ledger %v", noLedger), func(t *testing.T) {
			t.Parallel()
			cfg := queue.Config{NoLedger: noLedger}
			b := setup(t, cfg)
			b.enqueue(t, "job.a", "a1", "x") // seq 1
			h, done := nextHeld(t, b.obj)
			b2 := remakeWithB1HeldElsewhere(t, b, cfg)
			close(h.release)
			if err := <-done; err != nil {
				t.Logf("next: %v", err)
			}
			keptHeld(t, b2, 1)
		})
	}
}
