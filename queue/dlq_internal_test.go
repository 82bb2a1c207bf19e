package queue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server"
	"github.com/jobq/jobq/server/servertest"
)

// A dead letter's own headers, Jobq- and Nats-, in any case, are not among
// the job headers it shows and re-drives: a foreign publisher's jobq-job-id
// would otherwise ride along beside the re-drive's Jobq-Job-Id.
func TestDeadLetterFromLeavesOutJobqAndNatsHeadersInAnyCase(t *testing.T) {
	d := deadLetterFrom(&jetstream.RawStreamMsg{
		Subject: SubjectDLQPrefix + "job.x",
		Header: nats.Header{
			HeaderJobID: {"J"}, "jobq-job-id": {"other"}, "NATS-TTL": {"1s"},
			"Nats-Msg-Id": {"m"}, "X-Keep": {"y"},
		},
	})
	if want := map[string][]string{"X-Keep": {"y"}}; !maps.EqualFunc(d.Header, want, slices.Equal) {
		t.Errorf("headers: got %v, want %v", d.Header, want)
	}
	if d.ID != "J" || d.Subject != "job.x" {
		t.Errorf("got ID %q, subject %q; want J, job.x", d.ID, d.Subject)
	}
}

// A job whose headers another client stored under a name nats.go will not
// send (here X(1)) is still dead-lettered, without that header: kept, it
// would fail the dead letter's publish every time, and the job would stay
// in JOB.
func TestDeadLetterLeavesOutHeadersNATSCannotSend(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{})
	job := &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 3, Payload: []byte("p")}
	if err := deadLetter(context.Background(), obj.JS, job, nats.Header{"X(1)": {"v"}, "X-Keep": {"y"}}, "boom"); err != nil {
		t.Fatalf("dead-letter a job with a header nats.go refuses: %v", err)
	}
	m, err := obj.Dead.GetLastMsgForSubject(context.Background(), SubjectDLQPrefix+"job.x")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Header["X(1)"]; ok || m.Header.Get("X-Keep") != "y" {
		t.Errorf("dead letter's headers: %v; want X-Keep kept and X(1) left out", m.Header)
	}
}

// Import reads its input only as it goes: once it returned, the reader is
// the caller's again, with nothing read from it behind the caller's back.
func TestImportLeavesItsReaderOnceItReturned(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{})
	var buf bytes.Buffer
	buf.WriteString("not json\n")
	if _, err := Import(context.Background(), NewProducer(obj.JS, obj.Config), &buf, ImportOptions{Strict: true}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("import: %v; want it stopped at the malformed line", err)
	}
	time.Sleep(10 * time.Millisecond)
	after := `{"subject":"job.after"}` + "\n"
	buf.WriteString(after)
	if got := buf.String(); got != after {
		t.Errorf("after Import returned, the reader holds %q; want %q", got, after)
	}
}

// The dashboard's list of dead letters is ListDeadLetters without the
// payloads, which the server does not send: a DLQ of large payloads costs
// each page load nothing.
func TestListDeadLetterSummaries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	if got, err := ListDeadLetterSummaries(ctx, obj, 50); err != nil || len(got) != 0 {
		t.Fatalf("empty DLQ: got %v, %v; want none", got, err)
	}
	for i, id := range []string{"a", "b", "c"} {
		job := &data.Job{ID: id, Subject: "job.x", Seq: uint64(i + 1), Attempt: 3, Payload: bytes.Repeat([]byte("p"), 100<<10)}
		if err := deadLetter(ctx, obj.JS, job, nats.Header{"X-Keep": {id}}, "boom "+id); err != nil {
			t.Fatal(err)
		}
	}
	full, err := ListDeadLetters(ctx, obj, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{0, 2} {
		got, err := ListDeadLetterSummaries(ctx, obj, limit)
		want := full
		if limit > 0 {
			want = full[:limit]
		}
		if err != nil || len(got) != len(want) {
			t.Fatalf("limit %d: got %d dead letters, %v; want %d", limit, len(got), err, len(want))
		}
		for i := range want {
			w := want[i]
			w.Payload = nil
			if !reflect.DeepEqual(got[i], w) {
				t.Errorf("limit %d, #%d: got %+v, want %+v", limit, i, got[i], w)
			}
		}
	}
}

// Listing dead letters for the dashboard, which reloads every few seconds
// per open tab, leaves no consumer behind on DLQ.
func TestListDeadLetterSummariesLeavesNoConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	for i := 1; i <= 3; i++ {
		job := &data.Job{ID: "j", Subject: "job.x", Seq: uint64(i), Attempt: 3, Payload: []byte("p")}
		if err := deadLetter(ctx, obj.JS, job, nats.Header{}, "boom"); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		if _, err := ListDeadLetterSummaries(ctx, obj, 50); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	if info, err := obj.Dead.Info(ctx); err != nil || info.State.Consumers != 0 {
		t.Errorf("after 10 listings DLQ has %d consumers (%v); want none left behind", info.State.Consumers, err)
	}
}

