package queue_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// streamJob is a stored job as the import test checks it.
type streamJob struct {
	subject, id, payload string
	header               nats.Header
}

// storedJobs reads every job in JOB, in order.
func (b *testBundle) storedJobs(t *testing.T) []streamJob {
	t.Helper()
	st := b.status(t)
	var out []streamJob
	for seq := st.Stream.FirstSeq; seq > 0 && seq <= st.Stream.LastSeq; seq++ {
		m, err := b.obj.Jobs.GetMsg(context.Background(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("read seq %d: %v", seq, err)
		}
		out = append(out, streamJob{subject: m.Subject, id: m.Header.Get(nats.MsgIdHdr), payload: string(m.Data), header: m.Header})
	}
	return out
}

func TestImportLines(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxPayload: 64})
	tests := []struct {
		name, line string
		want       *streamJob // nil: malformed
		reason     string     // in the malformed line's reason
	}{
		{name: "string payload", line: `{"subject":"job.t.str","id":"str-1","payload":"hello \"world\""}`, want: &streamJob{subject: "job.t.str", id: "str-1", payload: `hello "world"`}},
		{name: "object payload", line: `{"subject": "job.t.obj", "id": "obj-1", "payload": {"to": "a@b.c", "n": [1, 2]}}`, want: &streamJob{subject: "job.t.obj", id: "obj-1", payload: `{"to":"a@b.c","n":[1,2]}`}},
		{name: "array payload", line: `{"subject":"job.t.arr","id":"arr-1","payload":[1, "two"]}`, want: &streamJob{subject: "job.t.arr", id: "arr-1", payload: `[1,"two"]`}},
		{name: "base64 payload", line: `{"subject":"job.t.b64","id":"b64-1","payload_base64":"AAEC/w=="}`, want: &streamJob{subject: "job.t.b64", id: "b64-1", payload: "\x00\x01\x02\xff"}},
		{name: "no payload", line: `{"subject":"job.t.empty","id":"empty-1"}`, want: &streamJob{subject: "job.t.empty", id: "empty-1"}},
		{name: "null payload", line: `{"subject":"job.t.null","id":"null-1","payload":null}`, want: &streamJob{subject: "job.t.null", id: "null-1"}},
		{name: "headers", line: `{"subject":"job.t.hdr","id":"hdr-1","headers":{"X-Tenant":"acme","X-Tag":["a","b"]}}`, want: &streamJob{subject: "job.t.hdr", id: "hdr-1", header: nats.Header{"X-Tenant": {"acme"}, "X-Tag": {"a", "b"}}}},
		{name: "odd id and spaces around", line: "  \t{\"subject\":\"job.t.odd\",\"id\":\"order 7/eu ✓\"}\t ", want: &streamJob{subject: "job.t.odd", id: "order 7/eu ✓"}},
		{name: "crlf line end", line: "{\"subject\":\"job.t.crlf\",\"id\":\"crlf-1\"}\r", want: &streamJob{subject: "job.t.crlf", id: "crlf-1"}},
		{name: "bad json", line: `{"subject":"job.x",`, reason: "invalid JSON"},
		{name: "not an object", line: `["job.x"]`, reason: "not a JSON object"},
		{name: "missing subject", line: `{"payload":"x"}`, reason: "missing subject"},
		{name: "subject outside job", line: `{"subject":"foo.bar"}`, reason: `not under "job."`},
		{name: "wildcard subject", line: `{"subject":"job.*"}`, reason: "wildcard"},
		{name: "subject not a string", line: `{"subject":5}`, reason: "subject: want a string"},
		{name: "payload too large", line: `{"subject":"job.x","payload":"` + strings.Repeat("x", 65) + `"}`, reason: "payload too large: 65 bytes, the limit is 64"},
		{name: "bad id", line: `{"subject":"job.x","id":"a\u0001b"}`, reason: "bad job id"},
		{name: "id not a string", line: `{"subject":"job.x","id":7}`, reason: "id: want a string"},
		{name: "payload and base64", line: `{"subject":"job.x","payload":"a","payload_base64":"YQ=="}`, reason: "not both"},
		{name: "bad base64", line: `{"subject":"job.x","payload_base64":"*"}`, reason: "not standard base64"},
		{name: "payload a number", line: `{"subject":"job.x","payload":5}`, reason: "payload_base64"},
		{name: "unknown field", line: `{"subject":"job.x","subjcet":"job.y"}`, reason: `unknown field "subjcet"`},
		{name: "header not a string", line: `{"subject":"job.x","headers":{"X-A":1}}`, reason: "X-A: want a string"},
		{name: "reserved header", line: `{"subject":"job.x","headers":{"Nats-Msg-Id":"x"}}`, reason: "reserved"},
		{name: "header of jobq's own", line: `{"subject":"job.x","headers":{"Jobq-Job-Id":"seq-1"}}`, reason: "Jobq-Job-Id: headers starting with Jobq- are jobq's own"},
		{name: "id of a job published without one", line: `{"subject":"job.x","id":"seq-3"}`, reason: "published without one"},
		{name: "header with line break", line: `{"subject":"job.x","headers":{"X-A":"a\r\nX-B: b"}}`, reason: "line break"},
		// Stored trimmed before, another value than given.
		{name: "header value with spaces around", line: `{"subject":"job.x","headers":{"X-A":"  a  "}}`, reason: "X-A: a value cannot start or end with a space or tab"},
		{name: "header value ending in a tab", line: `{"subject":"job.x","headers":{"X-A":["b","a\t"]}}`, reason: "space or tab"},
		// A fresh ID each run before: run again, the same input stored the
		// job again.
		{name: "empty id", line: `{"subject":"job.x","id":""}`, reason: "id is empty (or null); leave the field out for a fresh ID"},
		{name: "null id", line: `{"subject":"job.x","id":null}`, reason: "id is empty (or null)"},
		{name: "field given twice", line: `{"subject":"job.t.one","id":"twice-1","subject":"job.t.two"}`, reason: `field "subject" given twice`},
		{name: "field given twice, once escaped", line: `{"id":"twice-2","\u0069d":"twice-3","subject":"job.x"}`, reason: `field "id" given twice`},
		{name: "header given twice", line: `{"subject":"job.x","id":"twice-4","headers":{"X-A":"1","X-A":"2"}}`, reason: `headers: "X-A" given twice`},
		{name: "same keys inside values", line: `{"subject":"job.t.nest","id":"nest-1","payload":{"subject":1,"a":{"subject":2},"s":"\"subject\":"},"headers":{"X-A":"subject:"}}`, want: &streamJob{subject: "job.t.nest", id: "nest-1", payload: `{"subject":1,"a":{"subject":2},"s":"\"subject\":"}`, header: nats.Header{"X-A": {"subject:"}}}},
	}
	var in bytes.Buffer
	var wantStored []streamJob
	var wantErrors []queue.LineError
	for i, tt := range tests {
		in.WriteString(tt.line + "\n")
		if i%5 == 0 {
			in.WriteString("\n") // blank lines count for line numbers only
		}
		line := i + 1 + (i+4)/5 // after the blank lines before it
		if tt.want != nil {
			wantStored = append(wantStored, *tt.want)
		} else {
			wantErrors = append(wantErrors, queue.LineError{Line: line, Malformed: true, Reason: tt.reason})
		}
	}
	var progress []queue.ImportSummary
	sum, err := queue.Import(context.Background(), b.prod, &in, queue.ImportOptions{
		Window:    4,
		MaxErrors: len(tests),
		Progress:  func(s queue.ImportSummary) { progress = append(progress, s) },
	})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if sum.Lines != len(tests) || sum.Stored != len(wantStored) || sum.Duplicates != 0 || sum.Malformed != len(wantErrors) || sum.Failed != 0 {
		t.Errorf("got summary %+v, want %d lines, %d stored, %d malformed", sum, len(tests), len(wantStored), len(wantErrors))
	}
	if len(sum.Errors) != len(wantErrors) {
		t.Fatalf("got %d errors listed, want %d: %+v", len(sum.Errors), len(wantErrors), sum.Errors)
	}
	for i, want := range wantErrors {
		got := sum.Errors[i]
		if got.Line != want.Line || !got.Malformed || !strings.Contains(got.Reason, want.Reason) {
			t.Errorf("error %d: got %+v, want line %d, malformed, reason with %q", i, got, want.Line, want.Reason)
		}
	}
	if n := len(progress); n == 0 || progress[n-1].Done() != len(tests) || progress[n-1].Errors != nil {
		t.Errorf("got progress %+v, want a last call with every line done and no errors", progress)
	}

	got := b.storedJobs(t)
	if len(got) != len(wantStored) {
		t.Fatalf("JOB holds %d jobs, want %d: %+v", len(got), len(wantStored), got)
	}
	for i, want := range wantStored {
		g := got[i]
		if g.subject != want.subject || g.id != want.id || g.payload != want.payload {
			t.Errorf("job %d: got %s %q %q, want %s %q %q", i, g.subject, g.id, g.payload, want.subject, want.id, want.payload)
		}
		for k, v := range want.header {
			if !slices.Equal(g.header[k], v) {
				t.Errorf("job %s: header %s: got %q, want %q", want.id, k, g.header[k], v)
			}
		}
	}
}

