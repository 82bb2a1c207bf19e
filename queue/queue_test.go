package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server"
	"github.com/jobq/jobq/server/servertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats-server keeps process-wide goroutines once JetStream started.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*jsAccount).updateUsage"),
		goleak.IgnoreTopFunction("time.Sleep"),
	)
}

// testBundle is one embedded server with jobq provisioned on it.
type testBundle struct {
	srv  *server.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	obj  *queue.Objects
	prod *queue.Producer
	cfg  queue.Config
}

func setup(t *testing.T, cfg queue.Config) *testBundle {
	t.Helper()
	return setupOn(t, servertest.Start(t), cfg)
}

func setupOn(t *testing.T, srv *server.Server, cfg queue.Config) *testBundle {
	t.Helper()
	if cfg.RetryBackoff == nil {
		cfg.RetryBackoff = []time.Duration{10 * time.Millisecond}
	}
	if cfg.FetchWait == 0 {
		cfg.FetchWait = 200 * time.Millisecond
	}
	nc := servertest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	obj, err := queue.Provision(context.Background(), js, cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	return &testBundle{srv: srv, nc: nc, js: js, obj: obj, prod: queue.NewProducer(js, cfg), cfg: obj.Config}
}

// startPool starts a pool over h, stopped (with a generous timeout) by
// t.Cleanup unless the test stops it first.
func (b *testBundle) startPool(t *testing.T, h handlers.Handler) *queue.Pool {
	t.Helper()
	p := queue.NewPool(b.obj, h, servertest.Logger(t))
	if err := p.Start(context.Background()); err != nil {
		t.Fatalf("start pool: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Stop(ctx); err != nil {
			t.Errorf("stop pool: %v", err)
		}
	})
	return p
}

func (b *testBundle) enqueue(t *testing.T, subject, id string, payload string) *jetstream.PubAck {
	t.Helper()
	ack, err := b.prod.Enqueue(context.Background(), subject, []byte(payload), queue.EnqueueOptions{ID: id})
	if err != nil {
		t.Fatalf("enqueue %s: %v", id, err)
	}
	return ack
}

func (b *testBundle) record(t *testing.T, id string) data.Record {
	t.Helper()
	rec, err := data.NewLedger(b.obj.Ledger, time.Minute, nil).Get(context.Background(), id)
	if err != nil {
		t.Fatalf("ledger record %s: %v", id, err)
	}
	return rec
}

func (b *testBundle) status(t *testing.T) queue.Status {
	t.Helper()
	st, err := queue.ReadStatus(context.Background(), b.obj)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	return st
}

// waitFor polls f until it returns nil or the deadline passes.
func waitFor(t *testing.T, limit time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *testBundle) waitState(t *testing.T, id string, want data.State) data.Record {
	t.Helper()
	var rec data.Record
	waitFor(t, 20*time.Second, func() error {
		var err error
		rec, err = data.NewLedger(b.obj.Ledger, time.Minute, nil).Get(context.Background(), id)
		if err != nil {
			return err
		}
		if rec.State != want {
			return fmt.Errorf("job %s: got state %s, want %s", id, rec.State, want)
		}
		return nil
	})
	return rec
}

// waitAckPending waits until WORKER has n jobs delivered and not acked.
func (b *testBundle) waitAckPending(t *testing.T, n int) {
	t.Helper()
	waitFor(t, 20*time.Second, func() error {
		if got := b.status(t).Consumer.AckPending; got != n {
			return fmt.Errorf("WORKER has %d jobs ack pending, want %d", got, n)
		}
		return nil
	})
}

// editJobs changes JOB's configuration in place, as nats stream edit does.
func (b *testBundle) editJobs(t *testing.T, edit func(*jetstream.StreamConfig)) {
	t.Helper()
	info, err := b.obj.Jobs.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	edit(&cfg)
	if _, err := b.js.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatalf("edit %s: %v", queue.StreamJob, err)
	}
}

// editLedger changes the ledger bucket's stream configuration in place,
// given the stream's state.
func (b *testBundle) editLedger(t *testing.T, edit func(*jetstream.StreamConfig, jetstream.StreamState)) {
	t.Helper()
	st, err := b.js.Stream(context.Background(), "KV_"+queue.BucketProcessed)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	edit(&cfg, st.CachedInfo().State)
	if _, err := b.js.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatalf("edit %s: %v", "KV_"+queue.BucketProcessed, err)
	}
}

// editWorker changes WORKER's configuration in place, as nats consumer edit
// does.
func (b *testBundle) editWorker(t *testing.T, edit func(*jetstream.ConsumerConfig)) {
	t.Helper()
	info, err := b.obj.Worker.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	edit(&cfg)
	if _, err := b.js.UpdateConsumer(context.Background(), queue.StreamJob, cfg); err != nil {
		t.Fatalf("edit %s: %v", queue.ConsumerWorker, err)
	}
}

// wantRunOnce starts a pool whose jobs take 300ms, waits until JOB is
// drained and checks that job id ran once, never beside itself.
func (b *testBundle) wantRunOnce(t *testing.T, id string) {
	t.Helper()
	c := newCounter()
	b.startPool(t, c.wrap(func(ctx context.Context, job *data.Job) error {
		time.Sleep(300 * time.Millisecond)
		return nil
	}))
	b.waitDrained(t)
	c.wantOnce(t, id)
}

// countPulls counts the pull requests sent to WORKER from now on.
func (b *testBundle) countPulls(t *testing.T) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	sub, err := b.nc.Subscribe("$JS.API.CONSUMER.MSG.NEXT."+queue.StreamJob+"."+queue.ConsumerWorker, func(*nats.Msg) { n.Add(1) })
	if err == nil {
		err = b.nc.Flush()
	}
	if err != nil {
		t.Fatalf("watch pulls: %v", err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return &n
}

func (b *testBundle) waitDrained(t *testing.T) {
	t.Helper()
	// Generous: on a loaded machine thousands of jobs, some released for a
	// second at a time, take a while; only a job that never leaves fails.
	waitFor(t, time.Minute, func() error {
		st := b.status(t)
		if st.Stream.Messages != 0 || st.Consumer.AckPending != 0 {
			return fmt.Errorf("JOB holds %d jobs, %d ack pending; want 0 and 0", st.Stream.Messages, st.Consumer.AckPending)
		}
		return nil
	})
}

// counter counts handler runs per job ID and the most that ran at once.
type counter struct {
	mu      sync.Mutex
	runs    map[string]int
	running map[string]int
	overlap int
}

func newCounter() *counter { return &counter{runs: map[string]int{}, running: map[string]int{}} }

func (c *counter) wrap(h handlers.HandlerFunc) handlers.Handler {
	return handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		c.mu.Lock()
		c.runs[job.ID]++
		c.running[job.ID]++
		if c.running[job.ID] > 1 {
			c.overlap++
		}
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			c.running[job.ID]--
			c.mu.Unlock()
		}()
		return h(ctx, job)
	})
}

// held wraps a handler that holds every job until release is closed (or
// its context ends), and says on started when each starts; started has
// room for n.
func (c *counter) held(n int) (h handlers.Handler, started chan struct{}, release chan struct{}) {
	started, release = make(chan struct{}, n), make(chan struct{})
	h = c.wrap(func(ctx context.Context, job *data.Job) error {
		started <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	return h, started, release
}

func (c *counter) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[id]
}

// wantOnce fails t unless job id ran exactly once and never beside itself.
func (c *counter) wantOnce(t *testing.T, id string) {
	t.Helper()
	if got := c.get(id); got != 1 || c.overlap != 0 {
		t.Errorf("job %s ran %d times, %d overlapping; want 1 and 0", id, got, c.overlap)
	}
}

// republishAfterWindow enqueues id again once the dedupe window no longer
// drops it, so that JOB stores a second copy.
func (b *testBundle) republishAfterWindow(t *testing.T, subject, id, payload string) {
	t.Helper()
	waitFor(t, 10*time.Second, func() error {
		if ack := b.enqueue(t, subject, id, payload); ack.Duplicate {
			return errors.New("still inside the dedupe window")
		}
		return nil
	})
}

// publishCopy stores a copy of job jobID under its own Nats-Msg-Id, as a
// re-drive from DLQ does.
func (b *testBundle) publishCopy(t *testing.T, subject, msgID, jobID string) {
	t.Helper()
	b.publishCopyOf(t, subject, msgID, jobID, nil)
}

// publishCopyOf is publishCopy with a payload.
func (b *testBundle) publishCopyOf(t *testing.T, subject, msgID, jobID string, payload []byte) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = payload
	m.Header.Set(nats.MsgIdHdr, msgID)
	m.Header.Set(queue.HeaderJobID, jobID)
	if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatalf("publish copy of %s: %v", jobID, err)
	}
}