// cancellingReader gives part of a line, then ends the import's ctx, and
// counts the reads asked of it after that.
type cancellingReader struct {
	cancel      context.CancelFunc
	first       atomic.Bool
	afterCancel atomic.Int32
}

func (r *cancellingReader) Read(p []byte) (int, error) {
	if r.first.CompareAndSwap(false, true) {
		n := copy(p, `{"subject":"job.a"`) // no line end: Import asks for more
		r.cancel()
		return n, nil
	}
	r.afterCancel.Add(1)
	return 0, io.EOF
}

// An import stopped by its ctx starts no read of its input after that: the
// reader is the caller's again.
func TestImportReadsNothingOnceCtxEnded(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{})
	p := NewProducer(obj.JS, obj.Config)
	reads := 0
	for range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		r := &cancellingReader{cancel: cancel}
		if _, err := Import(ctx, p, r, ImportOptions{}); !errors.Is(err, context.Canceled) {
			t.Fatalf("import: %v", err)
		}
		time.Sleep(time.Millisecond)
		reads += int(r.afterCancel.Load())
	}
	if reads > 0 {
		t.Errorf("of 200 imports stopped by ctx, %d read their input after it ended", reads)
	}
}

// A job whose own headers take nearly all the server's limit, as it may,
// is still dead-lettered: without them, since with jobq's headers it would
// be refused every time and stay in JOB. Its error says so.
func TestDeadLetterOfAJobWithHeadersUpToTheLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	job := &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 3, Payload: []byte("p")}
	// Under the server's 64 KiB of headers alone, over it with jobq's.
	h := nats.Header{"X-Big": {strings.Repeat("v", maxHeaderBytes-100)}}
	if err := deadLetter(ctx, obj.JS, job, h, "boom"); err != nil {
		t.Fatalf("dead-letter a job with headers up to the server's limit: %v", err)
	}
	d, err := DeadLetterAt(ctx, obj, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Header["X-Big"]; ok || d.ID != "J" || !strings.Contains(d.Error, "boom") || !strings.Contains(d.Error, "headers are left out") {
		t.Errorf("dead letter: ID %q, error %q, headers %d; want J, its error saying its headers were left out, and none of them", d.ID, d.Error, len(d.Header))
	}
}

// EachDeadLetter visits the dead letters stored when it began, oldest
// first, and not one stored meanwhile (a retried job that failed again),
// which would make a retry of all of them go round for ever.
func TestEachDeadLetterVisitsThoseStoredWhenItBegan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	letter := func(seq uint64) {
		t.Helper()
		job := &data.Job{ID: fmt.Sprint("j", seq), Subject: "job.x", Seq: seq, Attempt: 3, Payload: []byte("p")}
		if err := deadLetter(ctx, obj.JS, job, nats.Header{}, "boom"); err != nil {
			t.Fatal(err)
		}
	}
	for seq := uint64(1); seq <= 3; seq++ {
		letter(seq)
	}
	var seen []string
	err := EachDeadLetter(ctx, obj, func(d DeadLetter) error {
		seen = append(seen, d.ID)
		if d.ID == "j1" {
			letter(4) // stored meanwhile
		}
		return nil
	})
	if err != nil || !slices.Equal(seen, []string{"j1", "j2", "j3"}) {
		t.Errorf("visited %v, %v; want j1, j2, j3 in that order, and not j4", seen, err)
	}
	stop := errors.New("stop")
	seen = nil
	if err := EachDeadLetter(ctx, obj, func(d DeadLetter) error { seen = append(seen, d.ID); return stop }); !errors.Is(err, stop) || len(seen) != 1 {
		t.Errorf("with f failing: visited %v, %v; want it stopped at the first, with f's error", seen, err)
	}
}

// Headers right at the server's limit, or a large Jobq- header another
// client set, still leave the job a dead letter.
func TestDeadLetterOfAJobWithHeadersRightAtTheLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	for i, h := range []nats.Header{
		{"X-Big": {strings.Repeat("v", maxHeaderBytes-60)}},
		{"X-Big": {strings.Repeat("v", maxHeaderBytes-20)}},
		{"Jobq-Note": {strings.Repeat("v", maxHeaderBytes-100)}},
		{"jobq-job-id": {strings.Repeat("v", maxHeaderBytes-100)}},
	} {
		job := &data.Job{ID: "J", Subject: "job.x", Seq: uint64(i + 1), Attempt: 3, Payload: []byte("p")}
		if err := deadLetter(ctx, obj.JS, job, h, "boom"); err != nil {
			t.Errorf("case %d: %v", i, err)
		}
	}
}

// A producer keeps room under the server's limit for the headers a job's
// dead letter adds: a job that filled it would be refused by DLQ for good.
func TestProducerKeepsRoomForTheDeadLetter(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{})
	limit := int(obj.JS.Conn().MaxPayload())
	p := NewProducer(obj.JS, Config{MaxPayload: limit})
	if _, err := p.Enqueue(context.Background(), "job.x", make([]byte, limit-100), EnqueueOptions{ID: "full"}); !errors.Is(err, ErrPayloadTooLarge) {
		t.Errorf("a job 100 bytes under the server's limit: %v; want it refused, too large to dead-letter", err)
	}
}