func TestImportDuplicatesWithinFile(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	in := strings.Join([]string{
		`{"subject":"job.dup","id":"d-1","payload":"first"}`,
		`{"subject":"job.dup","id":"d-2"}`,
		`{"subject":"job.dup","id":"d-1","payload":"second"}`,
		`{"subject":"job.dup","payload":"no id: always new"}`,
		`{"subject":"job.dup","payload":"no id: always new"}`,
		`{"subject":"job.dup","id":"d-1","payload":"third"}`,
	}, "\n")
	sum, err := queue.Import(context.Background(), b.prod, strings.NewReader(in), queue.ImportOptions{})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if sum.Lines != 6 || sum.Stored != 4 || sum.Duplicates != 2 || len(sum.Errors) != 0 {
		t.Errorf("got %+v, want 6 lines, 4 stored, 2 duplicates", sum)
	}
	got := b.storedJobs(t)
	if len(got) != 4 || got[0].id != "d-1" || got[0].payload != "first" {
		t.Errorf("got %+v, want 4 jobs, d-1 with the first payload", got)
	}
}

func TestImportStrictStopsAtFirstBadLine(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	in := strings.Join([]string{
		`{"subject":"job.s","id":"s-1"}`,
		`{"subject":"job.s","id":"s-2"}`,
		``,
		`{"subject":"job.s","id":"s-3"}`,
		`{"subject":"nope","id":"s-4"}`,
		`{"subject":"job.s","id":"s-5"}`,
		`not json`,
	}, "\n")
	sum, err := queue.Import(context.Background(), b.prod, strings.NewReader(in), queue.ImportOptions{Strict: true, Window: 2})
	if !errors.Is(err, queue.ErrMalformed) || !strings.Contains(err.Error(), "line 5") {
		t.Fatalf("got error %v, want ErrMalformed at line 5", err)
	}
	if sum.Lines != 4 || sum.Stored != 3 || sum.Malformed != 1 {
		t.Errorf("got %+v, want 4 lines read, 3 stored, 1 malformed", sum)
	}
	var ids []string
	for _, j := range b.storedJobs(t) {
		ids = append(ids, j.id)
	}
	if want := []string{"s-1", "s-2", "s-3"}; !slices.Equal(ids, want) {
		t.Errorf("JOB holds %q, want %q: nothing after the bad line", ids, want)
	}
}

func TestImportListsFirstErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	var in strings.Builder
	for i := range 30 {
		if i%2 == 0 {
			fmt.Fprintf(&in, "{\"subject\":\"job.e\",\"id\":\"e-%d\"}\n", i)
		} else {
			in.WriteString("{bad\n")
		}
	}
	sum, err := queue.Import(context.Background(), b.prod, strings.NewReader(in.String()), queue.ImportOptions{MaxErrors: 5})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	var lines []int
	for _, e := range sum.Errors {
		lines = append(lines, e.Line)
	}
	if sum.Malformed != 15 || sum.Stored != 15 || !slices.Equal(lines, []int{2, 4, 6, 8, 10}) {
		t.Errorf("got %d malformed, %d stored, lines %v listed; want 15, 15, [2 4 6 8 10]", sum.Malformed, sum.Stored, lines)
	}
}

// A line whose payload is within the importer's --max-payload and over what
// JOB takes (the server's limit is lower) is malformed, as one over
// --max-payload is: sent again, it would be refused again. --strict stops
// there.
func TestImportLineTooLargeForJOBIsMalformed(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	prod := queue.NewProducer(b.js, queue.Config{MaxPayload: 4 << 20}) // over the server's 1 MiB
	in := strings.Join([]string{
		`{"subject":"job.s","id":"ok-1"}`,
		`{"subject":"job.s","id":"big","payload":"` + strings.Repeat("x", 1500<<10) + `"}`,
		`{"subject":"job.s","id":"ok-2"}`,
	}, "\n")
	sum, err := queue.Import(context.Background(), prod, strings.NewReader(in), queue.ImportOptions{})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if sum.Stored != 2 || sum.Malformed != 1 || sum.Failed != 0 || len(sum.Errors) != 1 ||
		!sum.Errors[0].Malformed || sum.Errors[0].Line != 2 || !strings.Contains(sum.Errors[0].Reason, queue.ErrPayloadTooLarge.Error()) {
		t.Errorf("got %+v, want 2 stored and line 2 malformed, payload too large", sum)
	}
	sum, err = queue.Import(context.Background(), prod, strings.NewReader(strings.ReplaceAll(in, "ok-", "strict-")), queue.ImportOptions{Strict: true})
	if !errors.Is(err, queue.ErrMalformed) || !strings.Contains(err.Error(), "line 2") || sum.Stored != 1 {
		t.Errorf("strict: got %+v, %v; want it stopped at line 2, 1 stored", sum, err)
	}
	var ids []string
	for _, j := range b.storedJobs(t) {
		ids = append(ids, j.id)
	}
	if want := []string{"ok-1", "ok-2", "strict-1"}; !slices.Equal(ids, want) {
		t.Errorf("JOB holds %q, want %q", ids, want)
	}
}