// waitOnlyRunningLeft waits until JOB holds one job: the copies of a
// running job were acked as duplicates.
func (b *testBundle) waitOnlyRunningLeft(t *testing.T) {
	t.Helper()
	waitFor(t, 20*time.Second, func() error {
		if st := b.status(t); st.Stream.Messages != 1 {
			return fmt.Errorf("JOB holds %d jobs, want the running one only", st.Stream.Messages)
		}
		return nil
	})
}

func ok(context.Context, *data.Job) error { return nil }

func TestPoolRunsEveryJobOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{Workers: 8})
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	const n = 300
	for i := range n {
		b.enqueue(t, "job.batch", fmt.Sprintf("job-%d", i), "x")
	}
	b.waitDrained(t)
	for i := range n {
		id := fmt.Sprintf("job-%d", i)
		if got := c.get(id); got != 1 {
			t.Errorf("job %s ran %d times, want 1", id, got)
		}
		if rec := b.record(t, id); rec.State != data.StateDone || rec.Attempts != 1 {
			t.Errorf("job %s: got state %s attempts %d, want done 1", id, rec.State, rec.Attempts)
		}
	}
	if st := b.status(t); st.Ledger.Records != n {
		t.Errorf("ledger holds %d records, want %d", st.Ledger.Records, n)
	}
}

func TestEnqueueDedupe(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	first := b.enqueue(t, "job.email", "welcome-1", "a")
	second := b.enqueue(t, "job.email", "welcome-1", "a")
	if first.Duplicate || !second.Duplicate || first.Sequence != second.Sequence {
		t.Errorf("got acks %+v and %+v, want the second a duplicate of the first", first, second)
	}
	if st := b.status(t); st.Stream.Messages != 1 {
		t.Errorf("JOB holds %d jobs, want 1", st.Stream.Messages)
	}
	noID := b.enqueue(t, "job.email", "", "a")
	noID2 := b.enqueue(t, "job.email", "", "a")
	if noID.Duplicate || noID2.Duplicate || noID.Sequence == noID2.Sequence {
		t.Errorf("jobs without an ID: got %+v and %+v, want two distinct jobs", noID, noID2)
	}
}

func TestEnqueueRefusesBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxPayload: 16})
	tests := []struct {
		name, subject, id, payload string
		want                       error
	}{
		{name: "outside job", subject: "foo.bar"},
		{name: "empty subject", subject: ""},
		{name: "bare job", subject: "job"},
		{name: "wildcard", subject: "job.*"},
		{name: "too large", subject: "job.x", payload: "0123456789abcdefg", want: queue.ErrPayloadTooLarge},
		{name: "newline in id", subject: "job.x", id: "a\nb", want: queue.ErrBadID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.prod.Enqueue(context.Background(), tt.subject, []byte(tt.payload), queue.EnqueueOptions{ID: tt.id})
			if err == nil {
				t.Fatalf("got no error, want one")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
	if st := b.status(t); st.Stream.Messages != 0 {
		t.Errorf("JOB holds %d jobs, want 0", st.Stream.Messages)
	}
}

// IDs of the form seq-N name jobs published without an ID, and a
// Jobq-Job-Id header names the job it is on: both are refused for jobs
// that bring their own, which could otherwise take such a job's record and
// be acked unrun.
func TestEnqueueRefusesIDsOfOtherJobs(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		opts queue.EnqueueOptions
		want error
	}{
		{"seq id", queue.EnqueueOptions{ID: "seq-1"}, queue.ErrBadID},
		{"job id header", queue.EnqueueOptions{Header: nats.Header{queue.HeaderJobID: {"seq-1"}}}, queue.ErrBadHeader},
		{"jobq header in lower case", queue.EnqueueOptions{ID: "ok-1", Header: nats.Header{"jobq-attempts": {"1"}}}, queue.ErrBadHeader},
		// Nats- headers tell the server how to store the job: a TTL would
		// expire it unrun.
		{"nats ttl header", queue.EnqueueOptions{ID: "ok-2", Header: nats.Header{"Nats-TTL": {"1s"}}}, queue.ErrBadHeader},
		{"nats expected stream header", queue.EnqueueOptions{ID: "ok-3", Header: nats.Header{"nats-expected-stream": {"FOO"}}}, queue.ErrBadHeader},
	} {
		if _, err := b.prod.Enqueue(ctx, "job.x", []byte("x"), tt.opts); !errors.Is(err, tt.want) {
			t.Errorf("%s: got %v, want %v", tt.name, err, tt.want)
		}
	}
	if st := b.status(t); st.Stream.Messages != 0 {
		t.Errorf("%d jobs stored, want none", st.Stream.Messages)
	}
}

func TestOddIDsAreProcessed(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	long := make([]byte, 1024)
	for i := range long {
		long[i] = 'a' + byte(i%26)
	}
	ids := []string{"with space", "a/b/c", "star*", "gt>", "dots.in.id", "ünïcødé ✓", "=looks-encoded", string(long), "seq-1x", "seq-"}
	for _, id := range ids {
		b.enqueue(t, "job.odd", id, id)
	}
	b.waitDrained(t)
	for _, id := range ids {
		if got := c.get(id); got != 1 {
			t.Errorf("job %q ran %d times, want 1", id, got)
		}
		if rec := b.record(t, id); rec.State != data.StateDone || rec.ID != id {
			t.Errorf("job %q: got record %+v, want done with its ID", id, rec)
		}
	}
}

// A job may carry headers that a server's status message carries, and no
// payload: it is still a job, and so are the jobs after it in the pull.
func TestJobsWithStatusHeadersAreProcessed(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	var ids []string
	for _, code := range []string{"100", "404", "408", "409", "503"} {
		id := "status-" + code
		h := nats.Header{"Status": {code}, "Description": {"from a user"}}
		if _, err := b.prod.Enqueue(context.Background(), "job.odd", nil, queue.EnqueueOptions{ID: id, Header: h}); err != nil {
			t.Fatalf("enqueue %s: %v", id, err)
		}
		ids = append(ids, id)
		for i := range 3 {
			ids = append(ids, fmt.Sprintf("after-%s-%d", code, i))
			b.enqueue(t, "job.odd", ids[len(ids)-1], "x")
		}
	}
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	b.waitDrained(t)
	for _, id := range ids {
		c.wantOnce(t, id)
	}
}

func TestDoneMeansDoneAfterDedupeWindow(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cfg  queue.Config
	}{
		// The republished job finds the record in the batched read, with
		// a window shorter or longer than AckWait.
		{"short window", queue.Config{DedupeWindow: time.Second}},
		{"long window", queue.Config{DedupeWindow: 2 * time.Second, AckWait: time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testDoneMeansDoneAfterDedupeWindow(t, tt.cfg)
		})
	}
}

func testDoneMeansDoneAfterDedupeWindow(t *testing.T, cfg queue.Config) {
	b := setup(t, cfg)
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	b.enqueue(t, "job.pay", "pay-1", "x")
	b.waitState(t, "pay-1", data.StateDone)
	b.waitDrained(t)
	// Once the window passed, the stream stores the same ID again.
	b.republishAfterWindow(t, "job.pay", "pay-1", "x")
	b.waitDrained(t)
	if got := c.get("pay-1"); got != 1 {
		t.Errorf("job ran %d times, want 1: a recorded completion must hold after the dedupe window", got)
	}
}