// DLQ dedupes a job's dead letters by its JOB sequence and when it was
// stored: the same job moved twice (the answer to the first lost) is stored
// once, also if its first dead letter was re-driven meanwhile; a job of a
// JOB made anew, at the same sequence, gets a dead letter of its own. Keyed
// by the sequence alone, it was taken for a duplicate of the other's, and
// removed from JOB with no dead letter.
func TestDeadLetterIsDedupedForItsOwnJobAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	at := time.Now()
	job := &data.Job{ID: "mine", Subject: "job.x", Seq: 5, Attempt: 3, Payload: []byte("p"), EnqueuedAt: at}
	other := *job
	other.ID, other.EnqueuedAt = "other", at.Add(-time.Hour) // before JOB was made anew
	for _, j := range []*data.Job{&other, job, job} {
		if err := deadLetter(ctx, obj.JS, j, nil, "failed"); err != nil {
			t.Fatal(err)
		}
	}
	if info, _ := obj.Dead.Info(ctx); info.State.Msgs != 2 {
		t.Fatalf("DLQ holds %d dead letters, want 2: the other job's and this one's, once", info.State.Msgs)
	}
	d, err := DeadLetterOf(ctx, obj, "mine")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RetryDeadLetter(ctx, obj, d); err != nil {
		t.Fatal(err)
	}
	if err := deadLetter(ctx, obj.JS, job, nil, "failed"); err != nil {
		t.Errorf("the job's own dead letter again, re-driven meanwhile: %v", err)
	}
	if info, _ := obj.Dead.Info(ctx); info.State.Msgs != 1 {
		t.Errorf("DLQ holds %d dead letters, want the other job's alone", info.State.Msgs)
	}
}

func TestCutUTF8CutsBetweenCharacters(t *testing.T) {
	for _, tt := range []struct {
		s    string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abc", 2, "ab"},
		{"aé", 2, "a"},   // é is 2 bytes: not cut in half
		{"a✓b", 3, "a"},  // ✓ is 3 bytes
		{"a✓b", 4, "a✓"}, // right after it
		{"é", 0, ""},
	} {
		if got := CutUTF8(tt.s, tt.n); got != tt.want {
			t.Errorf("CutUTF8(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

// A worker and the sweep, which may both move a job to DLQ (the worker's
// answer lost), give its dead letter the same ID: the first's delivery
// metadata and the second's stored message tell the same time.
func TestDeadLetterIDIsTheSameForAWorkerAndTheSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("p"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	batch, err := obj.Worker.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	var delivered *data.Job
	for m := range batch.Messages() {
		if delivered, err = decodeJob(m); err != nil {
			t.Fatal(err)
		}
	}
	if delivered == nil {
		t.Fatal("no job delivered")
	}
	stored, err := obj.Jobs.GetMsg(ctx, delivered.Seq)
	if err != nil {
		t.Fatal(err)
	}
	swept := &data.Job{ID: "J", Seq: stored.Sequence, EnqueuedAt: stored.Time}
	if a, b := deadLetterID(delivered), deadLetterID(swept); a != b {
		t.Errorf("dead letter IDs: worker %q, sweep %q", a, b)
	}
}

// dlqMadeMeanwhile stands for another worker of the pool, or another pool,
// whose dead letter also found no stream: once this pool's dead letter
// found none, the other makes DLQ again, before this one looks.
type dlqMadeMeanwhile struct {
	jetstream.JetStream
	cfg  Config
	once *sync.Once
}

func (j dlqMadeMeanwhile) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := j.JetStream.PublishMsg(ctx, m, opts...)
	if strings.HasPrefix(m.Subject, SubjectDLQPrefix) && errors.Is(err, jetstream.ErrNoStreamResponse) {
		j.once.Do(func() {
			if _, cerr := j.JetStream.CreateStream(ctx, deadStreamConfig(j.cfg)); cerr != nil {
				panic(cerr)
			}
		})
	}
	return ack, err
}

// A dead letter that found no stream is published again once DLQ is there,
// whoever made it: here, another worker failing a job at the same moment.
// Before, a pool that found DLQ made meanwhile left the job in JOB, and its
// redelivery ran it again although it had failed for good.
func TestDeadLetterIsPublishedAgainOnceDLQWasMadeMeanwhile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{MaxDeliver: 5, AckWait: 2 * time.Second, FetchWait: 200 * time.Millisecond,
		RetryBackoff: []time.Duration{10 * time.Millisecond}})
	if err := obj.JS.DeleteStream(ctx, StreamDLQ); err != nil {
		t.Fatal(err)
	}
	obj.JS = dlqMadeMeanwhile{JetStream: obj.JS, cfg: obj.Config, once: &sync.Once{}}
	var runs atomic.Int32
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		runs.Add(1)
		return handlers.Permanent(errors.New("broken"))
	}), servertest.Logger(t))
	startPool(t, p)
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.d", []byte("x"), EnqueueOptions{ID: "D"}); err != nil {
		t.Fatal(err)
	}
	// Long enough for a job left in JOB to come back after its ack wait.
	time.Sleep(3 * obj.Config.AckWait)
	if got := runs.Load(); got != 1 {
		t.Errorf("D failed for good and ran %d times; want 1", got)
	}
	s, err := obj.JS.Stream(ctx, StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Errorf("DLQ holds %+v (%v); want D's dead letter", info.State, err)
	}
}