// JOB's own limit, which jobq serve's --max-payload set under the
// importer's (on a cluster, the server carries more): a line over it is
// malformed too, once the producer read it off JOB; --strict stops there.
func TestImportLineOverJOBsOwnLimitIsMalformed(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxPayload: 64 << 10})               // jobq serve --max-payload 65536
	prod := queue.NewProducer(b.js, queue.Config{}).JOBLimit(b.obj) // jobq import, its default 1 MiB
	in := strings.Join([]string{
		`{"subject":"job.s","id":"ok-1"}`,
		`{"subject":"job.s","id":"big","payload":"` + strings.Repeat("x", 200<<10) + `"}`,
		`{"subject":"job.s","id":"ok-2"}`,
	}, "\n")
	sum, err := queue.Import(context.Background(), prod, strings.NewReader(in), queue.ImportOptions{})
	if err != nil || sum.Stored != 2 || sum.Malformed != 1 || sum.Failed != 0 || len(sum.Errors) != 1 || !strings.Contains(sum.Errors[0].Reason, "JOB takes at most") {
		t.Errorf("got %+v, %v; want 2 stored and line 2 malformed, saying what JOB takes", sum, err)
	}
	sum, err = queue.Import(context.Background(), prod, strings.NewReader(strings.ReplaceAll(in, "ok-", "strict-")), queue.ImportOptions{Strict: true})
	if !errors.Is(err, queue.ErrMalformed) || !strings.Contains(err.Error(), "line 2") || sum.Stored != 1 {
		t.Errorf("strict: got %+v, %v; want it stopped at line 2, 1 stored", sum, err)
	}
}

// TestImportFullStoreFails fills a small JOB: the publishes it refuses are
// failed lines with the reason, not malformed ones, and the rest is stored.
func TestImportFullStoreFails(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxBytes: 8 << 10})
	var in strings.Builder
	for i := range 100 {
		fmt.Fprintf(&in, "{\"subject\":\"job.full\",\"id\":\"f-%d\",\"payload\":%q}\n", i, strings.Repeat("x", 200))
	}
	sum, err := queue.Import(context.Background(), b.prod, strings.NewReader(in.String()), queue.ImportOptions{Window: 8})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if sum.Failed == 0 || sum.Stored == 0 || sum.Stored+sum.Failed != 100 || sum.Malformed != 0 {
		t.Fatalf("got %+v, want some stored and the rest failed", sum)
	}
	if e := sum.Errors[0]; e.Malformed || !strings.Contains(e.Reason, queue.ErrFull.Error()) {
		t.Errorf("got first error %+v, want a publish failure saying %q", e, queue.ErrFull)
	}
	if got := len(b.storedJobs(t)); got != sum.Stored {
		t.Errorf("JOB holds %d jobs, the summary says %d stored", got, sum.Stored)
	}
}