func TestHeartbeatKeepsLongJob(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	c := newCounter()
	slow := c.wrap(func(ctx context.Context, job *data.Job) error {
		select {
		case <-time.After(3500 * time.Millisecond): // 3.5 ack waits
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	// Two pools, as two processes would be: a redelivery would reach the other.
	b.startPool(t, slow)
	b.startPool(t, slow)
	b.enqueue(t, "job.long", "long-1", "x")
	rec := b.waitState(t, "long-1", data.StateDone)
	if got := c.get("long-1"); got != 1 || rec.Attempts != 1 {
		t.Errorf("job ran %d times with %d attempts recorded, want 1 and 1", got, rec.Attempts)
	}
	if st := b.status(t); st.Consumer.Redelivered != 0 {
		t.Errorf("consumer counts %d redelivered, want 0", st.Consumer.Redelivered)
	}
}

// jobq next keeps a long job as a pool does: while its handler runs past
// the ack wait, the job is not redelivered to a pool, whose check would
// find jobq next's lease ended and run the job beside it.
func TestNextKeepsLongJob(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: time.Second})
	c := newCounter()
	b.enqueue(t, "job.long", "next-long-1", "x")
	started := make(chan struct{})
	ran := make(chan error, 1)
	go func() {
		_, err := queue.Next(context.Background(), b.obj, c.wrap(func(ctx context.Context, job *data.Job) error {
			close(started)
			select {
			case <-time.After(3500 * time.Millisecond): // 3.5 ack waits
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}), 5*time.Second, servertest.Logger(t))
		ran <- err
	}()
	<-started
	b.startPool(t, c.wrap(func(context.Context, *data.Job) error { return nil }))
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	rec := b.waitState(t, "next-long-1", data.StateDone)
	if got := c.get("next-long-1"); got != 1 || rec.Attempts != 1 {
		t.Errorf("job ran %d times with %d attempts recorded, want 1 and 1: a pool ran it while jobq next did", got, rec.Attempts)
	}
	if st := b.status(t); st.Consumer.Redelivered != 0 {
		t.Errorf("consumer counts %d redelivered, want 0", st.Consumer.Redelivered)
	}
}

func TestSameJobNeverRunsTwiceAtOnce(t *testing.T) {
	t.Parallel()
	// Two pools, three stored copies of one job (re-drives, under
	// Jobq-Job-Id): while one runs, the others find it in a lease and wait;
	// then they find its record, and the job runs once.
	b := setup(t, queue.Config{Workers: 4, AckWait: time.Second})
	c := newCounter()
	h, started, release := c.held(3)
	b.startPool(t, h)
	b.startPool(t, h)
	// Three stored copies of one job: distinct messages, one job ID.
	for i := range 3 {
		b.publishCopy(t, "job.dup", fmt.Sprintf("copy-%d", i), "dup-1")
	}
	<-started
	time.Sleep(time.Second) // the copies come and wait, a few times
	close(release)
	b.waitDrained(t)
	c.wantOnce(t, "dup-1")
}

// A job published by a standard NATS client with a Nats-Expected-* header
// (accepted by JOB when it was stored) must still reach DLQ when it fails
// permanently: every stored job ends done, or in DLQ with its last error.
// The dead letter leaves out the Nats- headers, which DLQ would refuse
// (Nats-Expected-Stream: JOB) or act on (a Nats-TTL would expire it).
func TestDeadLetterOfAJobWithNatsHeaders(t *testing.T) {
	t.Parallel()
	for _, hdr := range [][2]string{
		{"Nats-Expected-Stream", queue.StreamJob},
		{"Nats-Expected-Last-Subject-Sequence", "0"},
	} {
		t.Run(hdr[0], func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{MaxDeliver: 3})
			m := nats.NewMsg("job.pay")
			m.Data = []byte("x")
			m.Header.Set(nats.MsgIdHdr, "poison-1")
			m.Header.Set(hdr[0], hdr[1])
			if _, err := b.js.PublishMsg(context.Background(), m); err != nil {
				t.Fatalf("publish like nats pub -H %s:%s: %v", hdr[0], hdr[1], err)
			}
			b.startPool(t, handlers.HandlerFunc(func(context.Context, *data.Job) error {
				return handlers.Permanent(errors.New("bad account"))
			}))
			deadline := time.Now().Add(8 * time.Second)
			for {
				st := b.status(t)
				if st.DLQ.Messages == 1 && st.Stream.Messages == 0 {
					return
				}
				if time.Now().After(deadline) {
					rec, _ := data.NewLedger(b.obj.Ledger, time.Minute, nil).Get(context.Background(), "poison-1")
					t.Fatalf("after 8s: JOB holds %d, DLQ holds %d (want 0 and 1); ledger record %+v", st.Stream.Messages, st.DLQ.Messages, rec)
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

func TestFailedJobsRetryThenDeadLetter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		handler   handlers.HandlerFunc
		wantRuns  int
		wantError string
	}{
		{name: "error", handler: func(context.Context, *data.Job) error { return errors.New("smtp down") }, wantRuns: 3, wantError: "smtp down"},
		{name: "permanent", handler: func(context.Context, *data.Job) error { return handlers.Permanent(errors.New("bad address")) }, wantRuns: 1, wantError: "bad address"},
		{name: "panic", handler: func(context.Context, *data.Job) error { panic("nil map") }, wantRuns: 3, wantError: "handler panic: nil map"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{MaxDeliver: 3})
			c := newCounter()
			b.startPool(t, c.wrap(tt.handler))
			b.enqueue(t, "job.mail", "mail-1", "hello")
			rec := b.waitState(t, "mail-1", data.StateFailed)
			b.waitDrained(t)
			if got := c.get("mail-1"); got != tt.wantRuns || rec.Attempts != tt.wantRuns {
				t.Errorf("ran %d times, %d attempts recorded; want %d", got, rec.Attempts, tt.wantRuns)
			}
			if rec.LastError != tt.wantError {
				t.Errorf("ledger last error: got %q, want %q", rec.LastError, tt.wantError)
			}
			dl, err := queue.FindDeadLetter(context.Background(), b.obj, "mail-1")
			if err != nil {
				t.Fatalf("find dead letter: %v", err)
			}
			if dl.Subject != "job.mail" || string(dl.Payload) != "hello" || dl.Error != tt.wantError || dl.Attempts != tt.wantRuns {
				t.Errorf("dead letter: got %+v, want job.mail/hello/%q/%d", dl, tt.wantError, tt.wantRuns)
			}
		})
	}
}

func TestDeadLetterRetryRunsAgainUnderLedger(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 1})
	var fail atomic.Bool
	fail.Store(true)
	c := newCounter()
	b.startPool(t, c.wrap(func(context.Context, *data.Job) error {
		if fail.Load() {
			return errors.New("not yet")
		}
		return nil
	}))
	b.enqueue(t, "job.r", "r-1", "x")
	b.waitState(t, "r-1", data.StateFailed)
	fail.Store(false)
	dl, err := queue.FindDeadLetter(context.Background(), b.obj, "r-1")
	if err != nil {
		t.Fatalf("find dead letter: %v", err)
	}
	// Inside the dedupe window, and still run: the retry has a fresh Nats-Msg-Id.
	if _, err := queue.RetryDeadLetter(context.Background(), b.obj, dl); err != nil {
		t.Fatalf("retry: %v", err)
	}
	rec := b.waitState(t, "r-1", data.StateDone)
	if rec.Attempts != 2 || c.get("r-1") != 2 {
		t.Errorf("got %d attempts recorded, %d runs; want 2 and 2", rec.Attempts, c.get("r-1"))
	}
	if st := b.status(t); st.DLQ.Messages != 0 {
		t.Errorf("DLQ holds %d, want 0 after retry", st.DLQ.Messages)
	}
	// Retrying the same dead letter twice stores it once.
	again, err := queue.RetryDeadLetter(context.Background(), b.obj, dl)
	if err != nil {
		t.Fatalf("retry again: %v", err)
	}
	if !again.Duplicate {
		t.Errorf("second retry of dead letter %d: got a new job %d, want a duplicate", dl.Seq, again.Sequence)
	}
}

func TestShutdownLetsRunningJobsFinish(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	started := make(chan struct{})
	p := queue.NewPool(b.obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		close(started)
		time.Sleep(300 * time.Millisecond)
		return nil
	}), servertest.Logger(t))
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, "job.s", "s-1", "x")
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if rec := b.record(t, "s-1"); rec.State != data.StateDone {
		t.Errorf("got state %s, want done", rec.State)
	}
	b.waitDrained(t)
}