// A seq-N job's dead letter keeps when the job was stored only to the
// millisecond, cut down (its Nats-Msg-Id, see deadLetterID), which is
// compared with JOB's creation to the millisecond: to the nanosecond, a
// job of this very JOB stored in the millisecond JOB was created in looked
// older than JOB, its re-drive ran under a jobq-retry-… ID of its own, and
// dlq retry said "JOB was made anew since", which it was not; the job's
// own record (seq-N, failed) never learnt of the re-drive's run.
func TestRedriveOfAJobStoredInJOBsFirstMillisecondKeepsItsID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	s, err := obj.JS.Stream(ctx, StreamJob)
	if err != nil {
		t.Fatal(err)
	}
	created := s.CachedInfo().Created
	// seq-1, stored a nanosecond after JOB was created (the same
	// millisecond), dead-lettered as a pool does it.
	job := &data.Job{ID: data.SeqID(1), Subject: "job.a", Seq: 1, Attempt: 1, Payload: []byte("x"), EnqueuedAt: created.Add(time.Nanosecond)}
	if err := deadLetter(ctx, obj.JS, job, nats.Header{}, "boom"); err != nil {
		t.Fatal(err)
	}
	d, err := DeadLetterOf(ctx, obj, data.SeqID(1))
	if err != nil {
		t.Fatal(err)
	}
	r, err := RetryDeadLetter(ctx, obj, d)
	if err != nil {
		t.Fatal(err)
	}
	if r.ID != d.ID {
		t.Errorf("re-drive of %s, stored %s in JOB created %s (never made anew): runs under %s; want %s",
			d.ID, job.EnqueuedAt.Format(time.RFC3339Nano), created.Format(time.RFC3339Nano), r.ID, d.ID)
	}
}

// A job dead-lettered on its last delivery whose removal from JOB was lost
// (jobq killed before the ack) is only removed by the sweep: its failed
// record names this very copy. Dead-lettered again, it came back to DLQ
// once the first dead letter was purged, or sat there twice past DLQ's
// dedupe window, and dlq retry --all ran it twice. So for a re-drive that
// failed the same way: its record keeps its first copy's first attempt,
// which the check went by, and took it for another copy.
func TestSweepRemovesACopyThatWasDeadLetteredAlready(t *testing.T) {
	for _, tt := range []struct {
		name    string
		redrive bool
	}{{"first copy", false}, {"re-drive", true}} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			scfg := server.Config{StoreDir: t.TempDir(), Logger: servertest.Logger(t)}
			qcfg := Config{MaxDeliver: 1, AckWait: time.Second, FetchWait: 200 * time.Millisecond}
			srv, err := server.Start(ctx, scfg)
			if err != nil {
				t.Fatal(err)
			}
			nc, err := srv.Connect()
			if err != nil {
				t.Fatal(err)
			}
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			obj, err := Provision(ctx, js, qcfg, servertest.Logger(t))
			if err != nil {
				t.Fatal(err)
			}
			l := data.NewLedger(obj.Ledger, time.Second, obj.JS)
			if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("p"), EnqueueOptions{ID: "X"}); err != nil {
				t.Fatal(err)
			}
			if tt.redrive {
				deadLetterNext(t, obj, l, true)
				d, err := FindDeadLetter(ctx, obj, "X")
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond) // the re-drive is stored after the first attempt
				if _, err := RetryDeadLetter(ctx, obj, d); err != nil {
					t.Fatal(err)
				}
			}
			deadLetterNext(t, obj, l, false)
			// The operator gives up on X; jobq starts again.
			if n, err := PurgeDeadLetters(ctx, obj); err != nil || n != 1 {
				t.Fatalf("purge DLQ: %d, %v; want 1", n, err)
			}
			l.Close()
			nc.Close()
			if err := srv.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			srv = servertest.StartConfig(t, scfg)
			if js, err = jetstream.New(servertest.Connect(t, srv)); err != nil {
				t.Fatal(err)
			}
			if obj, err = Provision(ctx, js, qcfg, servertest.Logger(t)); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(15 * time.Second); ; {
				obj.Worker.Next(jetstream.FetchMaxWait(200 * time.Millisecond))
				if info, err := obj.Worker.Info(ctx); err == nil && info.NumAckPending == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("X still pending after 15s")
				}
			}
			p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return errors.New("never runs") }), servertest.Logger(t))
			t.Cleanup(p.ledger.Close)
			if _, err := p.sweep(ctx); err != nil {
				t.Fatal(err)
			}
			dead, err := obj.Dead.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			jobs, err := obj.Jobs.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if dead.State.Msgs != 0 || jobs.State.Msgs != 0 {
				t.Errorf("after the sweep: JOB %d, DLQ %d; want both 0 (X was dead-lettered, and its dead letter purged)", jobs.State.Msgs, dead.State.Msgs)
			}
		})
	}
}