// An import whose connection closes (the server went away for good) stops
// there and says so, rather than fail each line left one by one.
func TestImportStopsWhenItsConnectionCloses(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	nc := servertest.Connect(t, b.srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var in strings.Builder
	for i := range 10 {
		fmt.Fprintf(&in, "{\"subject\":\"job.gone\",\"id\":\"g-%d\"}\n", i)
	}
	first := strings.Index(in.String(), "\n") + 1
	r := io.MultiReader(strings.NewReader(in.String()[:first]), readerFunc(func([]byte) (int, error) {
		nc.Close() // after line 1
		return 0, io.EOF
	}), strings.NewReader(in.String()[first:]))
	sum, err := queue.Import(context.Background(), queue.NewProducer(js, b.cfg), r, queue.ImportOptions{Window: 1})
	if !errors.Is(err, nats.ErrConnectionClosed) || !strings.Contains(err.Error(), "import stopped at line") || sum.Lines > 2 {
		t.Fatalf("import over a connection that closed after line 1: %+v, %v; want it stopped there, saying so", sum, err)
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

func TestImport5000Lines(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	const n = 5000
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, "{\"subject\":\"job.bulk.%d\",\"id\":\"bulk-%d\",\"payload\":{\"n\":%d}}\n", i%7, i, i)
	}
	total, err := queue.CountLines(strings.NewReader(in.String()))
	if err != nil || total != n {
		t.Fatalf("CountLines: got %d, %v; want %d", total, err, n)
	}
	sum, err := queue.Import(context.Background(), b.prod, strings.NewReader(in.String()), queue.ImportOptions{})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if sum.Lines != n || sum.Stored != n || sum.Done() != n {
		t.Fatalf("got %+v, want %d stored", sum, n)
	}
	got := b.storedJobs(t)
	if len(got) != n {
		t.Fatalf("JOB holds %d jobs, want %d", len(got), n)
	}
	seen := make(map[string]bool, n)
	for _, j := range got {
		var i int
		if _, err := fmt.Sscanf(j.id, "bulk-%d", &i); err != nil {
			t.Fatalf("unexpected job %+v", j)
		}
		if seen[j.id] || j.subject != fmt.Sprintf("job.bulk.%d", i%7) || j.payload != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("job %s: got %s %q (seen before: %t)", j.id, j.subject, j.payload, seen[j.id])
		}
		seen[j.id] = true
	}
}