func TestShutdownCutsOffAndNextAttemptIsResumed(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	started := make(chan struct{})
	p := queue.NewPool(b.obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}), servertest.Logger(t))
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, "job.s", "cut-1", "x")
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if rec := b.record(t, "cut-1"); rec.State != data.StateRetrying || rec.LastError != data.CauseCutOff {
		t.Fatalf("got %s %q, want retrying %q", rec.State, rec.LastError, data.CauseCutOff)
	}
	var seen atomic.Pointer[data.Job]
	b.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		seen.Store(job)
		return nil
	}))
	b.waitState(t, "cut-1", data.StateDone)
	if j := seen.Load(); j == nil || !j.Resumed || j.Attempt != 2 {
		t.Errorf("second attempt: got %+v, want resumed attempt 2", j)
	}
}

func TestExhaustedJobsAreDeadLettered(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// missedAdvisory lets the server give up on the job before jobq
		// runs, so only the sweep on start can find it.
		missedAdvisory bool
	}{
		{name: "advisory while running"},
		{name: "advisory missed while down", missedAdvisory: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{MaxDeliver: 2})
			b.enqueue(t, "job.ext", "ext-1", "x")
			// An outside worker fails the job on every delivery.
			for range 2 {
				msg, err := b.obj.Worker.Next(jetstream.FetchMaxWait(5 * time.Second))
				if err != nil {
					t.Fatalf("next: %v", err)
				}
				if err := msg.Nak(); err != nil {
					t.Fatalf("nak: %v", err)
				}
			}
			if tt.missedAdvisory {
				// A pull makes the server give up on the job and advise it,
				// with no jobq listening.
				waitFor(t, 10*time.Second, func() error {
					b.obj.Worker.Next(jetstream.FetchMaxWait(200 * time.Millisecond))
					if st := b.status(t); st.Consumer.AckPending != 0 {
						return fmt.Errorf("%d ack pending, want 0", st.Consumer.AckPending)
					}
					return nil
				})
				if st := b.status(t); st.Stream.Messages != 1 {
					t.Fatalf("JOB holds %d jobs, want the exhausted one", st.Stream.Messages)
				}
			}
			b.startPool(t, handlers.HandlerFunc(ok))
			rec := b.waitState(t, "ext-1", data.StateFailed)
			b.waitDrained(t)
			if st := b.status(t); st.DLQ.Messages != 1 || st.Stream.Messages != 0 {
				t.Errorf("got JOB %d / DLQ %d, want 0 / 1", st.Stream.Messages, st.DLQ.Messages)
			}
			if rec.LastError == "" {
				t.Errorf("ledger explains nothing: %+v", rec)
			}
		})
	}
}

// A job whose deliveries ran out while jobq was down is dead-lettered by the
// sweep on start, also while another job is pending, once WORKER's ack
// floor moved past it (as it does when no job is pending for a moment): no
// job at or below the floor is pending. The sweep waited for a moment with
// none pending as it ran, which under constant load may not come.
func TestExhaustedJobIsDeadLetteredWhileAnotherIsPending(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 2})
	b.enqueue(t, "job.ext", "ext-1", "x")
	for range 2 { // an outside worker fails it on every delivery
		msg, err := b.obj.Worker.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("next: %v", err)
		}
		if err := msg.Nak(); err != nil {
			t.Fatalf("nak: %v", err)
		}
	}
	waitFor(t, 10*time.Second, func() error { // the server gives up on it, unheard
		b.obj.Worker.Next(jetstream.FetchMaxWait(200 * time.Millisecond))
		if st := b.status(t); st.Consumer.AckPending != 0 {
			return fmt.Errorf("%d ack pending, want 0", st.Consumer.AckPending)
		}
		return nil
	})
	// The outside worker runs another job, then holds a third for its
	// whole ack wait.
	outside := func(id string) jetstream.Msg {
		b.enqueue(t, "job.ext", id, "x")
		m, err := b.obj.Worker.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil || m.Headers().Get(nats.MsgIdHdr) != id {
			t.Fatalf("next: %v, want %s", err, id)
		}
		return m
	}
	if err := outside("ran-1").DoubleAck(context.Background()); err != nil {
		t.Fatal(err)
	}
	held := outside("busy-1")
	b.startPool(t, handlers.HandlerFunc(ok))
	rec := b.waitState(t, "ext-1", data.StateFailed)
	// The sweep records the job failed, then removes it from JOB.
	waitFor(t, 10*time.Second, func() error {
		if st := b.status(t); st.DLQ.Messages != 1 || st.Stream.Messages != 1 || st.Consumer.AckPending != 1 {
			return fmt.Errorf("got JOB %d / DLQ %d / ack pending %d, want 1 / 1 / 1: busy-1 left to its worker", st.Stream.Messages, st.DLQ.Messages, st.Consumer.AckPending)
		}
		return nil
	})
	if !strings.Contains(rec.LastError, "deliveries exhausted") {
		t.Errorf("ext-1's record: %+v, want its deliveries exhausted", rec)
	}
	if err := held.Ack(); err != nil {
		t.Fatal(err)
	}
}

func TestRestartKeepsJobsAndLedger(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := server.Config{StoreDir: dir, Logger: servertest.Logger(t)}
	ctx := context.Background()

	srv, err := server.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := setupOn(t, srv, queue.Config{})
	c := newCounter()
	p := queue.NewPool(b.obj, c.wrap(ok), servertest.Logger(t))
	p.Start(ctx)
	for i := range 5 {
		b.enqueue(t, "job.a", fmt.Sprintf("a-%d", i), "x")
	}
	b.waitDrained(t)
	p.Stop(ctx)
	for i := range 5 { // pending across the restart
		b.enqueue(t, "job.b", fmt.Sprintf("b-%d", i), "x")
	}
	b.nc.Close()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	b2 := setup2(t, cfg)
	if st := b2.status(t); st.Stream.Messages != 5 || st.Ledger.Records != 5 {
		t.Fatalf("after restart: JOB %d, ledger %d; want 5 and 5", st.Stream.Messages, st.Ledger.Records)
	}
	b2.startPool(t, c.wrap(ok))
	// The dedupe table is rebuilt only from stored jobs: the done ones can
	// be stored again, and the ledger keeps them from running.
	for i := range 5 {
		b2.enqueue(t, "job.a", fmt.Sprintf("a-%d", i), "x")
	}
	b2.waitDrained(t)
	for _, prefix := range []string{"a", "b"} {
		for i := range 5 {
			id := fmt.Sprintf("%s-%d", prefix, i)
			if got := c.get(id); got != 1 {
				t.Errorf("job %s ran %d times, want 1", id, got)
			}
		}
	}
}

// setup2 starts a server on cfg.StoreDir (shut down by t.Cleanup).
func setup2(t *testing.T, cfg server.Config) *testBundle {
	return setupOn(t, servertest.StartConfig(t, cfg), queue.Config{})
}