// A pool was killed (kill -9) once it dead-lettered job X, and before it
// acked it: X's dead letter is stored, its record says failed, and X is
// still in JOB. dlq retry re-drives X, and the re-drive fails again, so its
// record names the re-drive. X's first copy, delivered again after its ack
// wait, no longer looked dead-lettered already, and ran again. dlq retry
// now removes that copy from JOB before it re-drives.
func TestRedriveOfADeadLetterWhoseCopyWasNotRemovedRunsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{MaxDeliver: 3, AckWait: 2 * time.Second, FetchWait: 200 * time.Millisecond, RetryBackoff: []time.Duration{10 * time.Millisecond}})
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("p"), EnqueueOptions{ID: "X"}); err != nil {
		t.Fatal(err)
	}
	l := data.NewLedger(obj.Ledger, time.Second, obj.JS)
	deadLetterNext(t, obj, l, false)
	l.Close()
	d, err := FindDeadLetter(ctx, obj, "X")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RetryDeadLetter(ctx, obj, d); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ran []uint64
	p := NewPool(obj, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		mu.Lock()
		ran = append(ran, job.Seq)
		mu.Unlock()
		return handlers.Permanent(errors.New("still broken"))
	}), servertest.Logger(t))
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		p.Stop(sctx)
	}()
	// X's first copy comes back after its ack wait, if it is in JOB still.
	time.Sleep(obj.Config.AckWait + time.Second)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ji, jerr := obj.Jobs.Info(ctx)
		ci, cerr := obj.Worker.Info(ctx)
		if jerr == nil && cerr == nil && ji.State.Msgs == 0 && ci.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("JOB still holds jobs after 20s")
		}
	}
	n, err := DeadLetterCount(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != 1 || n != 1 {
		t.Errorf("X ran at JOB sequences %v, and DLQ holds %d dead letters, after one dlq retry; want one run (the re-drive's) and one dead letter", ran, n)
	}
}