func TestCountLines(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"\n\n", 0},
		{"a", 1},
		{"a\n", 1},
		{"a\n \t\r\nb\r\n", 2},
		{"a\nb\nc", 3},
	}
	for _, tt := range tests {
		if got, err := queue.CountLines(strings.NewReader(tt.in)); err != nil || got != tt.want {
			t.Errorf("CountLines(%q): got %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

// Every ack lost (an ack timeout shorter than any round trip): each line
// is sent again under its ID, and JOB holds each job once. A re-sent line
// found stored counts as a duplicate, as jobq cannot tell its own lost
// send from an earlier job's; none fails.
func TestImportLostAcksStoreEachJobOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	const n = 20
	var lines []string
	for i := range n {
		lines = append(lines, fmt.Sprintf(`{"subject":"job.lost","id":"lost-%d","payload":"x"}`, i))
	}
	lines = append(lines, `{"subject":"job.lost","id":"lost-0","payload":"again"}`)
	sum, err := queue.Import(context.Background(), b.prod, strings.NewReader(strings.Join(lines, "\n")),
		queue.ImportOptions{AckTimeout: time.Nanosecond})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if got := len(b.storedJobs(t)); got != n {
		t.Errorf("JOB holds %d jobs, want %d, each stored once", got, n)
	}
	if sum.Lines != n+1 || sum.Stored+sum.Duplicates != n+1 || sum.Failed != 0 {
		t.Errorf("summary %+v: want every one of %d lines stored or a duplicate", sum, n+1)
	}
}

// cancelAfter is a reader of lines that cancels ctx once all of them were
// read, as a Ctrl-C right after them would.
type cancelAfter struct {
	r      *strings.Reader
	cancel context.CancelFunc
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	if c.r.Len() > 0 {
		return c.r.Read(p)
	}
	// Every line was read and handed on: the user stops the import while
	// it waits for more input.
	c.cancel()
	time.Sleep(time.Second)
	return 0, io.EOF
}

// Ctrl-C during an import whose acks are late: the lines published are
// settled and summed up (README). A job that JOB holds was summed up as
// failed, its re-send made with the stopped ctx.
func TestImportStoppedSumsUpStoredJobsAsStored(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	const n = 5
	var lines []string
	for i := range n {
		lines = append(lines, fmt.Sprintf(`{"subject":"job.stop","id":"stop-%d"}`, i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in := &cancelAfter{r: strings.NewReader(strings.Join(lines, "\n") + "\n"), cancel: cancel}
	sum, err := queue.Import(ctx, b.prod, in, queue.ImportOptions{AckTimeout: time.Nanosecond})
	if err == nil {
		t.Fatalf("import: no error after the stop")
	}
	stored := 0
	for deadline := time.Now().Add(2 * time.Second); stored < n && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		stored = len(b.storedJobs(t))
	}
	if stored != n {
		t.Fatalf("JOB holds %d jobs, want the %d read before the stop; summary %+v", stored, n, sum)
	}
	if sum.Failed != 0 || sum.Stored+sum.Duplicates != n {
		t.Errorf("summary %+v: want all %d stored or duplicates, as JOB holds them", sum, n)
	}
}

// silentJOB narrows JOB's subjects, until t ends, so that JOB does not
// answer for job.silent, and returns n lines of jobs on it.
func silentJOB(t *testing.T, b *testBundle, n int) []string {
	t.Helper()
	cfg := b.obj.Jobs.CachedInfo().Config
	narrowed := cfg
	narrowed.Subjects = []string{"job.other.>"}
	if _, err := b.js.UpdateStream(context.Background(), narrowed); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = b.js.UpdateStream(context.Background(), cfg) })
	lines := make([]string, n)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"subject":"job.silent","id":"silent-%d"}`, i)
	}
	return lines
}

// Ctrl-C while JOB does not answer (its subjects narrowed here; a cluster
// without a leader for JOB, a server restarting): the late lines' re-sends
// share one bound, so the stop takes about an ack timeout and that bound.
// Each had a bound of its own, one after another: 16 lines took over 16s,
// the default window of 256 over 20 minutes.
func TestImportStopWhileJOBIsSilentEndsWithinOneBound(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	const n = 16
	lines := silentJOB(t, b, n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stopped time.Time
	in := &cancelAfter{r: strings.NewReader(strings.Join(lines, "\n") + "\n"), cancel: func() { stopped = time.Now(); cancel() }}
	sum, err := queue.Import(ctx, b.prod, in, queue.ImportOptions{AckTimeout: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "import stopped") {
		t.Fatalf("import: %v, want stopped", err)
	}
	// The reader sleeps a second after the stop; then an ack timeout and
	// one bound of a second, with room for a slow machine.
	if took := time.Since(stopped); took > 6*time.Second {
		t.Errorf("the import ended %v after the stop, want within about 2.2s; summary %+v", took.Round(100*time.Millisecond), sum)
	}
}

// JOB does not answer (its subjects narrowed here; a cluster without a
// leader for JOB, a stalled store), and nobody stops the import: it stops
// at the first line whose re-sends go unanswered too, and settles the lines
// in flight within one bound. It went on, each line after its own retries,
// one after another: 8 lines took 32s, a file of 10,000 hours.
func TestImportWhileJOBIsSilentStopsAtTheFirstUnansweredLine(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	const n = 12
	lines := silentJOB(t, b, n)
	start := time.Now()
	sum, err := queue.Import(context.Background(), b.prod, strings.NewReader(strings.Join(lines, "\n")), queue.ImportOptions{Window: 2, AckTimeout: 200 * time.Millisecond})
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "import stopped at line") || !strings.Contains(err.Error(), "run the same input again") {
		t.Errorf("import: %v; want it stopped, saying to run the same input again", err)
	}
	if sum.Lines >= n || sum.Failed != sum.Lines || sum.Stored != 0 {
		t.Errorf("summary %+v: want it stopped before the last of %d lines, each line read failed", sum, n)
	}
	// One line's retries, then one bound for the lines in flight.
	if took > 15*time.Second {
		t.Errorf("import of %d lines against a JOB that does not answer took %v", n, took.Round(100*time.Millisecond))
	}
}

// A file that starts with a UTF-8 byte order mark, as Windows tools write
// one: its first line is a job like the others. It was malformed, "not a
// JSON object".
func TestImportSkipsAByteOrderMark(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	in := "\uFEFF" + `{"subject":"job.bom","id":"bom-1"}` + "\n" + `{"subject":"job.bom","id":"bom-2"}` + "\n"
	sum, err := queue.Import(context.Background(), b.prod, strings.NewReader(in), queue.ImportOptions{})
	if err != nil || sum.Stored != 2 || sum.Malformed != 0 {
		t.Errorf("import: %+v, %v; want both lines stored", sum, err)
	}
	if got := b.storedJobs(t); len(got) != 2 || got[0].id != "bom-1" {
		t.Errorf("JOB holds %+v, want bom-1 and bom-2", got)
	}
}