func TestCorruptRecordDoesNotLoseJob(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	if _, err := b.obj.Ledger.Put(context.Background(), data.Key("junk-1"), []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	b.enqueue(t, "job.j", "junk-1", "x")
	rec := b.waitState(t, "junk-1", data.StateDone)
	if c.get("junk-1") != 1 || !rec.Resumed {
		t.Errorf("got %d runs, record %+v; want 1 run marked resumed", c.get("junk-1"), rec)
	}
}

func TestNextAndPeek(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 2})
	b.enqueue(t, "job.n", "n-1", "payload")
	var got *data.Job
	// A peek delivers nothing: as many as MaxDeliver of them leave the
	// job's first run its first attempt, not a resumed one.
	for range 3 {
		found, err := queue.Peek(context.Background(), b.obj, 5*time.Second, func(j *data.Job) error { got = j; return nil })
		if err != nil || !found || got.ID != "n-1" || string(got.Payload) != "payload" || got.Attempt != 1 {
			t.Fatalf("peek: got %v %v %+v, want n-1 attempt 1", found, err, got)
		}
	}
	found, err := queue.Next(context.Background(), b.obj, handlers.HandlerFunc(func(_ context.Context, j *data.Job) error { got = j; return nil }), 5*time.Second, servertest.Logger(t))
	if err != nil || !found || got.ID != "n-1" || got.Attempt != 1 || got.Resumed {
		t.Fatalf("next after peeks: got %v %v %+v, want n-1 attempt 1, not resumed", found, err, got)
	}
	if rec := b.record(t, "n-1"); rec.State != data.StateDone {
		t.Errorf("got state %s, want done", rec.State)
	}
	found, err = queue.Next(context.Background(), b.obj, handlers.HandlerFunc(ok), 300*time.Millisecond, servertest.Logger(t))
	if err != nil || found {
		t.Errorf("next on an empty queue: got %v %v, want false nil", found, err)
	}
	found, err = queue.Peek(context.Background(), b.obj, 300*time.Millisecond, func(j *data.Job) error { got = j; return nil })
	if err != nil || found {
		t.Errorf("peek on an empty queue: got %v %v, want false nil", found, err)
	}

	// A job with a status message's headers and no payload is a job here too.
	h := nats.Header{"Status": {"404"}, "Description": {"No Messages"}}
	if _, err := b.prod.Enqueue(context.Background(), "job.n", nil, queue.EnqueueOptions{ID: "n-status", Header: h}); err != nil {
		t.Fatal(err)
	}
	got = nil
	found, err = queue.Next(context.Background(), b.obj, handlers.HandlerFunc(func(_ context.Context, j *data.Job) error { got = j; return nil }), 5*time.Second, servertest.Logger(t))
	if err != nil || !found || got == nil || got.ID != "n-status" {
		t.Fatalf("next on a job with a Status header: got %v %v %+v, want n-status", found, err, got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if found, err = queue.Next(ctx, b.obj, handlers.HandlerFunc(ok), 5*time.Second, servertest.Logger(t)); found || !errors.Is(err, context.Canceled) {
		t.Errorf("next with its context cancelled: got %v %v, want false and %v", found, err, context.Canceled)
	}
}

func TestJobTimeoutFailsTheAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 2, JobTimeout: 100 * time.Millisecond})
	c := newCounter()
	b.startPool(t, c.wrap(func(ctx context.Context, _ *data.Job) error {
		<-ctx.Done()
		return ctx.Err()
	}))
	b.enqueue(t, "job.slow", "slow-1", "x")
	rec := b.waitState(t, "slow-1", data.StateFailed)
	if c.get("slow-1") != 2 || !strings.Contains(rec.LastError, "job timeout 100ms reached") {
		t.Errorf("got %d runs, last error %q; want 2 runs ended by the job timeout", c.get("slow-1"), rec.LastError)
	}
}

func TestUnroutedJobIsDeadLetteredWithReason(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	r := handlers.NewRouter()
	r.HandleFunc("job.email.*", ok)
	b.startPool(t, r)
	b.enqueue(t, "job.sms.send", "sms-1", "x")
	rec := b.waitState(t, "sms-1", data.StateFailed)
	if rec.Attempts != 1 || !strings.Contains(rec.LastError, `no handler for subject "job.sms.send"`) {
		t.Errorf("got %+v, want one attempt failed with no handler", rec)
	}
}

func TestNoLedgerRunsAtLeastOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{NoLedger: true, MaxDeliver: 2})
	c := newCounter()
	b.startPool(t, c.wrap(func(_ context.Context, job *data.Job) error {
		if job.Subject == "job.bad" {
			return errors.New("always fails")
		}
		return nil
	}))
	for i := range 50 {
		b.enqueue(t, "job.ok", fmt.Sprintf("ok-%d", i), "x")
	}
	b.enqueue(t, "job.bad", "bad-1", "x")
	waitFor(t, 20*time.Second, func() error {
		if st := b.status(t); st.Stream.Messages != 0 || st.DLQ.Messages != 1 {
			return fmt.Errorf("JOB %d, DLQ %d; want 0 and 1", st.Stream.Messages, st.DLQ.Messages)
		}
		return nil
	})
	for i := range 50 {
		if got := c.get(fmt.Sprintf("ok-%d", i)); got != 1 {
			t.Errorf("job ok-%d ran %d times, want 1", i, got)
		}
	}
	if c.get("bad-1") != 2 {
		t.Errorf("failing job ran %d times, want 2", c.get("bad-1"))
	}
	if st := b.status(t); st.Ledger.Records != 0 {
		t.Errorf("ledger holds %d records without a ledger, want 0", st.Ledger.Records)
	}
}

func TestShutdownReleasesUnstartedJobsUnresumed(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{Workers: 1})
	started := make(chan struct{}, 1)
	p := queue.NewPool(b.obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}), servertest.Logger(t))
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, "job.s", "first", "x")
	<-started
	b.enqueue(t, "job.s", "waiting", "x")
	// The pool holds it, its worker busy: on its lease, not only
	// delivered (a job that arrives once its pull ended is handed back
	// without a record).
	waitFor(t, 10*time.Second, func() error {
		leases, err := data.NewLedger(b.obj.Ledger, time.Minute, nil).ReadLeases(context.Background())
		if err != nil {
			return err
		}
		for _, l := range leases {
			for _, j := range l.Jobs {
				if j.Key == data.Key("waiting") {
					return nil
				}
			}
		}
		return errors.New("job waiting is not on the pool's lease")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if rec := b.record(t, "waiting"); rec.State != data.StateRetrying || rec.LastError != data.CauseReleased || rec.Attempts != 0 {
		t.Fatalf("unstarted job: got %+v, want retrying, released, no attempt", rec)
	}
	seen := map[string]*data.Job{}
	var mu sync.Mutex
	b.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		mu.Lock()
		seen[job.ID] = job
		mu.Unlock()
		return nil
	}))
	b.waitState(t, "first", data.StateDone)
	b.waitState(t, "waiting", data.StateDone)
	mu.Lock()
	defer mu.Unlock()
	if !seen["first"].Resumed {
		t.Errorf("the cut-off job: got %+v, want resumed", seen["first"])
	}
	if seen["waiting"].Resumed {
		t.Errorf("the job that never started: got %+v, want not resumed", seen["waiting"])
	}
}

// A fresh job runs on the pool's lease, written once per batch of jobs (at
// least half of claimAhead while jobs wait), and its completion write
// creates its record: one ledger write per job, and a few for the lease.
func TestLedgerWritesPerJob(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		workers int
	}{{"four workers", 4}, {"one worker", 1}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{Workers: tt.workers})
			const n = 200
			for i := range n {
				b.enqueue(t, "job.one", fmt.Sprintf("one-%d", i), "x")
			}
			c := newCounter()
			b.startPool(t, c.wrap(ok))
			b.waitDrained(t)
			for i := range n {
				id := fmt.Sprintf("one-%d", i)
				if rec := b.record(t, id); rec.State != data.StateDone || rec.Attempts != 1 || rec.Resumed || c.get(id) != 1 {
					t.Fatalf("job %s: ran %d times, record %+v; want once, done, 1 attempt", id, c.get(id), rec)
				}
			}
			// The bucket's stream counts every write.
			st, err := b.js.Stream(context.Background(), "KV_"+queue.BucketProcessed)
			if err != nil {
				t.Fatal(err)
			}
			info, err := st.Info(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := info.State.LastSeq; got <= n || got > n+n/10 {
				t.Errorf("ledger writes: got %d for %d jobs, want one per job and at most one lease write per 10 jobs", got, n)
			}
		})
	}
}

func TestLongJobOnTheLeaseKeepsItsCopiesOut(t *testing.T) {
	t.Parallel()
	// Fresh jobs run on the pool's lease, renewed every AckWait/3: a copy
	// published after the dedupe window, long after the job started, finds
	// it there and is not run beside it.
	// An ack wait of 3s renews the lease every second: on a loaded machine
	// a shorter one can see a renewal late, and the job given up (and run
	// again, resumed), as it should be then.
	b := setup(t, queue.Config{Workers: 2, DedupeWindow: 2 * time.Second, AckWait: 3 * time.Second})
	c := newCounter()
	h, started, release := c.held(2)
	b.startPool(t, h)
	b.enqueue(t, "job.long", "long-1", "x")
	<-started
	b.republishAfterWindow(t, "job.long", "long-1", "x")
	// The copy is acked as a duplicate of the running job.
	b.waitOnlyRunningLeft(t)
	close(release)
	b.waitDrained(t)
	c.wantOnce(t, "long-1")
	if rec := b.record(t, "long-1"); rec.State != data.StateDone || rec.Attempts != 1 {
		t.Errorf("record: got %+v, want done, 1 attempt", rec)
	}
}