// dlq purge while a pool dead-letters jobs: it deletes the dead letters
// stored when it began, and says how many. Purging all of DLQ, it deleted
// those stored meanwhile too, unreported.
func TestPurgeReportsEveryDeadLetterItDeletes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	stop := make(chan struct{})
	var stored uint64
	done := make(chan struct{})
	go func() { // a pool dead-lettering jobs meanwhile
		defer close(done)
		for seq := uint64(1); ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			job := &data.Job{ID: "j", Subject: "job.x", Seq: seq, EnqueuedAt: time.Now()}
			if err := deadLetter(ctx, obj.JS, job, nil, "boom"); err != nil {
				t.Error(err)
				return
			}
			stored++
		}
	}()
	var purged uint64
	for range 50 {
		n, err := PurgeDeadLetters(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		purged += n
		time.Sleep(2 * time.Millisecond)
	}
	close(stop)
	<-done
	left, err := DeadLetterCount(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if purged+left != stored || purged == 0 {
		t.Errorf("%d dead letters stored, %d left in DLQ, and the purges said they deleted %d; want what was stored, left or said deleted", stored, left, purged)
	}
}

// deadLetterNext fetches the next job from WORKER and does what a pool does
// for a job that failed for good, up to its ack, which a kill -9 cuts off
// unless acked.
func deadLetterNext(t *testing.T, obj *Objects, l *data.Ledger, acked bool) {
	t.Helper()
	ctx := context.Background()
	batch, err := obj.Worker.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		n++
		job, err := decodeJob(m)
		if err != nil {
			t.Fatal(err)
		}
		c, err := l.Claim(ctx, job, "w")
		if err != nil {
			t.Fatal(err)
		}
		if err := deadLetter(ctx, obj.JS, job, m.Headers(), "boom"); err != nil {
			t.Fatal(err)
		}
		if err := l.Fail(ctx, &c, 0, "boom"); err != nil {
			t.Fatal(err)
		}
		if acked {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n != 1 {
		t.Fatalf("fetched %d jobs, want 1", n)
	}
}

// A dead letter's headers are what the client that stored it wrote (an
// external worker allowed to publish on dlq.>). Its re-drive was published
// to its Jobq-Subject as is, with the operator's rights: one naming
// $JS.API.STREAM.PURGE.JOB purged every pending job at a click on Retry.
// Such a dead letter is now refused, and stays, and so is one without a
// job ID.
func TestRetryRefusesADeadLetterWithASubjectOutsideJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	prod := NewProducer(obj.JS, obj.Config)
	for i := range 3 {
		if _, err := prod.Enqueue(ctx, "job.pay.charge", []byte(`{}`), EnqueueOptions{ID: fmt.Sprintf("pay-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct{ id, subject, want string }{
		{"pay-refund-7", "$JS.API.STREAM.PURGE." + StreamJob, "its Jobq-Subject header"},
		{"pay-refund-8", SubjectDLQPrefix + "job.pay.charge", "its Jobq-Subject header"},
		{"", "job.pay.charge", "it has no Jobq-Job-Id header"},
	} {
		m := nats.NewMsg(SubjectDLQPrefix + "job.pay.charge")
		m.Header.Set(HeaderJobID, tt.id)
		m.Header.Set(HeaderSubject, tt.subject)
		m.Header.Set(HeaderError, "card declined")
		m.Header.Set(HeaderFailedAt, time.Now().UTC().Format(time.RFC3339Nano))
		ack, err := obj.JS.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		d, err := FindDeadLetter(ctx, obj, strconv.FormatUint(ack.Sequence, 10))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := RetryDeadLetter(ctx, obj, d); err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "jobq dlq rm ") {
			t.Errorf("retry of a dead letter of ID %q on %q: %v; want it refused, %q", tt.id, tt.subject, err, tt.want)
		}
		if _, err := FindDeadLetter(ctx, obj, strconv.FormatUint(ack.Sequence, 10)); err != nil {
			t.Errorf("the refused dead letter is gone: %v", err)
		}
	}
	info, err := obj.Jobs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Errorf("JOB holds %d jobs after the retries, want the 3 pending ones", info.State.Msgs)
	}
}

// A dead letter whose subject JOB no longer takes (its subjects narrowed by
// hand): the retry says so and what to look at, and the dead letter stays.
// It said only "nats: no response from stream".
func TestRetryOfADeadLetterJOBDoesNotTakeSaysSo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	job := &data.Job{ID: "narrowed-1", Subject: "job.old.x", Seq: 1, EnqueuedAt: time.Now()}
	if err := deadLetter(ctx, obj.JS, job, nil, "boom"); err != nil {
		t.Fatal(err)
	}
	cfg := obj.Jobs.CachedInfo().Config
	cfg.Subjects = []string{"job.new.>"}
	if _, err := obj.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	d, err := FindDeadLetter(ctx, obj, "narrowed-1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = RetryDeadLetter(ctx, obj, d)
	if err == nil || !strings.Contains(err.Error(), "no stream took subject job.old.x") || !strings.Contains(err.Error(), "nats stream info JOB") {
		t.Errorf("retry: %v; want it to say no stream took job.old.x, and what to look at", err)
	}
	if _, err := FindDeadLetter(ctx, obj, "narrowed-1"); err != nil {
		t.Errorf("the dead letter is gone: %v", err)
	}
}

// A dead letter of a job recorded done since (another copy of it, under
// its ID, ran and succeeded): its re-drive is acked without running, and
// dlq retry says so. It said only "retried".
func TestRetryOfADoneJobSaysItWillNotRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	job := &data.Job{ID: "done-1", Subject: "job.x", Seq: 7, EnqueuedAt: time.Now()}
	l := data.NewLedger(obj.Ledger, time.Minute, obj.JS)
	defer l.Close()
	c, err := l.Claim(ctx, job, "w")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Done(ctx, &c, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := deadLetter(ctx, obj.JS, job, nil, "boom"); err != nil {
		t.Fatal(err)
	}
	d, err := FindDeadLetter(ctx, obj, "done-1")
	if err != nil {
		t.Fatal(err)
	}
	r, err := RetryDeadLetter(ctx, obj, d)
	if err != nil || !r.Done {
		t.Errorf("retry: %+v, %v; want it re-enqueued, and said done already", r, err)
	}
	other := &data.Job{ID: "failed-1", Subject: "job.x", Seq: 8, EnqueuedAt: time.Now()}
	if err := deadLetter(ctx, obj.JS, other, nil, "boom"); err != nil {
		t.Fatal(err)
	}
	if d, err = FindDeadLetter(ctx, obj, "failed-1"); err != nil {
		t.Fatal(err)
	}
	if r, err := RetryDeadLetter(ctx, obj, d); err != nil || r.Done {
		t.Errorf("retry of a failed job: %+v, %v; want it re-enqueued to run", r, err)
	}
}

// A dead letter removed by another client between its look-up and its
// removal is said to be gone, not reported as the server's failure to
// delete it; the one beside it stays.
func TestRemoveOfADeadLetterRemovedMeanwhileSaysSo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	for i, id := range []string{"rm-1", "rm-2"} {
		if err := deadLetter(ctx, obj.JS, &data.Job{ID: id, Subject: "job.x", Seq: uint64(i + 1)}, nil, "boom"); err != nil {
			t.Fatal(err)
		}
	}
	d, err := FindDeadLetter(ctx, obj, "rm-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := obj.Dead.DeleteMsg(ctx, d.Seq); err != nil { // another client's dlq rm
		t.Fatal(err)
	}
	err = RemoveDeadLetter(ctx, obj, d)
	if !errors.Is(err, ErrNoDeadLetter) || !strings.Contains(err.Error(), "removed meanwhile") {
		t.Errorf("remove of a dead letter removed meanwhile: %v; want %v, removed meanwhile", err, ErrNoDeadLetter)
	}
	if n, err := DeadLetterCount(ctx, obj); err != nil || n != 1 {
		t.Errorf("dead letters left: %d, %v; want rm-2's", n, err)
	}
	if d, err = FindDeadLetter(ctx, obj, "rm-2"); err != nil {
		t.Fatal(err)
	}
	if err := RemoveDeadLetter(ctx, obj, d); err != nil {
		t.Errorf("remove rm-2: %v", err)
	}
	if n, err := DeadLetterCount(ctx, obj); err != nil || n != 0 {
		t.Errorf("dead letters left: %d, %v; want none", n, err)
	}
}

// A removal whose answer was lost (the server deleted the dead letter) is
// done, not said to be another client's.
func TestRemoveWhoseAnswerWasLostIsDone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	if err := deadLetter(ctx, obj.JS, &data.Job{ID: "rm-1", Subject: "job.x", Seq: 1}, nil, "boom"); err != nil {
		t.Fatal(err)
	}
	d, err := FindDeadLetter(ctx, obj, "rm-1")
	if err != nil {
		t.Fatal(err)
	}
	obj.Dead = lostDeleteAnswer{obj.Dead}
	if err := RemoveDeadLetter(ctx, obj, d); err != nil {
		t.Errorf("remove: %v; want it done", err)
	}
	if n, err := DeadLetterCount(ctx, obj); err != nil || n != 0 {
		t.Errorf("dead letters left: %d, %v; want none", n, err)
	}
}