func TestOldCopiesAreClaimedBeforeTheyRun(t *testing.T) {
	t.Parallel()
	// Two copies of one job wait in JOB, published a dedupe window apart.
	// JOB's oldest job is older than the window less AckWait, so each is
	// claimed before it runs and only one runs.
	b := setup(t, queue.Config{Workers: 4, DedupeWindow: 2 * time.Second, AckWait: time.Second})
	b.enqueue(t, "job.copy", "copy-1", "x")
	b.republishAfterWindow(t, "job.copy", "copy-1", "x")
	c := newCounter()
	b.startPool(t, c.wrap(func(context.Context, *data.Job) error {
		time.Sleep(50 * time.Millisecond)
		return nil
	}))
	b.waitDrained(t)
	c.wantOnce(t, "copy-1")
}

func TestLeasedJobStopsWhenTheLeaseCannotBeRenewed(t *testing.T) {
	t.Parallel()
	// A job runs on the pool's lease. The bucket starts refusing writes to
	// keys that exist (discard new per subject), so the lease cannot be
	// renewed: before it ends, the handler is cancelled, since another pool
	// may take the job over then. The job stays in JOB, and runs again as
	// a resumed attempt once the bucket takes writes again.
	b := setup(t, queue.Config{Workers: 1, AckWait: 3 * time.Second})
	started := make(chan struct{})
	cause := make(chan error, 1)
	c := newCounter()
	var resumedSeen atomic.Bool
	b.startPool(t, c.wrap(func(ctx context.Context, job *data.Job) error {
		if job.Attempt > 1 {
			resumedSeen.Store(job.Resumed)
			return nil
		}
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return ctx.Err()
	}))
	b.enqueue(t, "job.lost", "lost-1", "x")
	<-started
	setDiscardNewPerSubject(t, b, true)
	select {
	case err := <-cause:
		if !errors.Is(err, data.ErrClaimLost) {
			t.Errorf("handler cancelled with %v, want ErrClaimLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("handler still running 10s after its lease could no longer be renewed")
	}
	if st := b.status(t); st.Stream.Messages != 1 {
		t.Errorf("JOB holds %d jobs, want the job kept for another run", st.Stream.Messages)
	}
	setDiscardNewPerSubject(t, b, false)
	b.waitDrained(t)
	if got := c.get("lost-1"); got != 2 {
		t.Errorf("job ran %d times, want 2", got)
	}
	if rec := b.record(t, "lost-1"); rec.State != data.StateDone || !rec.Resumed || !resumedSeen.Load() {
		t.Errorf("record: got %+v, handler saw resumed %v; want done, resumed", rec, resumedSeen.Load())
	}
}

// The same, but the handler finishes its work and returns nil once
// cancelled (a handler that does not watch its context): it succeeded, and
// its done record, a create that finds no record, is written. Its success
// was taken for a cut-off attempt, and the job ran again.
func TestLeasedJobThatSucceedsAfterItsLeaseWasGivenUpRunsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{Workers: 1, AckWait: 3 * time.Second})
	started := make(chan struct{})
	c := newCounter()
	b.startPool(t, c.wrap(func(ctx context.Context, job *data.Job) error {
		if job.Attempt > 1 || job.Resumed {
			return nil
		}
		close(started)
		<-ctx.Done()                       // the pool gave up its lease
		time.Sleep(100 * time.Millisecond) // the work goes on a little
		return nil
	}))
	b.enqueue(t, "job.lost", "J", "x")
	<-started
	setDiscardNewPerSubject(t, b, true) // the lease's renewals are refused
	time.Sleep(4 * time.Second)         // past the give-up
	setDiscardNewPerSubject(t, b, false)
	b.waitDrained(t)
	if got := c.get("J"); got != 1 {
		t.Errorf("J's handler returned nil on its first run, yet J ran %d times; want 1", got)
	}
	if rec := b.record(t, "J"); rec.State != data.StateDone || rec.Resumed || rec.Attempts != 1 {
		t.Errorf("record: %+v; want done after 1 attempt, not resumed", rec)
	}
}

func TestRedrivenCopyOfALeasedJobIsDropped(t *testing.T) {
	t.Parallel()
	// A job runs on the pool's lease (no record yet) when a copy of it is
	// re-driven: published under Jobq-Job-Id, or by dlq retry of an old
	// dead letter whose record expired, which then writes no record over
	// the running job. While the handler runs, the copy finds the lease
	// and is acked as a duplicate at once, not handed back; the job runs
	// once, its outcome recorded.
	for _, tt := range []struct {
		name    string
		redrive func(t *testing.T, b *testBundle)
	}{
		{"copy", func(t *testing.T, b *testBundle) { b.publishCopy(t, "job.r", "redrive-of-run-1", "run-1") }},
		{"dlq retry", func(t *testing.T, b *testBundle) {
			d := queue.DeadLetter{Seq: 424242, ID: "run-1", Subject: "job.r", JobSeq: 7, Error: "old failure", Payload: []byte("x")}
			if _, err := queue.RetryDeadLetter(context.Background(), b.obj, d); err != nil {
				t.Fatalf("retry: %v", err)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{Workers: 2, AckWait: 3 * time.Second})
			c := newCounter()
			h, started, release := c.held(2)
			b.startPool(t, h)
			b.enqueue(t, "job.r", "run-1", "x")
			<-started
			if _, err := data.NewLedger(b.obj.Ledger, time.Minute, nil).Get(context.Background(), "run-1"); !errors.Is(err, data.ErrNotFound) {
				t.Fatalf("running job: got %v, want no record yet", err)
			}
			tt.redrive(t, b)
			b.waitOnlyRunningLeft(t)
			close(release)
			b.waitDrained(t)
			c.wantOnce(t, "run-1")
			if st := b.status(t); st.Consumer.Redelivered != 0 {
				t.Errorf("consumer counts %d redelivered, want 0: the copy is dropped, not handed back", st.Consumer.Redelivered)
			}
			if rec := b.record(t, "run-1"); rec.State != data.StateDone {
				t.Errorf("record: got %+v, want done", rec)
			}
		})
	}
}

func TestPoolClaimsEveryJobWhenBatchedReadsFail(t *testing.T) {
	t.Parallel()
	// A bucket without direct gets (as a hand-made bucket may have) cannot
	// answer the batched reads that leases need: every job is claimed
	// first, and each still runs once.
	b := setup(t, queue.Config{Workers: 2})
	ctx := context.Background()
	st, err := b.js.Stream(ctx, "KV_"+queue.BucketProcessed)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("turn direct gets off: %v", err)
	}
	const n = 20
	for i := range n {
		b.enqueue(t, "job.nodirect", fmt.Sprintf("nd-%d", i), "x")
	}
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	b.waitDrained(t)
	for i := range n {
		if id := fmt.Sprintf("nd-%d", i); c.get(id) != 1 || b.record(t, id).State != data.StateDone {
			t.Fatalf("job %s: ran %d times, record %+v; want once, done", id, c.get(id), b.record(t, id))
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq != 2*n {
		t.Errorf("ledger writes: got %d for %d jobs, want a claim and a completion each", info.State.LastSeq, n)
	}
}

func TestRedriveWritesTheRecordFirst(t *testing.T) {
	t.Parallel()
	// A dead letter whose record is gone is re-driven: the record is
	// written before the copy is published, so a copy published by the
	// producer meanwhile is claimed, and only one runs.
	b := setup(t, queue.Config{Workers: 2, AckWait: 3 * time.Second, MaxDeliver: 1})
	b.enqueue(t, "job.d", "dl-1", "x")
	fail := b.startPool(t, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		return handlers.Permanent(errors.New("broken"))
	}))
	b.waitState(t, "dl-1", data.StateFailed)
	b.waitDrained(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := fail.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.obj.Ledger.Purge(ctx, data.Key("dl-1")); err != nil { // as if its record expired
		t.Fatal(err)
	}
	letters, err := queue.ListDeadLetters(ctx, b.obj, 0)
	if err != nil || len(letters) != 1 {
		t.Fatalf("dead letters: got %v, %v; want one", letters, err)
	}
	if _, err := queue.RetryDeadLetter(ctx, b.obj, letters[0]); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if rec := b.record(t, "dl-1"); rec.State != data.StateFailed || rec.LastError == "" {
		t.Errorf("record after re-drive: got %+v, want failed with the dead letter's error", rec)
	}
	c := newCounter()
	b.startPool(t, c.wrap(func(ctx context.Context, job *data.Job) error {
		time.Sleep(200 * time.Millisecond)
		return nil
	}))
	b.enqueue(t, "job.d", "dl-1", "x") // the producer's copy, outside the window's memory
	b.waitDrained(t)
	c.wantOnce(t, "dl-1")
	if rec := b.record(t, "dl-1"); rec.State != data.StateDone {
		t.Errorf("record: got %+v, want done", rec)
	}
}