// A removal by job ID that fails part way says how many it removed, and
// that the rest are still there.
func TestRemoveDeadLettersOfThatFailsPartWaySaysHowFarItGot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	for seq := range uint64(3) {
		job := &data.Job{ID: "thrice", Subject: "job.x", Seq: seq + 1, Payload: []byte("x")}
		if err := deadLetter(ctx, obj.JS, job, nil, "boom"); err != nil {
			t.Fatal(err)
		}
	}
	obj.Dead = refusedDelete{Stream: obj.Dead, seq: 2}
	removed, err := RemoveDeadLettersOf(ctx, obj, "thrice")
	if len(removed) != 1 || removed[0].Seq != 1 {
		t.Errorf("removed %+v; want the dead letter at seq 1", removed)
	}
	if err == nil || !strings.Contains(err.Error(), "remove dead letter 2") ||
		!strings.Contains(err.Error(), "1 of job thrice's 3 dead letters were removed before it, the others are still in DLQ") {
		t.Errorf("error: %v; want the refusal, and how far the removal got", err)
	}
	if n, err := DeadLetterCount(ctx, obj); err != nil || n != 2 {
		t.Errorf("dead letters left: %d, %v; want 2", n, err)
	}
}

// refusedDelete is a stream that refuses to delete its message at seq.
type refusedDelete struct {
	jetstream.Stream
	seq uint64
}

func (s refusedDelete) DeleteMsg(ctx context.Context, seq uint64) error {
	if seq == s.seq {
		return errors.New("delete refused")
	}
	return s.Stream.DeleteMsg(ctx, seq)
}

// lostDeleteAnswer is a stream whose message deletes go through and whose
// answers are lost.
type lostDeleteAnswer struct{ jetstream.Stream }

func (s lostDeleteAnswer) DeleteMsg(ctx context.Context, seq uint64) error {
	if err := s.Stream.DeleteMsg(ctx, seq); err != nil {
		return err
	}
	return nats.ErrTimeout
}

// DLQ deleted and made anew between a dead letter's look-up and its
// removal: the dead letter now at its sequence is another's, and stays.
func TestRemoveAfterDLQWasMadeAnewLeavesTheNewDeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	d := deadLetterOfAnEarlierDLQ(t, obj)
	if err := RemoveDeadLetter(ctx, obj, d); !errors.Is(err, ErrNoDeadLetter) || !strings.Contains(err.Error(), "made anew") {
		t.Errorf("removal of old-1's dead letter: %v; want %v, DLQ made anew", err, ErrNoDeadLetter)
	}
	if _, err := DeadLetterOf(ctx, obj, "new-1"); err != nil {
		t.Errorf("new-1's dead letter: %v; want it left in DLQ", err)
	}
}