func TestCopiesStoredUnderAShorterWindowRunOnce(t *testing.T) {
	t.Parallel()
	// Two copies stored under a short window, then the window lengthened:
	// both copies are in JOB at once, and the job runs once.
	b := setup(t, queue.Config{Workers: 2, AckWait: time.Second, DedupeWindow: 300 * time.Millisecond, ProcessedTTL: time.Hour})
	b.enqueue(t, "job.d", "dup-1", "a")
	b.republishAfterWindow(t, "job.d", "dup-1", "b")
	b2 := setupOn(t, b.srv, queue.Config{Workers: 2, AckWait: time.Second, DedupeWindow: time.Hour, ProcessedTTL: 2 * time.Hour})
	b2.wantRunOnce(t, "dup-1")
}

func TestCopiesStoredBeforeAWindowEditRunOnce(t *testing.T) {
	t.Parallel()
	// Two copies stored under jobq's 2s window, then the window lengthened
	// with a plain stream edit (as nats stream edit does): the job runs
	// once.
	b := setup(t, queue.Config{Workers: 2, AckWait: time.Second, DedupeWindow: 2 * time.Second, ProcessedTTL: time.Hour})
	b.enqueue(t, "job.d", "dup-2", "a")
	b.republishAfterWindow(t, "job.d", "dup-2", "b")
	b.editJobs(t, func(c *jetstream.StreamConfig) { c.Duplicates = time.Hour })
	b.wantRunOnce(t, "dup-2")
}

func TestPrefetchBytesBoundsTheJobsInHand(t *testing.T) {
	t.Parallel()
	// Room for 24 jobs by count, and twelve 16,000-byte jobs waiting: the
	// byte budget decides how many the pool takes. A job larger than the
	// budget still runs, alone.
	for _, tt := range []struct {
		name   string
		budget int64
		inHand int
	}{
		{"six fit", 100_000, 6},
		{"each larger than the budget", 1_000, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{Workers: 4, Prefetch: 20, PrefetchBytes: tt.budget, MaxPayload: 16 << 10})
			for i := range 12 {
				b.enqueue(t, "job.b", fmt.Sprintf("big-%d", i), strings.Repeat("b", 16_000))
			}
			pulls := b.countPulls(t)
			release := make(chan struct{})
			c := newCounter()
			b.startPool(t, c.wrap(func(ctx context.Context, job *data.Job) error {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}))
			b.waitAckPending(t, tt.inHand)
			time.Sleep(500 * time.Millisecond) // longer than a pull's wait
			if got := b.status(t).Consumer.AckPending; got != tt.inHand {
				t.Errorf("pool holds %d jobs, want %d", got, tt.inHand)
			}
			close(release)
			b.waitDrained(t)
			for i := range 12 {
				c.wantOnce(t, fmt.Sprintf("big-%d", i))
			}
			// A pull the next job does not fit ends at once: the fetcher
			// waits for room before the next one rather than spin.
			if n := pulls.Load(); n > 100 {
				t.Errorf("%d pulls for 12 jobs: the fetcher spins", n)
			}
		})
	}
}

func TestPoolsKeepGoingAtMaxAckPending(t *testing.T) {
	t.Parallel()
	// Two pools on one WORKER (two jobq processes, say) have room for 20
	// jobs between them, but WORKER lets only 5 be delivered and unacked:
	// pulls wait at the limit rather than stall or fail, and every job
	// runs once.
	b := setup(t, queue.Config{Workers: 2, Prefetch: 8, AckWait: 2 * time.Second})
	b.editWorker(t, func(c *jetstream.ConsumerConfig) { c.MaxAckPending = 5 })
	c := newCounter()
	h := c.wrap(func(ctx context.Context, job *data.Job) error {
		time.Sleep(50 * time.Millisecond)
		return nil
	})
	b.startPool(t, h)
	b.startPool(t, h)
	for i := range 40 {
		b.enqueue(t, "job.map", fmt.Sprintf("m-%d", i), "x")
	}
	b.waitAckPending(t, 5) // the limit is reached
	b.waitDrained(t)
	for i := range 40 {
		c.wantOnce(t, fmt.Sprintf("m-%d", i))
	}
}

func TestPoolKeepsToWorkersPullLimits(t *testing.T) {
	t.Parallel()
	// WORKER limits one pull to 3 jobs, 10,000 bytes and a 100ms wait, less
	// than the pool's 200ms (set outside jobq, which Provision keeps): a
	// pull over any would fail, so the pool's pulls stay under them, and
	// every job runs once. Limits set while the pool runs are read after
	// the first pull that fails.
	for _, whileRunning := range []bool{false, true} {
		t.Run(fmt.Sprintf("set while running %v", whileRunning), func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{Workers: 4, Prefetch: 20})
			limit := func() {
				b.editWorker(t, func(c *jetstream.ConsumerConfig) {
					c.MaxRequestBatch, c.MaxRequestMaxBytes, c.MaxRequestExpires = 3, 10_000, 100*time.Millisecond
				})
			}
			c := newCounter()
			if whileRunning {
				b.startPool(t, c.wrap(ok))
				limit()
			} else {
				limit()
				b = setupOn(t, b.srv, queue.Config{Workers: 4, Prefetch: 20}) // reads them
				b.startPool(t, c.wrap(ok))
			}
			for i := range 20 {
				b.enqueue(t, "job.lim", fmt.Sprintf("lim-%d", i), strings.Repeat("l", 1000))
			}
			b.waitDrained(t)
			for i := range 20 {
				c.wantOnce(t, fmt.Sprintf("lim-%d", i))
			}
		})
	}
}

// WORKER limits one pull's wait (MaxRequestExpires, set outside jobq and
// kept by Provision). The pool keeps to it; Next (jobq next) must too: a
// wait longer than the limit is made of several pulls, not one refused.
func TestNextKeepsToWorkersPullExpiresLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	b.editWorker(t, func(c *jetstream.ConsumerConfig) { c.MaxRequestExpires = 200 * time.Millisecond })
	b = setupOn(t, b.srv, queue.Config{}) // reads it, as jobq next does
	// A job that comes while Next waits, after its first pull's wait.
	go func() {
		time.Sleep(600 * time.Millisecond)
		_, _ = b.prod.Enqueue(context.Background(), "job.n", []byte("x"), queue.EnqueueOptions{ID: "late"})
	}()
	var got *data.Job
	found, err := queue.Next(context.Background(), b.obj, handlers.HandlerFunc(func(_ context.Context, j *data.Job) error { got = j; return nil }), 3*time.Second, servertest.Logger(t))
	if err != nil || !found || got == nil || got.ID != "late" {
		t.Fatalf("next with WORKER's MaxRequestExpires 200ms and a 3s wait: got %v, %v; want job late", found, err)
	}
	// And with nothing to take, it waits out its wait without an error.
	start := time.Now()
	found, err = queue.Next(context.Background(), b.obj, handlers.HandlerFunc(ok), time.Second, servertest.Logger(t))
	if err != nil || found {
		t.Fatalf("next on an empty queue: got %v %v, want false nil", found, err)
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("next on an empty queue returned after %s, want its wait of 1s", took)
	}
}

func TestStatusCountsLeasesApartFromRecords(t *testing.T) {
	t.Parallel()
	// A running pool has one lease in the bucket; a pool that stops
	// deletes it. Neither the lease nor its delete marker counts as a
	// record.
	b := setup(t, queue.Config{Workers: 1})
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	p := b.startPool(t, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		started <- struct{}{}
		if job.ID == "hold" {
			<-release
		}
		return nil
	}))
	b.enqueue(t, "job.s", "first", "x")
	<-started
	b.enqueue(t, "job.s", "hold", "x")
	<-started
	b.waitState(t, "first", data.StateDone)
	if st := b.status(t); st.Ledger.Records != 1 || st.Ledger.Leases != 1 {
		t.Errorf("while a job runs: got %d records, %d leases; want 1 and 1", st.Ledger.Records, st.Ledger.Leases)
	}
	close(release)
	b.waitDrained(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if st := b.status(t); st.Ledger.Records != 2 || st.Ledger.Leases != 0 {
		t.Errorf("after the pool stopped: got %d records, %d leases; want 2 and 0", st.Ledger.Records, st.Ledger.Leases)
	}
}

// runTwice counts the jobs c ran more than once.
func (c *counter) runTwice() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.runs {
		if r > 1 {
			n++
		}
	}
	return n
}

func TestTwoPoolsNeverRunCopiesOfAJobAtOnce(t *testing.T) {
	t.Parallel()
	// Two pools on one server, every job stored twice (a copy under its
	// own Nats-Msg-Id and the same job ID): each job runs once.
	cfg := queue.Config{Workers: 8, Prefetch: 8, AckWait: 3 * time.Second}
	a := setup(t, cfg)
	b := setupOn(t, a.srv, cfg)
	c := newCounter()
	h := c.wrap(func(ctx context.Context, job *data.Job) error {
		time.Sleep(5 * time.Millisecond)
		return nil
	})
	a.startPool(t, h)
	b.startPool(t, h)
	const n = 600
	for i := range n {
		id := fmt.Sprintf("j%d", i)
		a.enqueue(t, "job.x", id, "")
		a.publishCopy(t, "job.x", "copy-"+id, id)
	}
	a.waitDrained(t)
	if twice := c.runTwice(); twice > 0 || c.overlap > 0 {
		t.Errorf("%d jobs ran more than once, %d runs overlapped another of the same job", twice, c.overlap)
	}
}

func TestDoneCopiesDoNotRunAgain(t *testing.T) {
	t.Parallel()
	// One pool, every job stored again a few jobs later: a copy checked
	// while the first ran, and leased after its completion was recorded,
	// must not run.
	b := setup(t, queue.Config{Workers: 4, Prefetch: 4})
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	const n, gap = 1500, 3
	for i := range n + gap {
		if i < n {
			b.enqueue(t, "job.x", fmt.Sprintf("j%d", i), "")
		}
		if i >= gap {
			id := fmt.Sprintf("j%d", i-gap)
			b.publishCopy(t, "job.x", "copy-"+id, id)
		}
	}
	b.waitDrained(t)
	if twice := c.runTwice(); twice > 0 || c.overlap > 0 {
		t.Errorf("%d jobs ran more than once, %d runs overlapped another of the same job", twice, c.overlap)
	}
}

func TestCopyAfterALostLeaseIsResumed(t *testing.T) {
	t.Parallel()
	// A job's handler is cut off because the pool's lease can no longer be
	// renewed (the bucket refuses writes to keys that exist). Its attempt
	// is recorded as cut off, so both its redelivery and a copy stored
	// later see Resumed, and the job runs once more.
	b := setup(t, queue.Config{Workers: 1, AckWait: 3 * time.Second})
	started, cancelled := make(chan struct{}), make(chan struct{})
	type run struct {
		seq     uint64
		attempt int
		resumed bool
	}
	runs := make(chan run, 10)
	b.startPool(t, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		runs <- run{job.Seq, job.Attempt, job.Resumed}
		if job.Seq == 1 && job.Attempt == 1 {
			close(started)
			<-ctx.Done() // its effect is done; it is cut off
			close(cancelled)
			return ctx.Err()
		}
		return nil
	}))
	b.enqueue(t, "job.lost", "lost-1", "x")
	<-started
	setDiscardNewPerSubject(t, b, true)
	<-cancelled
	setDiscardNewPerSubject(t, b, false)
	b.publishCopy(t, "job.lost", "copy-of-lost-1", "lost-1")
	b.waitDrained(t)
	close(runs)
	n := 0
	for r := range runs {
		if n++; n > 1 && !r.resumed {
			t.Errorf("seq %d attempt %d ran after the cut-off attempt without Resumed", r.seq, r.attempt)
		}
	}
	if n != 2 {
		t.Errorf("the job ran %d times, want once more after the cut-off", n)
	}
	if rec := b.record(t, "lost-1"); rec.State != data.StateDone || !rec.Resumed {
		t.Errorf("record: got %+v, want done, resumed", rec)
	}
}

// setDiscardNewPerSubject makes the ledger bucket refuse, or take again,
// writes to keys that exist, such as lease renewals.
func setDiscardNewPerSubject(t *testing.T, b *testBundle, on bool) {
	t.Helper()
	b.editLedger(t, func(cfg *jetstream.StreamConfig, _ jetstream.StreamState) { cfg.DiscardNewPerSubject = on })
}

func TestLeasedJobRecordsWhenItStarted(t *testing.T) {
	t.Parallel()
	// One worker, two jobs leased together: the second waits for the
	// first, and its record says it started after the first finished, not
	// when it was leased.
	b := setup(t, queue.Config{Workers: 1})
	b.enqueue(t, "job.s", "slow", "x")
	b.enqueue(t, "job.s", "next", "x")
	b.startPool(t, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		if job.ID == "slow" {
			time.Sleep(300 * time.Millisecond)
		}
		return nil
	}))
	b.waitDrained(t)
	slow, next := b.record(t, "slow"), b.record(t, "next")
	if next.StartedAt.Before(slow.FinishedAt) || !next.FirstAt.Equal(next.StartedAt) {
		t.Errorf("next started %v (first %v), slow finished %v; want next started after, first = started", next.StartedAt, next.FirstAt, slow.FinishedAt)
	}
}

// A handler may keep its job after it returns, as one that hands it to a
// goroutine of its own does: the job stays whole, and the pool's letting go
// of the payload once the handler succeeded does not race with it.
func TestHandlerMayKeepItsJob(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	var wg sync.WaitGroup
	var bad atomic.Int32
	start := make(chan struct{})
	h := handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if string(job.Payload) != "hello "+job.ID {
				bad.Add(1)
			}
		}()
		return nil
	})
	for _, id := range []string{"a", "b", "c", "d"} {
		b.enqueue(t, "job.x", id, "hello "+id)
	}
	b.startPool(t, h)
	b.waitDrained(t)
	close(start)
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Errorf("%d jobs kept by their handler lost their payload after it returned", n)
	}
}

// A number names a DLQ sequence, or, if no dead letter is there, a job ID;
// DeadLetterOf takes it as a job ID.
func TestFindDeadLetterByNumber(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{})
	for _, id := range []string{"2", "x", "9"} { // at DLQ seq 1, 2 and 3
		m := nats.NewMsg(queue.SubjectDLQPrefix + "job.x")
		m.Header.Set(queue.HeaderJobID, id)
		m.Header.Set(queue.HeaderSubject, "job.x")
		if _, err := b.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		ref     string
		wantSeq uint64
		wantErr error
	}{
		{"1", 1, nil}, // seq 1, whose job is 2
		{"2", 2, nil}, // seq 2 (job x), though job 2 is at seq 1
		{"3", 3, nil}, // seq 3, job 9
		{"9", 3, nil}, // no seq 9: job 9
		{"x", 2, nil},
		{"4", 0, queue.ErrNoDeadLetter},
	} {
		d, err := queue.FindDeadLetter(ctx, b.obj, tt.ref)
		if !errors.Is(err, tt.wantErr) || tt.wantErr == nil && (err != nil || d.Seq != tt.wantSeq) {
			t.Errorf("FindDeadLetter(%q): got seq %d, %v; want seq %d, %v", tt.ref, d.Seq, err, tt.wantSeq, tt.wantErr)
		}
	}
	if d, err := queue.DeadLetterOf(ctx, b.obj, "2"); err != nil || d.Seq != 1 {
		t.Errorf("DeadLetterOf(2): got seq %d, %v; want seq 1", d.Seq, err)
	}
}