// Finding or removing a job's dead letters reads the others' headers only:
// a DLQ of large payloads is not downloaded whole.
func TestRemoveDeadLettersOfReadsOthersHeadersOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	payload := make([]byte, 256<<10)
	for i := range 8 {
		job := &data.Job{ID: fmt.Sprintf("big-%d", i), Subject: "job.x", Seq: uint64(i + 1), Payload: payload}
		if err := deadLetter(ctx, obj.JS, job, nil, "boom"); err != nil {
			t.Fatal(err)
		}
	}
	before := obj.JS.Conn().Stats().InBytes
	if d, err := DeadLetterOf(ctx, obj, "big-7"); err != nil || len(d.Payload) != len(payload) {
		t.Fatalf("dead letter of big-7: %v; want it with its payload", err)
	}
	if read := obj.JS.Conn().Stats().InBytes - before; read > 2*uint64(len(payload)) {
		t.Errorf("finding big-7's dead letter read %d bytes, for 8 dead letters of %d; want little more than its own", read, len(payload))
	}
	before = obj.JS.Conn().Stats().InBytes
	removed, err := RemoveDeadLettersOf(ctx, obj, "big-7")
	if err != nil || len(removed) != 1 || removed[0].Seq != 8 {
		t.Fatalf("remove big-7: %+v, %v; want its dead letter at seq 8", removed, err)
	}
	if read := obj.JS.Conn().Stats().InBytes - before; read > 2*uint64(len(payload)) {
		t.Errorf("removing big-7's dead letter read %d bytes, for 8 dead letters of %d; want little more than its own", read, len(payload))
	}
	if _, err := RemoveDeadLettersOf(ctx, obj, ""); !errors.Is(err, ErrNoDeadLetter) {
		t.Errorf("remove the dead letters of an empty ID: %v; want %v", err, ErrNoDeadLetter)
	}
}

// The dead letters' headers are read a batch at a time, to the last one
// stored when the read began; a job ID's dead letter is found by its
// headers, then read whole.
func TestDeadLettersAreFoundPastTheFirstBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	n := summaryBatch + 2
	for i := range n {
		m := nats.NewMsg(SubjectDLQPrefix + "job.x")
		m.Header.Set(HeaderJobID, fmt.Sprintf("d-%d", i))
		m.Data = []byte(fmt.Sprintf("payload of d-%d", i))
		if _, err := obj.JS.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	<-obj.JS.PublishAsyncComplete()
	all, err := ListDeadLetterSummaries(ctx, obj, 0)
	if err != nil || len(all) != n || all[n-1].ID != fmt.Sprintf("d-%d", n-1) || all[n-1].Payload != nil {
		t.Fatalf("summaries: %d, %v; want all %d, the last d-%d, without payloads", len(all), err, n, n-1)
	}
	last := fmt.Sprintf("d-%d", n-1)
	d, err := DeadLetterOf(ctx, obj, last)
	if err != nil || d.Seq != uint64(n) || string(d.Payload) != "payload of "+last {
		t.Errorf("dead letter of %s: %+v, %v; want seq %d with its payload", last, d, err, n)
	}
	if removed, err := RemoveDeadLettersOf(ctx, obj, last); err != nil || len(removed) != 1 || removed[0].Seq != uint64(n) {
		t.Errorf("remove %s: %+v, %v; want its dead letter at seq %d", last, removed, err, n)
	}
}

// DLQ deleted and made anew between a dead letter's look-up and the end of
// its re-drive: the re-drive is stored, and the dead letter now at its
// sequence, another job's, stays.
func TestRetryAfterDLQWasMadeAnewLeavesTheNewDeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	d := deadLetterOfAnEarlierDLQ(t, obj)
	if r, err := RetryDeadLetter(ctx, obj, d); err != nil || r == nil {
		t.Errorf("retry of old-1's dead letter: %+v, %v; want it re-enqueued", r, err)
	}
	if _, err := DeadLetterOf(ctx, obj, "new-1"); err != nil {
		t.Errorf("new-1's dead letter: %v; want it left in DLQ", err)
	}
}

// deadLetterOfAnEarlierDLQ stores job old-1's dead letter at DLQ seq 1 and
// returns it, as looked up, then deletes DLQ and makes it anew, where job
// new-1's dead letter takes seq 1.
func deadLetterOfAnEarlierDLQ(t *testing.T, obj *Objects) DeadLetter {
	t.Helper()
	ctx := context.Background()
	if err := deadLetter(ctx, obj.JS, &data.Job{ID: "old-1", Subject: "job.x", Seq: 1}, nil, "boom"); err != nil {
		t.Fatal(err)
	}
	d, err := DeadLetterAt(ctx, obj, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := obj.JS.DeleteStream(ctx, StreamDLQ); err != nil {
		t.Fatal(err)
	}
	if _, err := obj.JS.CreateStream(ctx, deadStreamConfig(obj.Config)); err != nil {
		t.Fatal(err)
	}
	if err := deadLetter(ctx, obj.JS, &data.Job{ID: "new-1", Subject: "job.x", Seq: 2}, nil, "boom"); err != nil {
		t.Fatal(err)
	}
	return d
}
