//go:build unix

package main

// End-to-end tests: each runs the jobq binary as subprocesses, `jobq serve`
// on a store in t.TempDir() and the client commands against it, the way a
// user would. TestMain builds the binary once, with the race detector, so the
// subprocesses are checked for races too (a race makes them exit 66).
//
// Golden files of --json output live in testdata/; rewrite them with
//
//	go test -run 'TestCLI' -update .

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server"
	"github.com/jobq/jobq/server/servertest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// jobqBin is the race-enabled jobq binary that TestMain builds.
var jobqBin string

// How long the tests wait for things that normally take well under a second,
// generous for a loaded machine running race-enabled binaries.
const (
	readyTimeout = 60 * time.Second
	waitTimeout  = 30 * time.Second
	stopTimeout  = 60 * time.Second
	pollInterval = 25 * time.Millisecond
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "jobq-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "make temp dir: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	jobqBin = filepath.Join(dir, "jobq")
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	build := exec.Command(goTool, "build", "-race", "-o", jobqBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build jobq with -race: %v\n", err)
		return 1
	}
	return m.Run()
}

// ---- running commands ---------------------------------------------------

// subprocessEnv is the environment of every subprocess: the test's own
// without JOBQ_ and NATS_ variables, so a developer's shell cannot change
// what is tested, plus extra. GORACE drops the race detector's one-second
// sleep at exit and makes a race end the process at once.
func subprocessEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "JOBQ_") || strings.HasPrefix(kv, "NATS_") || strings.HasPrefix(kv, "GORACE=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "GORACE=atexit_sleep_ms=0 halt_on_error=1")
	return append(env, extra...)
}

// result is what a finished command left behind.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// cmdInput is the optional input of a command.
type cmdInput struct {
	stdin   string        // empty: /dev/null
	env     []string      // KEY=VALUE added to subprocessEnv
	timeout time.Duration // 0: 2 minutes
}

// runCmd runs name with args to its end, at most in.timeout, and returns its
// output and exit status.
func runCmd(t *testing.T, in cmdInput, name string, args ...string) result {
	t.Helper()
	if in.timeout == 0 {
		in.timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), in.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = subprocessEnv(in.env...)
	if in.stdin != "" {
		cmd.Stdin = strings.NewReader(in.stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s %q still running after %s; killed it\n%s", filepath.Base(name), args, in.timeout, r)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run %s %q: %v", filepath.Base(name), args, err)
	}
	if strings.Contains(r.stderr, "WARNING: DATA RACE") {
		t.Errorf("%s %q: data race\n%s", filepath.Base(name), args, r.stderr)
	}
	return r
}

// jobq runs the jobq binary with args.
func jobq(t *testing.T, args ...string) result {
	t.Helper()
	return runCmd(t, cmdInput{}, jobqBin, args...)
}

// wantOneLineError checks that r is a failure with exit status code, nothing
// on stdout and one line on stderr, "jobq: " and a message holding each of
// want.
func wantOneLineError(t *testing.T, r result, code int, want ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("got exit status %d, want %d\n%s", r.code, code, r)
	}
	if r.stdout != "" {
		t.Errorf("got stdout %q, want none", r.stdout)
	}
	if !strings.HasPrefix(r.stderr, "jobq: ") || !strings.HasSuffix(r.stderr, "\n") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("got stderr %q, want one line starting with \"jobq: \"", r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("got stderr %q, want it to mention %q", r.stderr, w)
		}
	}
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freeAddrs(t, 1)[0]
}

// freeAddrs returns n different loopback addresses with ports that were free
// a moment ago: all are held open until each is found.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

// checkFor calls f until it returns nil, every sleep, and fails the test with
// f's last error after total (nats-server's checkFor).
func checkFor(t *testing.T, total, sleep time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %s: %v", total, err)
		}
		time.Sleep(sleep)
	}
}

// shq quotes s for sh.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// lines returns the lines of file path, none if it does not exist.
func lines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// ---- jobq serve -----------------------------------------------------------

// serveOpts configures a `jobq serve` subprocess.
type serveOpts struct {
	dir  string   // store dir; empty: a new t.TempDir()
	args []string // more flags, such as --handler
	env  []string // KEY=VALUE added to its environment
}

// jobqServer is a `jobq serve` subprocess. t.Cleanup stops it with SIGTERM
// and checks that it exits 0, unless the test stopped or killed it.
type jobqServer struct {
	t       *testing.T
	dir     string // store dir
	url     string // nats://host:port of its client port
	httpURL string // http://host:port of its health endpoints
	logPath string // its stdout and stderr
	cmd     *exec.Cmd
	done    chan struct{}    // closed once it exited
	state   *os.ProcessState // set before done is closed
	ended   bool             // the test stopped or killed it
	// clientFlags are added to its client commands (see jobqIn), such as
	// the credentials it requires.
	clientFlags []string
}

// startServe starts `jobq serve` on free loopback ports, JSON debug logs
// going to a file, and waits until /readyz answers 200.
func startServe(t *testing.T, o serveOpts) *jobqServer {
	t.Helper()
	if o.dir == "" {
		o.dir = t.TempDir()
	}
	for attempt := 1; ; attempt++ {
		s := launchServe(t, o)
		err := s.waitReady(readyTimeout)
		if err == nil {
			return s
		}
		if s.exited() {
			s.ended = true // reported here, not again by cleanup
			if attempt < 3 && strings.Contains(s.logText(), "address already in use") {
				// Another process took a port between freeAddrs and serve.
				t.Logf("jobq serve lost a port, starting it again: %v", err)
				continue
			}
		}
		t.Fatalf("jobq serve: %v\nlog %s:\n%s", err, s.logPath, s.logTail(60))
	}
}

func launchServe(t *testing.T, o serveOpts) *jobqServer {
	t.Helper()
	addrs := freeAddrs(t, 2)
	natsAddr, httpAddr := addrs[0], addrs[1]
	logPath := filepath.Join(t.TempDir(), "serve.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("create serve log: %v", err)
	}
	defer logf.Close() // the child has its own descriptor
	args := append([]string{
		"serve", "--store-dir", o.dir, "--listen", natsAddr, "--http", httpAddr,
		"--log-format", "json", "--log-level", "debug",
	}, o.args...)
	cmd := exec.Command(jobqBin, args...)
	cmd.Env = subprocessEnv(o.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start jobq serve: %v", err)
	}
	s := &jobqServer{
		t: t, dir: o.dir, url: "nats://" + natsAddr, httpURL: "http://" + httpAddr,
		logPath: logPath, cmd: cmd, done: make(chan struct{}),
	}
	go func() {
		_ = cmd.Wait() // the exit status is in ProcessState
		s.state = cmd.ProcessState
		close(s.done)
	}()
	t.Cleanup(s.cleanup)
	return s
}

func (s *jobqServer) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *jobqServer) waitReady(timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if s.exited() {
			return fmt.Errorf("exited before it was ready: %s", s.state)
		}
		resp, err := client.Get(s.httpURL + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /readyz: %s", resp.Status)
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %v", timeout, last)
		}
		select {
		case <-s.done:
		case <-time.After(pollInterval):
		}
	}
}

func (s *jobqServer) cleanup() {
	if !s.ended {
		if s.exited() {
			s.t.Errorf("jobq serve exited before the test stopped it: %s", s.state)
		} else {
			s.Stop(s.t)
		}
	}
	if s.t.Failed() {
		s.t.Logf("jobq serve log %s, its last lines (nats debug lines left out):\n%s", s.logPath, s.logTail(60))
	}
}

// Stop sends SIGTERM, waits for the process to end and checks that it exited
// 0. It returns how long the shutdown took.
func (s *jobqServer) Stop(t *testing.T) time.Duration {
	t.Helper()
	s.ended = true
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("send SIGTERM to jobq serve: %v", err)
	}
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.done
		t.Errorf("jobq serve still running %s after SIGTERM; killed it", stopTimeout)
		return time.Since(start)
	}
	took := time.Since(start)
	if code := s.state.ExitCode(); code != 0 {
		t.Errorf("jobq serve after SIGTERM: got %s, want exit status 0", s.state)
	}
	if strings.Contains(s.logText(), "WARNING: DATA RACE") {
		t.Errorf("jobq serve: data race, see %s", s.logPath)
	}
	return took
}

// Kill sends SIGKILL and waits for the process to end.
func (s *jobqServer) Kill(t *testing.T) {
	t.Helper()
	s.ended = true
	if err := s.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("kill jobq serve: %v", err)
	}
	<-s.done
}

func (s *jobqServer) logText() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

// logTail returns the last n lines of the log, without nats-server's debug
// lines.
func (s *jobqServer) logTail(n int) string {
	var keep []string
	sc := bufio.NewScanner(strings.NewReader(s.logText()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l := sc.Text(); !strings.HasPrefix(l, `{"level":"debug","component":"nats"`) {
			keep = append(keep, l)
		}
	}
	if len(keep) > n {
		keep = keep[len(keep)-n:]
	}
	return strings.Join(keep, "\n")
}

// jobq runs a client command against s: args and --server.
func (s *jobqServer) jobq(t *testing.T, args ...string) result {
	t.Helper()
	return s.jobqIn(t, "", args...)
}

// jobqIn runs a client command against s with stdin.
func (s *jobqServer) jobqIn(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return runCmd(t, cmdInput{stdin: stdin}, jobqBin, withFlags(args, append([]string{"--server", s.url}, s.clientFlags...)...)...)
}

// withFlags returns args with flags added after the arguments, the way people
// type them (jobq job ID --json), but before a "--".
func withFlags(args []string, flags ...string) []string {
	at := slices.Index(args, "--")
	if at < 0 {
		at = len(args)
	}
	return slices.Insert(slices.Clone(args), at, flags...)
}

// mustJobq runs a client command that must succeed and returns its stdout.
func (s *jobqServer) mustJobq(t *testing.T, args ...string) string {
	t.Helper()
	r := s.jobq(t, args...)
	if r.code != 0 {
		t.Fatalf("jobq %q: got %s", args, r)
	}
	return r.stdout
}

// jobqJSON runs a client command with --json that must succeed and decodes
// its output into v, refusing fields v does not know.
func (s *jobqServer) jobqJSON(t *testing.T, v any, args ...string) []byte {
	t.Helper()
	out := s.mustJobq(t, append(args, "--json")...)
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("jobq %q --json: decode %q: %v", args, out, err)
	}
	return []byte(out)
}

// ---- the --json shapes, written out here as the contract -------------------

type enqueueOut struct {
	Stream    string `json:"stream"`
	Seq       uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate"`
}

type jobOut struct {
	ID      string              `json:"id"`
	Subject string              `json:"subject"`
	Seq     uint64              `json:"seq"`
	Attempt int                 `json:"attempt"`
	Resumed bool                `json:"resumed"`
	Headers map[string][]string `json:"headers"`
	Payload string              `json:"payload"`
}

type recordOut struct {
	ID         string    `json:"id"`
	State      string    `json:"state"`
	Subject    string    `json:"subject"`
	Seq        uint64    `json:"seq"`
	Attempts   int       `json:"attempts"`
	Worker     string    `json:"worker"`
	Lease      string    `json:"lease"`
	Resumed    bool      `json:"resumed"`
	LeaseUntil time.Time `json:"lease_until"`
	FirstAt    time.Time `json:"first_at"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	TookNS     int64     `json:"took_ns"`
	LastError  string    `json:"last_error"`
	StoredAt   time.Time `json:"stored_at"`
}

type streamOut struct {
	Name         string `json:"name"`
	Messages     uint64 `json:"messages"`
	Bytes        uint64 `json:"bytes"`
	FirstSeq     uint64 `json:"first_seq"`
	LastSeq      uint64 `json:"last_seq"`
	DedupeWindow string `json:"dedupe_window"`
}

type statusOut struct {
	Stream   streamOut `json:"stream"`
	Consumer struct {
		Name        string `json:"name"`
		Pending     uint64 `json:"pending"`
		AckPending  int    `json:"ack_pending"`
		Redelivered int    `json:"redelivered"`
		Waiting     int    `json:"waiting_pulls"`
		MaxDeliver  int    `json:"max_deliver"`
		AckWait     string `json:"ack_wait"`
	} `json:"consumer"`
	DLQ    streamOut `json:"dlq"`
	Ledger struct {
		Bucket  string `json:"bucket"`
		Records uint64 `json:"records"`
		Leases  uint64 `json:"leases"`
		Bytes   uint64 `json:"bytes"`
		TTL     string `json:"ttl"`
	} `json:"ledger"`
}

// counts are the numbers of status that move as jobs flow.
type counts struct {
	Messages, Pending, Records, DLQ uint64
}

func (st statusOut) counts() counts {
	return counts{st.Stream.Messages, st.Consumer.Pending, st.Ledger.Records, st.DLQ.Messages}
}

type deadLetterOut struct {
	DLQSeq   uint64              `json:"dlq_seq"`
	ID       string              `json:"id"`
	Subject  string              `json:"subject"`
	JobSeq   uint64              `json:"job_seq"`
	Attempts int                 `json:"attempts"`
	Error    string              `json:"error"`
	FailedAt time.Time           `json:"failed_at"`
	Headers  map[string][]string `json:"headers"`
	Payload  *string             `json:"payload"`
}

// ---- client helpers ---------------------------------------------------------

func (s *jobqServer) enqueue(t *testing.T, subject, payload, id string, more ...string) enqueueOut {
	t.Helper()
	var out enqueueOut
	s.jobqJSON(t, &out, append([]string{"enqueue", subject, payload, "--id", id}, more...)...)
	if out.Stream != "JOB" || out.Duplicate {
		t.Fatalf("enqueue %s: got %+v, want stream JOB, not a duplicate", id, out)
	}
	return out
}

func (s *jobqServer) next(t *testing.T, more ...string) jobOut {
	t.Helper()
	var j jobOut
	s.jobqJSON(t, &j, append([]string{"next", "--wait", "20s"}, more...)...)
	return j
}

func (s *jobqServer) status(t *testing.T) statusOut {
	t.Helper()
	var st statusOut
	s.jobqJSON(t, &st, "status")
	return st
}

// waitCounts polls status until its counts are want.
func (s *jobqServer) waitCounts(t *testing.T, want counts) statusOut {
	t.Helper()
	var st statusOut
	checkFor(t, waitTimeout, 50*time.Millisecond, func() error {
		st = s.status(t)
		if got := st.counts(); got != want {
			return fmt.Errorf("status counts: got %+v, want %+v", got, want)
		}
		return nil
	})
	return st
}

// record returns job id's ledger record, or false if it has none.
func (s *jobqServer) record(t *testing.T, id string) (recordOut, bool) {
	t.Helper()
	r := s.jobq(t, "job", id, "--json")
	if r.code == 1 && strings.Contains(r.stderr, "no ledger record") {
		return recordOut{}, false
	}
	if r.code != 0 {
		t.Fatalf("jobq job %s: got %s", id, r)
	}
	var rec recordOut
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		t.Fatalf("jobq job %s --json: decode %q: %v", id, r.stdout, err)
	}
	return rec, true
}

// waitState polls the ledger until job id's record has state.
func (s *jobqServer) waitState(t *testing.T, id, state string) recordOut {
	t.Helper()
	var rec recordOut
	checkFor(t, waitTimeout, 50*time.Millisecond, func() error {
		var ok bool
		rec, ok = s.record(t, id)
		switch {
		case !ok:
			return fmt.Errorf("job %s: no ledger record yet, want state %s", id, state)
		case rec.State != state:
			return fmt.Errorf("job %s: got state %s, want %s (record %+v)", id, rec.State, state, rec)
		}
		return nil
	})
	return rec
}

// ---- golden files -----------------------------------------------------------

// volatile are --json fields whose values change from run to run; golden
// files hold a placeholder for them.
var volatile = map[string]bool{
	"first_at": true, "started_at": true, "finished_at": true, "failed_at": true, "stored_at": true,
	"lease_until": true, "took_ns": true, "worker": true, "lease": true, "bytes": true,
}

// golden compares JSON output with testdata/NAME, volatile fields replaced
// and keys sorted; -update rewrites the file.
func golden(t *testing.T, name string, out []byte) {
	t.Helper()
	var v any
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("golden %s: decode %q: %v", name, out, err)
	}
	var scrub func(any) any
	scrub = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if volatile[k] {
					v[k] = "<" + k + ">"
				} else {
					v[k] = scrub(x)
				}
			}
		case []any:
			for i, x := range v {
				v[i] = scrub(x)
			}
		}
		return v
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(scrub(v)); err != nil {
		t.Fatalf("golden %s: %v", name, err)
	}
	got := buf.Bytes()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file: %v; create it with go test -run '%s' -update .", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("--json output differs from %s (go test -update rewrites it)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// ---- enqueue ------------------------------------------------------------------

func TestCLIEnqueue(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{}) // broker mode: jobs stay until next takes them
	payloadFile := filepath.Join(t.TempDir(), "payload.json")
	if err := os.WriteFile(payloadFile, []byte(`{"from":"file"}`), 0o644); err != nil {
		t.Fatal(err)
	}

	// The subtests run one after another: each takes the job it enqueued.
	t.Run("payload", func(t *testing.T) {
		tests := []struct {
			name    string
			subject string
			args    []string // after "enqueue"
			stdin   string
			want    string
		}{
			{name: "argument", subject: "job.src.arg", args: []string{"job.src.arg", `{"from":"argument"}`}, want: `{"from":"argument"}`},
			{name: "file", subject: "job.src.file", args: []string{"job.src.file", "--file", payloadFile}, want: `{"from":"file"}`},
			{name: "file short flag", subject: "job.src.file", args: []string{"job.src.file", "-f", payloadFile}, want: `{"from":"file"}`},
			{name: "stdin", subject: "job.src.stdin", args: []string{"job.src.stdin"}, stdin: "{\"from\":\"stdin\"}\n", want: "{\"from\":\"stdin\"}\n"},
			{name: "empty stdin", subject: "job.src.empty", args: []string{"job.src.empty"}, want: ""},
			{name: "flags first", subject: "job.src.flags", args: []string{"-H", "a=b", "--max-payload", "10", "job.src.flags", "x"}, want: "x"},
			{name: "flags between", subject: "job.src.flags", args: []string{"job.src.flags", "-H", "a=b", "x"}, want: "x"},
			{name: "payload after --", subject: "job.src.dash", args: []string{"job.src.dash", "--", "-5"}, want: "-5"},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				id := "src-" + strconv.Itoa(i)
				args := withFlags(append([]string{"enqueue"}, tt.args...), "--id", id, "--json")
				r := s.jobqIn(t, tt.stdin, args...)
				if r.code != 0 {
					t.Fatalf("enqueue: got %s", r)
				}
				var e enqueueOut
				if err := json.Unmarshal([]byte(r.stdout), &e); err != nil {
					t.Fatalf("decode %q: %v", r.stdout, err)
				}
				j := s.next(t)
				if j.ID != id || j.Seq != e.Seq || j.Subject != tt.subject {
					t.Errorf("next: got id %s, seq %d, subject %s; want %s, %d, %s", j.ID, j.Seq, j.Subject, id, e.Seq, tt.subject)
				}
				if j.Payload != tt.want {
					t.Errorf("next: got payload %q, want %q", j.Payload, tt.want)
				}
			})
		}
	})

	t.Run("json fields", func(t *testing.T) {
		out := s.mustJobq(t, "enqueue", "job.fields", "x", "--id", "fields-1", "--json")
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("decode %q: %v", out, err)
		}
		keys := slices.Sorted(maps.Keys(m))
		if want := []string{"duplicate", "seq", "stream"}; !slices.Equal(keys, want) {
			t.Errorf("enqueue --json: got fields %q, want %q", keys, want)
		}
		if m["stream"] != "JOB" || m["duplicate"] != false {
			t.Errorf("enqueue --json: got %v, want stream JOB, duplicate false", m)
		}
		if seq, ok := m["seq"].(float64); !ok || seq < 1 {
			t.Errorf("enqueue --json: got seq %v, want a number >= 1", m["seq"])
		}
		s.next(t)
	})

	t.Run("same id twice", func(t *testing.T) {
		first := s.mustJobq(t, "enqueue", "job.dup", "one", "--id", "dup-1")
		second := s.mustJobq(t, "enqueue", "job.dup", "two", "--id", "dup-1")
		seq := strings.TrimSuffix(strings.TrimPrefix(first, "stream: JOB\nseq: "), "\nduplicate: false\n")
		if _, err := strconv.ParseUint(seq, 10, 64); err != nil {
			t.Fatalf("first enqueue: got %q, want stream: JOB, seq: N, duplicate: false", first)
		}
		if want := "stream: JOB\nseq: " + seq + "\nduplicate: true\n"; second != want {
			t.Errorf("second enqueue: got %q, want %q", second, want)
		}
		var again enqueueOut
		s.jobqJSON(t, &again, "enqueue", "job.dup", "three", "--id", "dup-1")
		if want := (enqueueOut{Stream: "JOB", Seq: again.Seq, Duplicate: true}); again != want || strconv.FormatUint(again.Seq, 10) != seq {
			t.Errorf("third enqueue --json: got %+v, want duplicate of seq %s", again, seq)
		}
		if st := s.status(t); st.Stream.Messages != 1 {
			t.Errorf("status: got %d messages, want 1", st.Stream.Messages)
		}
		if j := s.next(t); j.ID != "dup-1" || j.Payload != "one" {
			t.Errorf("next: got %s %q, want dup-1 %q", j.ID, j.Payload, "one")
		}
		wantOneLineError(t, s.jobq(t, "next", "--wait", "200ms"), 1, "no job")
	})

	t.Run("headers", func(t *testing.T) {
		s.enqueue(t, "job.hdr", "x", "hdr-1", "-H", "k=v", "-H", "trace-id=abc", "-H", "k=w", "-H", "eq=a=b")
		j := s.next(t)
		for k, want := range map[string][]string{"k": {"v", "w"}, "trace-id": {"abc"}, "eq": {"a=b"}, "Nats-Msg-Id": {"hdr-1"}} {
			if got := j.Headers[k]; !slices.Equal(got, want) {
				t.Errorf("header %s: got %q, want %q (all: %v)", k, got, want, j.Headers)
			}
		}
	})

	t.Run("payload too large", func(t *testing.T) {
		r := s.jobq(t, "enqueue", "job.big", strings.Repeat("x", 101), "--max-payload", "100")
		wantOneLineError(t, r, 2, "payload too large", "--max-payload")
	})
}

// ---- next ---------------------------------------------------------------------

func TestCLINext(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	s.enqueue(t, "job.next", "first", "n-1")
	s.enqueue(t, "job.next", "second", "n-2")

	// --no-ack shows the job and leaves it, and the ledger, as they were.
	if j := s.next(t, "--no-ack"); j.ID != "n-1" || j.Attempt != 1 || j.Payload != "first" {
		t.Errorf("next --no-ack: got %+v, want n-1, attempt 1, payload first", j)
	}
	if _, ok := s.record(t, "n-1"); ok {
		t.Errorf("after next --no-ack: job n-1 has a ledger record, want none")
	}
	if got := s.status(t).counts(); got.Messages != 2 || got.Records != 0 {
		t.Errorf("after next --no-ack: got %+v, want 2 messages, 0 records", got)
	}

	// The next next gets the same job and records it done. The peek
	// delivered nothing, so this is the job's first attempt, not resumed.
	out := s.jobqJSON(t, new(jobOut), "next", "--wait", "20s")
	golden(t, "next.json", out)
	rec := s.waitState(t, "n-1", "done")
	if rec.Attempts != 1 || rec.Resumed || rec.Worker == "" || rec.Lease == "" || rec.Seq != 1 || rec.FinishedAt.IsZero() || rec.LastError != "" {
		t.Errorf("job n-1: got %+v, want done, 1 attempt, not resumed, a worker and a lease, seq 1, finished, no error", rec)
	}
	st := s.status(t)
	if got, want := st.counts(), (counts{Messages: 1, Pending: 1, Records: 1}); got != want || st.Consumer.AckPending != 0 {
		t.Errorf("after next: got %+v, %d ack pending; want %+v, 0 ack pending", got, st.Consumer.AckPending, want)
	}

	// Plain text output.
	text := s.mustJobq(t, "next")
	for _, want := range []string{"id: n-2\n", "subject: job.next\n", "seq: 2\n", "attempt: 1\n", "\nsecond\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("next: got %q, want it to contain %q", text, want)
		}
	}
	s.waitState(t, "n-2", "done")

	// Nothing waiting.
	start := time.Now()
	wantOneLineError(t, s.jobq(t, "next", "--wait", "300ms"), 1, "no job on JOB WORKER within 300ms")
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("next --wait 300ms took %s", took)
	}
	wantOneLineError(t, s.jobq(t, "next", "--no-ack", "--wait", "200ms"), 1, "no job")
}

// ---- status ---------------------------------------------------------------------

func TestCLIStatus(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServe(t, serveOpts{dir: dir})
	out := s.jobqJSON(t, new(statusOut), "status")
	golden(t, "status_empty.json", out)

	s.enqueue(t, "job.ok", "1", "s-ok-1")
	s.enqueue(t, "job.ok", "2", "s-ok-2")
	s.enqueue(t, "job.bad", "3", "s-bad-1")
	if got, want := s.status(t).counts(), (counts{Messages: 3, Pending: 3}); got != want {
		t.Errorf("after 3 enqueues: got %+v, want %+v", got, want)
	}
	s.next(t)
	if got, want := s.status(t).counts(), (counts{Messages: 2, Pending: 2, Records: 1}); got != want {
		t.Errorf("after next: got %+v, want %+v", got, want)
	}
	text := s.mustJobq(t, "status")
	for _, want := range []string{"stream JOB", "2 jobs", "consumer WORKER", "dead letters DLQ", "ledger processed", "1 records"} {
		if !strings.Contains(text, want) {
			t.Errorf("status: got %q, want it to contain %q", text, want)
		}
	}
	s.Stop(t)

	s = startServe(t, serveOpts{dir: dir, args: []string{
		"--handler", "job.ok=exec:cat >/dev/null",
		"--handler", "job.bad=exec:exit 65",
	}})
	st := s.waitCounts(t, counts{Records: 3, DLQ: 1})
	if st.Consumer.AckPending != 0 || st.Stream.LastSeq != 3 {
		t.Errorf("after processing: got %d ack pending, last seq %d; want 0, 3", st.Consumer.AckPending, st.Stream.LastSeq)
	}
}

// ---- job ------------------------------------------------------------------------

func TestCLIJob(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{args: []string{
		"--handler", "job.ok=exec:cat >/dev/null",
		"--handler", `job.bad=exec:echo "cannot parse the input" >&2; exit 65`,
	}})
	s.enqueue(t, "job.ok", "fine", "ok-1")
	s.enqueue(t, "job.bad", "broken", "bad-1")
	odd := "order/42 é:\"x\"" // not a plain key: stored under its encoding
	s.enqueue(t, "job.ok", "fine", odd)

	done := s.waitState(t, "ok-1", "done")
	failed := s.waitState(t, "bad-1", "failed")
	s.waitState(t, odd, "done")

	t.Run("done", func(t *testing.T) {
		if done.ID != "ok-1" || done.Subject != "job.ok" || done.Seq != 1 || done.Attempts != 1 || done.Worker == "" || done.LastError != "" {
			t.Errorf("got %+v, want ok-1 on job.ok, seq 1, 1 attempt, a worker, no error", done)
		}
		if done.FirstAt.IsZero() || done.StartedAt.IsZero() || done.FinishedAt.Before(done.StartedAt) || !done.LeaseUntil.IsZero() {
			t.Errorf("got times first %s, started %s, finished %s, lease %s; want set, finished after started, no lease", done.FirstAt, done.StartedAt, done.FinishedAt, done.LeaseUntil)
		}
		golden(t, "job_done.json", s.jobqJSON(t, new(recordOut), "job", "ok-1"))
		text := s.mustJobq(t, "job", "ok-1")
		for _, want := range []string{"id:", "ok-1", "state:", "done", "attempts:", "finished:"} {
			if !strings.Contains(text, want) {
				t.Errorf("job ok-1: got %q, want it to contain %q", text, want)
			}
		}
	})

	t.Run("failed", func(t *testing.T) {
		if failed.Attempts != 1 || failed.LastError != "exit status 65: cannot parse the input" || failed.FinishedAt.IsZero() {
			t.Errorf("got %+v, want 1 attempt, last error %q, finished", failed, "exit status 65: cannot parse the input")
		}
		golden(t, "job_failed.json", s.jobqJSON(t, new(recordOut), "job", "bad-1"))
	})

	t.Run("claim lapsed", func(t *testing.T) {
		// A worker that stopped without an outcome left its claim.
		kv, err := s.jetStream(t).KeyValue(context.Background(), "processed")
		if err != nil {
			t.Fatal(err)
		}
		rec, err := json.Marshal(data.Record{ID: "lapsed-1", State: data.StateRunning, Subject: "job.ok", Seq: 9, Attempts: 1, Worker: "gone/0", LeaseUntil: time.Now().Add(-time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(context.Background(), "lapsed-1", rec); err != nil {
			t.Fatal(err)
		}
		text := s.mustJobq(t, "job", "lapsed-1")
		if !strings.Contains(text, "running") || !strings.Contains(text, "(lapsed: not renewed by its end; its worker stopped, lost the server, or cannot write the ledger.") {
			t.Errorf("job lapsed-1: got %q, want it running with its claim lapsed", text)
		}
	})

	t.Run("unknown", func(t *testing.T) {
		wantOneLineError(t, s.jobq(t, "job", "no-such-job"), 1, `no ledger record for job "no-such-job"`)
		wantOneLineError(t, s.jobq(t, "job", "no-such-job", "--json"), 1, "no ledger record")
	})

	t.Run("usage", func(t *testing.T) {
		wantOneLineError(t, s.jobq(t, "job"), 2, "one job ID")
		wantOneLineError(t, s.jobq(t, "job", "a", "b"), 2, "one job ID")
	})
}

// ---- dlq ------------------------------------------------------------------------

func TestCLIDLQ(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServe(t, serveOpts{dir: dir, args: []string{
		"--handler", `job.>=exec:echo "cannot parse" >&2; exit 65`,
	}})
	s.enqueue(t, "job.mail.send", `{"to":"a@example.com"}`, "dl-1", "-H", "k=v")
	s.enqueue(t, "job.mail.send", "second", "dl-2")
	s.waitCounts(t, counts{Records: 2, DLQ: 2})
	for _, id := range []string{"dl-1", "dl-2"} {
		if rec := s.waitState(t, id, "failed"); rec.LastError != "exit status 65: cannot parse" {
			t.Errorf("job %s: got last error %q, want %q", id, rec.LastError, "exit status 65: cannot parse")
		}
	}

	t.Run("list", func(t *testing.T) {
		var list []deadLetterOut
		out := s.jobqJSON(t, &list, "dlq", "list")
		if len(list) != 2 {
			t.Fatalf("dlq list: got %d dead letters, want 2: %s", len(list), out)
		}
		for i, d := range list {
			id := "dl-" + strconv.Itoa(i+1)
			if d.ID != id || d.DLQSeq != uint64(i+1) || d.JobSeq != uint64(i+1) || d.Subject != "job.mail.send" ||
				d.Attempts != 1 || d.Error != "exit status 65: cannot parse" || d.FailedAt.IsZero() || d.Payload != nil {
				t.Errorf("dlq list [%d]: got %+v, want %s, dlq seq %d, 1 attempt, its error, no payload", i, d, id, i+1)
			}
		}
		if got := list[0].Headers["k"]; !slices.Equal(got, []string{"v"}) {
			t.Errorf("dlq list: dl-1 header k: got %q, want [v]", got)
		}
		golden(t, "dlq_list.json", out)
		wantOne := s.jobqJSON(t, &list, "dlq", "list", "--limit", "1")
		if len(list) != 1 || list[0].ID != "dl-1" {
			t.Errorf("dlq list --limit 1: got %s, want dl-1 only", wantOne)
		}
		text := s.mustJobq(t, "dlq", "list")
		for _, want := range []string{"DLQ-SEQ", "JOB ID", "dl-1", "dl-2", "exit status 65"} {
			if !strings.Contains(text, want) {
				t.Errorf("dlq list: got %q, want it to contain %q", text, want)
			}
		}
	})

	t.Run("show", func(t *testing.T) {
		for _, ref := range []string{"dl-1", "1"} {
			var d deadLetterOut
			s.jobqJSON(t, &d, "dlq", "show", ref)
			if d.ID != "dl-1" || d.Payload == nil || *d.Payload != `{"to":"a@example.com"}` {
				t.Errorf("dlq show %s: got %+v, want dl-1 with its payload as text", ref, d)
			}
		}
		text := s.mustJobq(t, "dlq", "show", "dl-2")
		if !strings.Contains(text, "id: dl-2\n") || !strings.Contains(text, "error: exit status 65: cannot parse\n") || !strings.HasSuffix(text, "\nsecond\n") {
			t.Errorf("dlq show dl-2: got %q, want its id, error and payload", text)
		}
		wantOneLineError(t, s.jobq(t, "dlq", "show", "nope"), 1, "no such dead letter", `"nope"`)
	})

	// Retry on a server whose handler now succeeds.
	s.Stop(t)
	runs := filepath.Join(t.TempDir(), "runs")
	s = startServe(t, serveOpts{dir: dir, args: []string{
		"--handler", "job.>=exec:{ echo \"$JOBQ_JOB_ID $JOBQ_ATTEMPT\"; cat; echo; } >> " + shq(runs),
	}})

	t.Run("retry", func(t *testing.T) {
		var retried []struct {
			ID     string  `json:"id"`
			DLQSeq uint64  `json:"dlq_seq"`
			Seq    uint64  `json:"seq"`
			RunsAs *string `json:"runs_as"`
		}
		out := s.jobqJSON(t, &retried, "dlq", "retry", "dl-1")
		if len(retried) != 1 || retried[0].ID != "dl-1" || retried[0].DLQSeq != 1 || retried[0].Seq != 3 || retried[0].RunsAs != nil {
			t.Fatalf("dlq retry dl-1: got %s, want [{id dl-1, dlq_seq 1, seq 3}]", out)
		}
		rec := s.waitState(t, "dl-1", "done")
		if rec.Attempts != 2 || rec.Seq != 3 {
			t.Errorf("job dl-1 after retry: got %+v, want 2 attempts, seq 3", rec)
		}
		if got, want := lines(t, runs), []string{"dl-1 1", `{"to":"a@example.com"}`}; !slices.Equal(got, want) {
			t.Errorf("handler runs: got %q, want %q", got, want)
		}
		var list []deadLetterOut
		s.jobqJSON(t, &list, "dlq", "list")
		if len(list) != 1 || list[0].ID != "dl-2" {
			t.Errorf("dlq list after retry: got %+v, want dl-2 only", list)
		}
		wantOneLineError(t, s.jobq(t, "dlq", "retry"), 2, "--all")
		wantOneLineError(t, s.jobq(t, "dlq", "retry", "dl-1"), 1, "no such dead letter")
	})

	t.Run("purge", func(t *testing.T) {
		var purged map[string]uint64
		s.jobqJSON(t, &purged, "dlq", "purge")
		if want := map[string]uint64{"purged": 1}; purged["purged"] != 1 || len(purged) != 1 {
			t.Errorf("dlq purge: got %v, want %v", purged, want)
		}
		out := s.mustJobq(t, "dlq", "list", "--json")
		if strings.TrimSpace(out) != "[]" {
			t.Errorf("dlq list after purge: got %q, want []", out)
		}
		if got := s.mustJobq(t, "dlq", "list"); got != "no dead letters\n" {
			t.Errorf("dlq list after purge: got %q, want %q", got, "no dead letters\n")
		}
		if st := s.status(t); st.DLQ.Messages != 0 {
			t.Errorf("status after purge: got %d dead letters, want 0", st.DLQ.Messages)
		}
		if rec, _ := s.record(t, "dl-2"); rec.State != "failed" {
			t.Errorf("job dl-2 after purge: got state %q, want failed (purge leaves the ledger)", rec.State)
		}
		if got := s.mustJobq(t, "dlq", "purge"); got != "purged 0 dead letters\n" {
			t.Errorf("dlq purge of nothing: got %q", got)
		}
	})
}

// ---- handlers -------------------------------------------------------------------

// hookRequest is what the http handler's server saw.
type hookRequest struct {
	method, path, body string
	header             http.Header
}

func TestCLIHandlers(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		hits []hookRequest
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		hits = append(hits, hookRequest{r.Method, r.URL.Path, string(body), r.Header.Clone()})
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(hook.Close)

	out := t.TempDir()
	// Each exec handler writes what it saw to OUT/ID.HANDLER.
	saw := func(name string) string {
		return `exec:{ printf '%s|%s|%s|%s|%s\n' "$JOBQ_JOB_ID" "$JOBQ_SUBJECT" "$JOBQ_ATTEMPT" "$JOBQ_SEQ" "$JOBQ_RESUMED"; cat; } > ` +
			shq(out) + `/"$JOBQ_JOB_ID".` + name
	}
	s := startServe(t, serveOpts{args: []string{
		"--retry-backoff", "100ms",
		"--handler", "job.email.*=" + saw("email"),
		"--handler", "job.>=" + saw("all"),
		"--handler", `job.flaky=exec:[ "$JOBQ_ATTEMPT" -ge 2 ] || exit 75; ` + saw("flaky")[len("exec:"):],
		"--handler", "job.hook.>=http:" + hook.URL + "/hook?secret=1",
	}})

	tests := []struct {
		name, id, subject, payload, handler string
		attempt                             int
	}{
		{name: "email route wins over job.>", id: "h-email", subject: "job.email.welcome", payload: `{"to":"a@b.c"}`, handler: "email"},
		{name: "job.> takes the rest", id: "h-sms", subject: "job.sms", payload: "sms body", handler: "all"},
		{name: "job.email.* matches one token only", id: "h-deep", subject: "job.email.welcome.extra", payload: "deep", handler: "all"},
		{name: "retried job sees its attempt", id: "h-flaky", subject: "job.flaky", payload: "again", handler: "flaky", attempt: 2},
		{name: "multi-line payload", id: "h-lines", subject: "job.email.digest", payload: "line 1\nline 2\n", handler: "email"},
	}
	seqs := map[string]uint64{}
	for _, tt := range tests {
		seqs[tt.id] = s.enqueue(t, tt.subject, tt.payload, tt.id).Seq
	}
	hookSeq := s.enqueue(t, "job.hook.push", `{"event":"push"}`, "h-hook", "-H", "Content-Type=application/json").Seq

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := s.waitState(t, tt.id, "done")
			want := max(tt.attempt, 1)
			if rec.Attempts != want {
				t.Errorf("ledger attempts: got %d, want %d", rec.Attempts, want)
			}
			got, err := os.ReadFile(filepath.Join(out, tt.id+"."+tt.handler))
			if err != nil {
				entries, _ := os.ReadDir(out)
				t.Fatalf("handler %s did not run for %s (%v); files: %v", tt.handler, tt.id, err, entries)
			}
			wantOut := fmt.Sprintf("%s|%s|%d|%d|0\n%s", tt.id, tt.subject, want, seqs[tt.id], tt.payload)
			if string(got) != wantOut {
				t.Errorf("handler %s saw:\n%q\nwant:\n%q", tt.handler, got, wantOut)
			}
			for _, other := range []string{"email", "all", "flaky"} {
				if _, err := os.Stat(filepath.Join(out, tt.id+"."+other)); other != tt.handler && err == nil {
					t.Errorf("handler %s also ran for %s, want only %s", other, tt.id, tt.handler)
				}
			}
		})
	}

	t.Run("http", func(t *testing.T) {
		s.waitState(t, "h-hook", "done")
		mu.Lock()
		defer mu.Unlock()
		if len(hits) != 1 {
			t.Fatalf("hook got %d requests, want 1", len(hits))
		}
		h := hits[0]
		if h.method != http.MethodPost || h.path != "/hook" || h.body != `{"event":"push"}` {
			t.Errorf("hook got %s %s %q, want POST /hook with the payload", h.method, h.path, h.body)
		}
		for k, want := range map[string]string{
			"Content-Type": "application/json", "X-Jobq-Job-Id": "h-hook", "X-Jobq-Subject": "job.hook.push",
			"X-Jobq-Attempt": "1", "X-Jobq-Seq": strconv.FormatUint(hookSeq, 10), "X-Jobq-Resumed": "0",
		} {
			if got := h.header.Get(k); got != want {
				t.Errorf("hook header %s: got %q, want %q", k, got, want)
			}
		}
	})
}

// ---- bad usage and runtime failures --------------------------------------------------

func TestCLIUsage(t *testing.T) {
	t.Parallel()
	nowhere := "nats://" + freeAddr(t) // nothing listens there
	notPEM := filepath.Join(t.TempDir(), "cert.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want []string // in the one line on stderr
	}{
		{name: "unknown command", args: []string{"bogus"}, want: []string{`unknown command "bogus"`, "jobq --help"}},
		{name: "unknown dlq command", args: []string{"dlq", "bogus"}, want: []string{`"dlq bogus"`, "list"}},
		{name: "unknown flag", args: []string{"status", "--bogus", "--server", nowhere}, want: []string{"unknown flag --bogus", "see jobq status --help"}},
		{name: "malformed value of a subcommand's flag", args: []string{"dlq", "list", "--limit", "abc", "--server", nowhere}, want: []string{`invalid value "abc" for --limit`, "see jobq dlq list --help"}},
		{name: "unknown flag after the arguments", args: []string{"enqueue", "job.x", "--bogus", "--server", nowhere}, want: []string{"-bogus"}},
		{name: "enqueue without subject", args: []string{"enqueue", "--server", nowhere}, want: []string{"SUBJECT"}},
		{name: "enqueue with three arguments", args: []string{"enqueue", "job.x", "a", "b", "--server", nowhere}, want: []string{"SUBJECT [PAYLOAD]"}},
		{name: "subject outside job", args: []string{"enqueue", "foo.bar", "x", "--server", nowhere}, want: []string{`"foo.bar"`, "job."}},
		{name: "wildcard subject", args: []string{"enqueue", "job.*", "x", "--server", nowhere}, want: []string{`"job.*"`, "wildcard"}},
		{name: "subject job alone", args: []string{"enqueue", "job", "x", "--server", nowhere}, want: []string{`"job"`}},
		{name: "payload and file", args: []string{"enqueue", "job.x", "a", "--file", "f", "--server", nowhere}, want: []string{"not both"}},
		{name: "header without value", args: []string{"enqueue", "job.x", "a", "-H", "novalue", "--server", nowhere}, want: []string{"novalue", "key=value"}},
		{name: "job id as a header", args: []string{"enqueue", "job.x", "a", "-H", "Nats-Msg-Id=zz", "--server", nowhere}, want: []string{"Nats-Msg-Id", "--id"}},
		{name: "max payload under 1", args: []string{"enqueue", "job.x", "a", "--max-payload", "-1", "--server", nowhere}, want: []string{"--max-payload -1", "want 1 to 33423360"}},
		{name: "unknown flag before the command", args: []string{"--bogus"}, want: []string{"see jobq --help"}},
		{name: "next with an argument", args: []string{"next", "x", "--server", nowhere}, want: []string{"no arguments"}},
		{name: "status with an argument", args: []string{"status", "x", "--server", nowhere}, want: []string{"no arguments"}},
		{name: "client password without user", args: []string{"status", "--password", "p", "--server", nowhere}, want: []string{"--password", "--user", "pass both"}},
		{name: "dlq list with an argument", args: []string{"dlq", "list", "x", "--server", nowhere}, want: []string{"no arguments"}},
		{name: "dlq purge with an argument", args: []string{"dlq", "purge", "dl-1", "--server", nowhere}, want: []string{"no arguments"}},
		{name: "dlq retry without target", args: []string{"dlq", "retry", "--server", nowhere}, want: []string{"--all"}},
		{name: "dlq rm without target", args: []string{"dlq", "rm", "--server", nowhere}, want: []string{"one DLQ sequence or job ID", "dlq purge"}},
		{name: "dlq rm with two targets", args: []string{"dlq", "rm", "1", "2", "--server", nowhere}, want: []string{"one DLQ sequence or job ID"}},
		{name: "dlq rm of an empty argument", args: []string{"dlq", "rm", "", "--server", nowhere}, want: []string{"empty"}},
		{name: "dlq list with a negative limit", args: []string{"dlq", "list", "--limit", "-1", "--server", nowhere}, want: []string{"--limit -1"}},
		{name: "job with an empty ID", args: []string{"job", "", "--server", nowhere}, want: []string{"job ID is empty"}},
		{name: "next with a negative wait", args: []string{"next", "--wait", "-1s", "--server", nowhere}, want: []string{"--wait -1s"}},
		{name: "version with an argument", args: []string{"version", "extra"}, want: []string{"no arguments"}},
		{name: "bench with an argument", args: []string{"bench", "extra"}, want: []string{"no arguments"}},
		{name: "completion for no shell", args: []string{"completion", "tcsh"}, want: []string{"bash, zsh or fish"}},
		{name: "completion for two shells", args: []string{"completion", "bash", "zsh"}, want: []string{"one shell: bash, zsh or fish"}},
		{name: "malformed ack wait", args: []string{"serve", "--ack-wait", "5"}, want: []string{"ack-wait", `"5"`}},
		{name: "ack wait under a second", args: []string{"serve", "--ack-wait", "10ms"}, want: []string{"ack wait 10ms", "1s or more"}},
		{name: "max deliver 0", args: []string{"serve", "--max-deliver", "0"}, want: []string{"--max-deliver 0", "1 or more"}},
		{name: "workers 0", args: []string{"serve", "--workers", "0"}, want: []string{"--workers 0"}},
		{name: "replicas 6", args: []string{"serve", "--replicas", "6", "--server", nowhere}, want: []string{"--replicas 6", "1 to 5"}},
		{name: "replicas without a server", args: []string{"serve", "--replicas", "3"}, want: []string{"--replicas 3 needs --server"}},
		{name: "prefetch bytes 0", args: []string{"serve", "--prefetch-bytes", "0"}, want: []string{"--prefetch-bytes 0", "1 or more"}},
		{name: "bad retry backoff", args: []string{"serve", "--retry-backoff", "soon"}, want: []string{"--retry-backoff", "1s,10s,1m"}},
		{name: "handler without subject", args: []string{"serve", "--handler", "nonsense"}, want: []string{`--handler "nonsense"`, "SUBJECT=SPEC"}},
		{name: "handler of unknown kind", args: []string{"serve", "--handler", "job.x=unknown:thing"}, want: []string{`unknown handler kind "unknown"`, "exec:COMMAND"}},
		{name: "handler outside job", args: []string{"serve", "--handler", "foo.>=log"}, want: []string{`"foo.>"`}},
		{name: "sync bogus", args: []string{"serve", "--sync", "bogus"}, want: []string{`--sync "bogus"`, "always"}},
		{name: "tls cert missing", args: []string{"serve", "--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem"}, want: []string{"--tls-cert", "cert.pem"}},
		{name: "tls cert and key that are not PEM", args: []string{"serve", "--tls-cert", notPEM, "--tls-key", notPEM}, want: []string{"--tls-cert and --tls-key", "PEM"}},
		{name: "log level loud", args: []string{"serve", "--log-level", "loud"}, want: []string{`--log-level "loud"`, "debug"}},
		{name: "log format", args: []string{"serve", "--log-format", "xml"}, want: []string{`--log-format "xml"`}},
		{name: "serve with an argument", args: []string{"serve", "now"}, want: []string{"no arguments"}},
		{name: "user without password", args: []string{"serve", "--user", "u"}, want: []string{"--password"}},
		// A non-loopback --listen without auth is refused before anything
		// starts: bad usage, exit status 2.
		{name: "non-loopback listen without auth", args: []string{"serve", "--listen", "0.0.0.0:" + strings.Split(freeAddr(t), ":")[1]}, want: []string{"0.0.0.0", "authentication", "--token", "--insecure"}},
		// So is a non-loopback --http, which serves the dashboard and its
		// dead-letter re-drives.
		{name: "non-loopback http without auth", args: []string{"serve", "--http", "0.0.0.0:" + strings.Split(freeAddr(t), ":")[1]}, want: []string{"--http 0.0.0.0", "--token", "--insecure"}},
		{name: "non-loopback http with an nkey only", args: []string{"serve", "--http", ":" + strings.Split(freeAddr(t), ":")[1], "--nkey", "UB7BXKQSFXEX4R6AGA5OLVOIAQVZZ6OEVTROQA5VZ4FHETKJM3Q5GLHA"}, want: []string{"--http", "an --nkey does not reach HTTP"}},
		{name: "malformed http", args: []string{"serve", "--http", "bogus"}, want: []string{`--http "bogus"`, "host:port"}},
		{name: "two kinds of auth", args: []string{"serve", "--token", "t", "--user", "u", "--password", "p"}, want: []string{"--token", "--nkey", "pass one"}},
		{name: "nkey that is not a key", args: []string{"serve", "--nkey", "notakey"}, want: []string{`--nkey "notakey"`, "user public key"}},
		{name: "demo interval 0", args: []string{"serve", "--demo", "--demo-interval", "0"}, want: []string{"--demo-interval 0s", "positive"}},
		{name: "dedupe window 0", args: []string{"serve", "--dedupe-window", "0"}, want: []string{"--dedupe-window 0s", "positive"}},
		{name: "negative shutdown timeout", args: []string{"serve", "--shutdown-timeout", "-1s"}, want: []string{"--shutdown-timeout -1s"}},
		{name: "negative max store", args: []string{"serve", "--max-store", "-1"}, want: []string{"--max-store -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := tt.args
			store := filepath.Join(t.TempDir(), "store")
			if args[0] == "serve" {
				// Should serve start anyway, it must not touch anything shared.
				args = append(slices.Clone(args), "--store-dir", store)
				if !slices.Contains(args, "--http") {
					args = append(args, "--http", "")
				}
				if !slices.Contains(args, "--listen") {
					args = append(args, "--listen", "127.0.0.1:0")
				}
			}
			// Bad usage is refused at once; a serve that starts is cut off.
			r := runCmd(t, cmdInput{timeout: 20 * time.Second}, jobqBin, args...)
			wantOneLineError(t, r, 2, tt.want...)
			if _, err := os.Stat(store); err == nil {
				t.Errorf("bad usage created the store dir %s", store)
			}
		})
	}
}

func TestCLIHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--help"}, {"enqueue", "--help"}, {"status", "-h"}, {"dlq"}, {"dlq", "list", "--help"}} {
		r := jobq(t, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "USAGE:") || r.stderr != "" {
			t.Errorf("jobq %q: got %s, want exit status 0 and help on stdout", args, r)
		}
	}
}

func TestCLINoServer(t *testing.T) {
	t.Parallel()
	nowhere := "nats://" + freeAddr(t)
	tests := []struct {
		name string
		args []string
	}{
		{"status", []string{"status"}},
		{"enqueue", []string{"enqueue", "job.x", "payload"}},
		{"next", []string{"next"}},
		{"job", []string{"job", "x"}},
		{"dlq list", []string{"dlq", "list"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := jobq(t, append(tt.args, "--server", nowhere, "--timeout", "2s")...)
			wantOneLineError(t, r, 1, "cannot reach a jobq server at "+nowhere, "`jobq serve`", "--server")
		})
	}
}

// A server that refuses the client's credentials is said to, rather than
// to be unreachable; bad client settings are bad usage.
func TestCLIClientSettings(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{args: []string{"--token", "s3cret"}})
	wantOneLineError(t, jobq(t, "status", "--server", s.url), 1, "refused the credentials", "--token")
	wantOneLineError(t, jobq(t, "status", "--server", s.url, "--token", "guess"), 1, "refused the credentials")
	if r := jobq(t, "status", "--server", s.url, "--token", "s3cret"); r.code != 0 {
		t.Errorf("status with the token: exit %d, stderr %q", r.code, r.stderr)
	}
	// A list with an empty entry, as a script leaves, is as nats.go takes it.
	if r := jobq(t, "status", "--server", s.url+",", "--token", "s3cret"); r.code != 0 {
		t.Errorf("status with a trailing comma in --server: exit %d, stderr %q", r.code, r.stderr)
	}
	nowhere := "nats://" + freeAddr(t)
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"--server", "bogus://x"}, []string{`--server "bogus://x"`, "nats://"}},
		{[]string{"--server", "not a url"}, []string{`--server "not a url"`, "NATS URL"}},
		{[]string{"--server", nowhere, "--timeout", "0"}, []string{"--timeout 0s"}},
		{[]string{"--server", nowhere, "--tls-ca", filepath.Join(t.TempDir(), "none.pem")}, []string{"--tls-ca", "none.pem"}},
	} {
		wantOneLineError(t, jobq(t, append([]string{"status"}, tt.args...)...), 2, tt.want...)
	}
}

// jobq serve --server runs its workers against another server: here a
// broker, a jobq serve without handlers.
func TestCLIServeWithExternalServer(t *testing.T) {
	t.Parallel()
	broker := startServe(t, serveOpts{})
	worker := startServe(t, serveOpts{args: []string{"--server", broker.url, "--handler", "job.>=log", "--sync", "always"}})
	broker.enqueue(t, "job.ext", "x", "ext-1")
	broker.waitState(t, "ext-1", "done")
	// startServe passes --store-dir and --listen, which the external
	// server leaves without effect; serve says so rather than take them
	// silently.
	if log := worker.logText(); !strings.Contains(log, `"flags":["--store-dir","--listen","--sync"]`) || !strings.Contains(log, "they do nothing") {
		t.Errorf("serve --server with --store-dir, --listen and --sync: no warning that they do nothing; log:\n%s", worker.logTail(30))
	}
}

// With no client port (an empty --listen), the client port's TLS and nkey do
// nothing, and serve says so rather than take them silently.
func TestCLIServeWithoutAClientPortSaysItsFlagsDoNothing(t *testing.T) {
	t.Parallel()
	cert, key := servertest.SelfSignedCert(t, t.TempDir())
	s := startServe(t, serveOpts{args: []string{"--listen", "", "--tls-cert", cert, "--tls-key", key}})
	if log := s.logText(); !strings.Contains(log, `"flags":["--tls-cert","--tls-key"]`) || !strings.Contains(log, "which --listen '' leaves closed: they do nothing") {
		t.Errorf("serve --listen '' with --tls-cert and --tls-key: no warning that they do nothing; log:\n%s", s.logTail(30))
	}
	if log := s.logText(); strings.Contains(log, "--server leaves out") {
		t.Errorf("serve without --server warned as with it; log:\n%s", s.logTail(30))
	}
}

// jobq serve --server reaches a server whose TLS certificate a private CA
// signed with --tls-ca, as client commands do; without it, it says what to
// pass. The broker's JOBQ_TLS_CA, there for its client commands, leaves the
// embedded server as it is, and so does a --config file that serve and the
// client commands share.
func TestCLIServeWithExternalServerOverTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, key := servertest.SelfSignedCert(t, dir)
	broker := startServe(t, serveOpts{
		args: []string{"--tls-cert", cert, "--tls-key", key, "--token", "s3cret"},
		env:  []string{"JOBQ_TLS_CA=" + cert},
	})
	broker.clientFlags = []string{"--tls-ca", cert, "--token", "s3cret"}

	untrusted := runCmd(t, cmdInput{}, jobqBin, "serve", "--server", broker.url, "--token", "s3cret", "--http", "", "--handler", "job.>=log")
	wantOneLineError(t, untrusted, 1, "TLS certificate", "--tls-ca")
	elsewhere, elsewhereKey := servertest.SelfSignedCert(t, t.TempDir(), "jobq.example")
	misnamed := startServe(t, serveOpts{args: []string{"--tls-cert", elsewhere, "--tls-key", elsewhereKey}})
	wantOneLineError(t, jobq(t, "status", "--server", misnamed.url, "--tls-ca", elsewhere), 1, "not for that host")

	shared := filepath.Join(dir, "jobq.yaml")
	if err := os.WriteFile(shared, []byte("tls-cert: "+cert+"\ntls-key: "+key+"\ntls-ca: "+cert+"\ntoken: s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := startServe(t, serveOpts{args: []string{"--config", shared, "--handler", "job.>=log"}})
	other.clientFlags = []string{"--config", shared}
	other.enqueue(t, "job.x", "x", "shared-config")
	other.waitState(t, "shared-config", "done")

	startServe(t, serveOpts{args: []string{"--server", broker.url, "--tls-ca", cert, "--token", "s3cret", "--handler", "job.>=log"}})
	broker.enqueue(t, "job.ext", "x", "ext-tls")
	broker.waitState(t, "ext-tls", "done")
}

// A server that takes an nkey is reached with --nkey-seed, by client
// commands and by jobq serve --server alike.
func TestCLINkeySeed(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	broker := startServe(t, serveOpts{args: []string{"--nkey", pub}})
	wantOneLineError(t, broker.jobq(t, "status"), 1, "refused the credentials", "--nkey-seed")
	broker.clientFlags = []string{"--nkey-seed", seedFile}
	startServe(t, serveOpts{args: []string{"--server", broker.url, "--nkey-seed", seedFile, "--handler", "job.>=log"}})
	broker.enqueue(t, "job.ext", "x", "ext-nkey")
	broker.waitState(t, "ext-nkey", "done")
}

func TestCLIServeStoreDirInUse(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	addrs := freeAddrs(t, 2)
	r := jobq(t, "serve", "--store-dir", s.dir, "--listen", addrs[0], "--http", addrs[1], "--log-format", "json")
	wantOneLineError(t, r, 1, "store dir is in use", s.dir, "--store-dir")
	// The same command twice: the store is named, not --http, which the
	// first one holds too and which a second serve binds first.
	r = jobq(t, "serve", "--store-dir", s.dir, "--listen", strings.TrimPrefix(s.url, "nats://"),
		"--http", strings.TrimPrefix(s.httpURL, "http://"), "--log-format", "json")
	wantOneLineError(t, r, 1, "store dir is in use", s.dir, "--store-dir")

	// The first one keeps serving.
	s.enqueue(t, "job.still", "here", "still-1")
	if j := s.next(t); j.ID != "still-1" {
		t.Errorf("next: got %s, want still-1", j.ID)
	}
	if err := s.waitReady(5 * time.Second); err != nil {
		t.Errorf("first serve after the second was refused: %v", err)
	}
}

// ---- configuration ----------------------------------------------------------------

func TestCLIEnvVars(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{env: []string{
		"JOBQ_MAX_DELIVER=5", "JOBQ_ACK_WAIT=7s", "JOBQ_DEDUPE_WINDOW=2m", "JOBQ_PROCESSED_TTL=24h",
	}})
	// The client takes its server from JOBQ_SERVER too, and every other
	// flag from its variable: --json from JOBQ_JSON.
	r := runCmd(t, cmdInput{env: []string{"JOBQ_SERVER=" + s.url, "JOBQ_JSON=true"}}, jobqBin, "status")
	if r.code != 0 {
		t.Fatalf("status with JOBQ_SERVER: got %s", r)
	}
	var st statusOut
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("decode %q: %v", r.stdout, err)
	}
	if st.Consumer.MaxDeliver != 5 || st.Consumer.AckWait != "7s" || st.Stream.DedupeWindow != "2m0s" || st.Ledger.TTL != "24h0m0s" {
		t.Errorf("status: got max deliver %d, ack wait %s, dedupe window %s, ttl %s; want 5, 7s, 2m0s, 24h0m0s",
			st.Consumer.MaxDeliver, st.Consumer.AckWait, st.Stream.DedupeWindow, st.Ledger.TTL)
	}
}

// ---- lifecycle ----------------------------------------------------------------------

func TestCLIGracefulShutdown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	runs := filepath.Join(t.TempDir(), "runs")
	args := []string{
		"--shutdown-timeout", "20s",
		"--handler", `job.>=exec:echo "$JOBQ_JOB_ID" >> ` + shq(runs) + `; sleep 2`,
	}
	s := startServe(t, serveOpts{dir: dir, args: args})
	s.enqueue(t, "job.slow", "x", "slow-1")
	checkFor(t, waitTimeout, pollInterval, func() error {
		if got := lines(t, runs); len(got) != 1 {
			return fmt.Errorf("handler runs: got %q, want slow-1 started", got)
		}
		return nil
	})

	took := s.Stop(t)
	if took > 20*time.Second {
		t.Errorf("shutdown took %s, want within --shutdown-timeout 20s", took)
	}
	log := s.logText()
	for _, want := range []string{"shutting down: stop fetching and publishing", "workers stopped", "nats server stopped"} {
		if !strings.Contains(log, want) {
			t.Errorf("serve log: want %q in it", want)
		}
	}

	// Restarted with the same handler, jobq knows the job is done and does
	// not run it again.
	s = startServe(t, serveOpts{dir: dir, args: args})
	rec := s.waitState(t, "slow-1", "done")
	if rec.Attempts != 1 {
		t.Errorf("job slow-1: got %d attempts, want 1", rec.Attempts)
	}
	st := s.waitCounts(t, counts{Records: 1})
	if st.Consumer.AckPending != 0 {
		t.Errorf("after restart: got %d ack pending, want 0", st.Consumer.AckPending)
	}
	if got := lines(t, runs); !slices.Equal(got, []string{"slow-1"}) {
		t.Errorf("handler runs: got %q, want one run of slow-1", got)
	}
}

func TestCLIRestartKeepsState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const n = 20
	s := startServe(t, serveOpts{dir: dir})
	for i := range n {
		s.enqueue(t, "job.keep", "payload "+strconv.Itoa(i), fmt.Sprintf("keep-%02d", i))
	}
	s.Stop(t)

	s = startServe(t, serveOpts{dir: dir})
	if got, want := s.status(t).counts(), (counts{Messages: n, Pending: n}); got != want {
		t.Errorf("after restart: got %+v, want %+v", got, want)
	}
	s.Stop(t)

	runs := filepath.Join(t.TempDir(), "runs")
	s = startServe(t, serveOpts{dir: dir, args: []string{"--handler", `job.keep=exec:echo "$JOBQ_JOB_ID" >> ` + shq(runs)}})
	s.waitCounts(t, counts{Records: n})
	got := lines(t, runs)
	slices.Sort(got)
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("keep-%02d", i))
	}
	if !slices.Equal(got, want) {
		t.Errorf("handler runs: got %q, want each of keep-00..keep-%02d once", got, n-1)
	}
	for _, id := range []string{want[0], want[n/2], want[n-1]} {
		if rec, _ := s.record(t, id); rec.State != "done" || rec.Attempts != 1 {
			t.Errorf("job %s: got %+v, want done in 1 attempt", id, rec)
		}
	}
}

// TestCrashResumedAttempt checks the documented boundary of exactly-once
// (DESIGN.md, invariant 4): a crash after a handler's effect but before its
// completion is recorded runs the job again, and the handler can tell.
func TestCrashResumedAttempt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	work := t.TempDir()
	effects, pidFile := filepath.Join(work, "effects"), filepath.Join(work, "pid")
	effect := `echo "$JOBQ_JOB_ID $JOBQ_ATTEMPT $JOBQ_RESUMED" >> ` + shq(effects)

	// The first handler has its effect, then hangs until the crash. It runs
	// in a process group of its own, which outlives jobq's SIGKILL: its pid
	// file lets the test end it as a machine crash would.
	s := startServe(t, serveOpts{dir: dir, args: []string{
		"--ack-wait", "3s",
		"--handler", "job.>=exec:echo $$ > " + shq(pidFile) + "; " + effect + "; sleep 30",
	}})
	t.Cleanup(func() { killGroup(t, pidFile) })
	s.enqueue(t, "job.charge", `{"amount":100}`, "crash-1")
	checkFor(t, waitTimeout, pollInterval, func() error {
		if n := len(lines(t, effects)); n != 1 {
			return fmt.Errorf("effects file has %d lines, want 1", n)
		}
		return nil
	})
	s.Kill(t)
	killGroup(t, pidFile)

	s = startServe(t, serveOpts{dir: dir, args: []string{"--ack-wait", "3s", "--handler", "job.>=exec:" + effect}})
	rec := s.waitState(t, "crash-1", "done")

	got := lines(t, effects)
	t.Logf("effects (job attempt resumed): %q", got)
	if len(got) != 2 {
		t.Fatalf("effects: got %q, want 2 lines: the crashed attempt and the resumed one", got)
	}
	if got[0] != "crash-1 1 0" {
		t.Errorf("first effect: got %q, want %q", got[0], "crash-1 1 0")
	}
	// JOBQ_ATTEMPT counts deliveries; a delivery that found the first claim
	// still live is released without running, so it may be above 2.
	f := strings.Fields(got[1])
	if len(f) != 3 || f[0] != "crash-1" || f[2] != "1" {
		t.Errorf("second effect: got %q, want crash-1 ATTEMPT 1 (resumed)", got[1])
	} else if attempt, err := strconv.Atoi(f[1]); err != nil || attempt < 2 {
		t.Errorf("second effect: got attempt %q, want 2 or more", f[1])
	}
	if rec.Attempts != 2 || !rec.Resumed {
		t.Errorf("job crash-1: got %d attempts, resumed %t; want 2 attempts, resumed", rec.Attempts, rec.Resumed)
	}
	if text := s.mustJobq(t, "job", "crash-1"); !strings.Contains(text, "resumed:") {
		t.Errorf("job crash-1: got %q, want it to say the attempt was resumed", text)
	}
	s.waitCounts(t, counts{Records: 1})
}

// killGroup kills the process group whose leader's pid is in pidFile, if any.
func killGroup(t *testing.T, pidFile string) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		t.Errorf("pid file %s: %q", pidFile, b)
		return
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill process group %d: %v", pid, err)
	}
	_ = os.Remove(pidFile) // its pid may be reused

}

// ---- compatibility with standard NATS clients ------------------------------------------

// natsCLI returns the nats CLI: JOBQ_NATS_CLI (make test builds v0.5.0 into
// bin/nats), else nats in PATH; without either the test is skipped.
func natsCLI(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("JOBQ_NATS_CLI"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("JOBQ_NATS_CLI: %v", err)
		}
		return p
	}
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	t.Skip("no nats CLI: set JOBQ_NATS_CLI or put nats in PATH; make test builds it into bin/nats")
	return ""
}

func TestCompatNATSCLI(t *testing.T) {
	t.Parallel()
	cli := natsCLI(t)
	s := startServe(t, serveOpts{})
	home := t.TempDir() // no saved nats contexts
	natsRun := func(t *testing.T, args ...string) result {
		t.Helper()
		return runCmd(t, cmdInput{env: []string{"HOME=" + home, "XDG_CONFIG_HOME=" + home}}, cli, append([]string{"-s", s.url}, args...)...)
	}
	mustNATS := func(t *testing.T, args ...string) string {
		t.Helper()
		r := natsRun(t, args...)
		if r.code != 0 {
			t.Fatalf("nats %q: got %s", args, r)
		}
		return r.stdout
	}
	t.Logf("nats CLI %s", strings.TrimSpace(runCmd(t, cmdInput{}, cli, "--version").stdout))

	t.Run("stream info", func(t *testing.T) {
		var info struct {
			Config struct {
				Subjects  []string `json:"subjects"`
				Retention string   `json:"retention"`
				Storage   string   `json:"storage"`
				Duplicate int64    `json:"duplicate_window"`
			} `json:"config"`
		}
		out := mustNATS(t, "stream", "info", "JOB", "--json")
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("decode %q: %v", out, err)
		}
		c := info.Config
		if !slices.Equal(c.Subjects, []string{"job.>"}) || c.Retention != "workqueue" || c.Storage != "file" || time.Duration(c.Duplicate) != 10*time.Minute {
			t.Errorf("stream JOB: got %+v, want subjects [job.>], workqueue, file, duplicate window 10m", c)
		}
	})

	t.Run("consumer info", func(t *testing.T) {
		var info struct {
			Config struct {
				Durable        string `json:"durable_name"`
				AckPolicy      string `json:"ack_policy"`
				MaxDeliver     int    `json:"max_deliver"`
				AckWait        int64  `json:"ack_wait"`
				DeliverSubject string `json:"deliver_subject"`
			} `json:"config"`
		}
		out := mustNATS(t, "consumer", "info", "JOB", "WORKER", "--json")
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("decode %q: %v", out, err)
		}
		c := info.Config
		if c.Durable != "WORKER" || c.AckPolicy != "explicit" || c.MaxDeliver != 3 || time.Duration(c.AckWait) != time.Minute || c.DeliverSubject != "" {
			t.Errorf("consumer WORKER: got %+v, want durable pull, explicit ack, max deliver 3, ack wait 1m", c)
		}
	})

	t.Run("kv status", func(t *testing.T) {
		out := mustNATS(t, "kv", "status", "processed")
		for _, want := range []string{"Bucket Name: processed", "Storage: File"} {
			if !strings.Contains(out, want) {
				t.Errorf("nats kv status processed: got %q, want it to contain %q", out, want)
			}
		}
	})

	// The rest take jobs from WORKER, one after another.
	t.Run("consumer next gets a jobq job", func(t *testing.T) {
		s.enqueue(t, "job.compat", "hello from jobq", "cli-1")
		if out := mustNATS(t, "consumer", "next", "JOB", "WORKER", "--count", "1", "--raw"); strings.TrimSpace(out) != "hello from jobq" {
			t.Errorf("nats consumer next: got %q, want the payload", out)
		}
		s.waitCounts(t, counts{})
	})

	t.Run("publish with Nats-Msg-Id twice", func(t *testing.T) {
		for range 2 {
			mustNATS(t, "pub", "job.x", "hello", "-H", "Nats-Msg-Id:abc", "--jetstream")
		}
		if st := s.status(t); st.Stream.Messages != 1 {
			t.Errorf("status: got %d messages, want 1", st.Stream.Messages)
		}
		if j := s.next(t); j.ID != "abc" || j.Subject != "job.x" || j.Payload != "hello" {
			t.Errorf("next: got %+v, want abc on job.x with payload hello", j)
		}
		wantOneLineError(t, s.jobq(t, "next", "--wait", "200ms"), 1, "no job")
	})

	t.Run("kv get a ledger record", func(t *testing.T) {
		s.enqueue(t, "job.order", `{"n":1}`, "order-1")
		s.next(t)
		out := mustNATS(t, "kv", "get", "processed", "order-1", "--raw")
		var rec recordOut
		if err := json.Unmarshal([]byte(out), &rec); err != nil {
			t.Fatalf("decode %q: %v", out, err)
		}
		if rec.ID != "order-1" || rec.State != "done" || rec.Subject != "job.order" || rec.Attempts != 1 {
			t.Errorf("nats kv get processed order-1: got %+v, want order-1 done in 1 attempt", rec)
		}
	})
}

// TestCompatGoWorker runs the NATS work-queue tutorial's worker loop against
// the WORKER consumer of a jobq serve: it gets every job jobq stored, once.
func TestCompatGoWorker(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	const n = 12
	want := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("gw-%02d", i)
		want[id] = "work " + strconv.Itoa(i)
		s.enqueue(t, "job.tutorial", want[id], id)
	}

	nc, err := nats.Connect(s.url, nats.Name("tutorial worker"))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	cons, err := js.Consumer(ctx, "JOB", "WORKER")
	if err != nil {
		t.Fatalf("look up consumer WORKER: %v", err)
	}

	got := map[string][]string{}
	fetch := func(wait time.Duration) int {
		msgs, err := cons.Fetch(5, jetstream.FetchMaxWait(wait))
		if err != nil {
			t.Fatalf("fetch: %v", err)
		}
		k := 0
		for msg := range msgs.Messages() {
			k++
			id := msg.Headers().Get(nats.MsgIdHdr)
			got[id] = append(got[id], string(msg.Data()))
			if err := msg.Ack(); err != nil {
				t.Errorf("ack %s: %v", id, err)
			}
		}
		if err := msgs.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
			t.Errorf("fetch: %v", err)
		}
		return k
	}
	for total := 0; total < n && ctx.Err() == nil; {
		total += fetch(time.Second)
	}
	if k := fetch(300 * time.Millisecond); k != 0 {
		t.Errorf("a fetch after all jobs got %d more", k)
	}
	for id, payload := range want {
		if !slices.Equal(got[id], []string{payload}) {
			t.Errorf("job %s: got %q, want %q once", id, got[id], payload)
		}
	}
	if len(got) != n {
		t.Errorf("got %d distinct jobs, want %d", len(got), n)
	}
	s.waitCounts(t, counts{})
}

// provisioned starts an embedded server, listening on a loopback port when
// listen is set, and provisions jobq's objects on it with cfg.
func provisioned(t *testing.T, listen bool, cfg queue.Config) (*server.Server, *queue.Objects) {
	t.Helper()
	srv := servertest.Start(t)
	if listen {
		srv = servertest.StartListening(t)
	}
	js, err := jetstream.New(servertest.Connect(t, srv))
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	obj, err := queue.Provision(context.Background(), js, cfg, servertest.Logger(t))
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	return srv, obj
}

// dlq retry --all that fails part way says how far it got, and with --json
// still lists the dead letters it re-enqueued; the rest stay in DLQ.
func TestCLIDLQRetryAllThatFailsPartWay(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	// Two dead letters: one of job.x, and one whose subject no stream
	// takes any more, which cannot be re-enqueued.
	s.storeDeadLetter(t, "ok-1", "job.x")
	s.storeDeadLetter(t, "lost-1", "gone.x")
	s.wantRetriedOneOfTwo(t, "ok-1", "lost-1")
	var list []deadLetterOut
	s.jobqJSON(t, &list, "dlq", "list")
	if len(list) != 1 || list[0].ID != "lost-1" {
		t.Errorf("dlq list after: got %+v, want lost-1 only", list)
	}
}

// dlq show and retry take a number for a DLQ sequence, or for a job ID with
// --by-id, which dlq retry --all refuses (it takes no argument).
func TestCLIDLQNumberThatIsAlsoAJobID(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	s.storeDeadLetter(t, "2", "job.x") // at DLQ seq 1
	s.storeDeadLetter(t, "x", "job.x") // at DLQ seq 2
	if out := s.mustJobq(t, "dlq", "show", "2"); !strings.Contains(out, "id: x\n") {
		t.Errorf("dlq show 2: got %q, want DLQ seq 2, job x", out)
	}
	if out := s.mustJobq(t, "dlq", "show", "--by-id", "2"); !strings.Contains(out, "id: 2\n") || !strings.Contains(out, "payload of 2") {
		t.Errorf("dlq show --by-id 2: got %q, want the dead letter of job 2", out)
	}
	wantOneLineError(t, s.jobq(t, "dlq", "retry", "--all", "--by-id"), 2, "--by-id")
}

// dlq rm deletes a dead letter for good, by its DLQ sequence, or every
// dead letter of a job ID: it does not run, and its record stays failed.
func TestCLIDLQRemove(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{args: []string{"--handler", `job.>=exec:exit 65`}})
	s.enqueue(t, "job.x", "one", "rm-1")
	s.enqueue(t, "job.x", "two", "rm-2")
	s.enqueue(t, "job.x", "three", "rm-3")
	s.waitCounts(t, counts{Records: 3, DLQ: 3})

	if got, want := s.mustJobq(t, "dlq", "rm", "rm-2"), "removed rm-2 (dlq seq 2)\n"; got != want {
		t.Errorf("dlq rm rm-2: got %q, want %q", got, want)
	}
	var removed []map[string]any
	out := s.jobqJSON(t, &removed, "dlq", "remove", "3")
	if len(removed) != 1 || removed[0]["id"] != "rm-3" || removed[0]["dlq_seq"] != 3.0 || len(removed[0]) != 2 {
		t.Errorf("dlq remove --json 3: got %s, want [{id rm-3, dlq_seq 3}]", out)
	}
	wantOneLineError(t, s.jobq(t, "dlq", "rm", "rm-2"), 1, "no such dead letter", `"rm-2"`)
	var list []deadLetterOut
	s.jobqJSON(t, &list, "dlq", "list")
	if len(list) != 1 || list[0].ID != "rm-1" {
		t.Errorf("dlq list after rm: got %+v, want rm-1 only", list)
	}
	for _, id := range []string{"rm-2", "rm-3"} {
		if rec, ok := s.record(t, id); !ok || rec.State != "failed" || rec.Attempts != 1 {
			t.Errorf("job %s after dlq rm: got %+v (found %v), want failed after 1 attempt", id, rec, ok)
		}
	}

	// A number is a DLQ sequence alone: run again once its dead letter is
	// gone, dlq rm 2 does not delete job 2's in its place.
	s.storeDeadLetter(t, "2", "job.x")
	wantOneLineError(t, s.jobq(t, "dlq", "rm", "2"), 1, "no such dead letter", "DLQ seq 2", "--by-id")
	// A job ID takes every dead letter of the job.
	s.storeDeadLetter(t, "2", "job.x")
	if got, want := s.mustJobq(t, "dlq", "rm", "--by-id", "2"), "removed 2 (dlq seq 4)\nremoved 2 (dlq seq 5)\n"; got != want {
		t.Errorf("dlq rm --by-id 2: got %q, want %q", got, want)
	}

	// A dead letter without a job ID, from another client, goes by its
	// sequence.
	m := nats.NewMsg(queue.SubjectDLQPrefix + "job.x")
	m.Header.Set(queue.HeaderSubject, "job.x")
	ack, err := s.jetStream(t).PublishMsg(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	seq := strconv.FormatUint(ack.Sequence, 10)
	// An empty argument (an unset shell variable) is bad usage, not the
	// job ID of the dead letters without one.
	wantOneLineError(t, s.jobq(t, "dlq", "rm", ""), 2, "empty")
	if got, want := s.mustJobq(t, "dlq", "rm", seq), "removed dlq seq "+seq+" (it had no job ID)\n"; got != want {
		t.Errorf("dlq rm %s: got %q, want %q", seq, got, want)
	}

	// A number written with leading zeros is a job ID, not the sequence.
	s.storeDeadLetter(t, "x7", "job.x")  // at DLQ seq 7
	s.storeDeadLetter(t, "007", "job.x") // at DLQ seq 8
	if got, want := s.mustJobq(t, "dlq", "rm", "007"), "removed 007 (dlq seq 8)\n"; got != want {
		t.Errorf("dlq rm 007: got %q, want %q", got, want)
	}
	s.jobqJSON(t, &list, "dlq", "list")
	if len(list) != 2 || list[0].ID != "rm-1" || list[1].ID != "x7" {
		t.Errorf("dlq list at the end: got %+v, want rm-1 and x7", list)
	}
	s.waitCounts(t, counts{Records: 3, DLQ: 2})
}

// dlq retry counts a dead letter it re-enqueued and could not remove from
// DLQ as retried, and lists it with --json.
func TestCLIDLQRetryCountsALetterItCouldNotRemove(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	s.storeDeadLetter(t, "a-1", "job.x")
	s.storeDeadLetter(t, "b-1", "job.x")
	js := s.jetStream(t)
	// DLQ refuses deletes: each re-enqueue lands, and its removal fails.
	st, err := js.Stream(context.Background(), queue.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.DenyDelete = true
	if _, err := js.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatalf("deny deletes on DLQ: %v", err)
	}
	s.wantRetriedOneOfTwo(t, "a-1", "a-1")
}

// wantRetriedOneOfTwo runs dlq retry --all --json and checks that it re-enqueued
// the dead letter of job retried only, listing it, and failed (exit 1) on
// that of job failed.
func (s *jobqServer) wantRetriedOneOfTwo(t *testing.T, retried, failed string) {
	t.Helper()
	r := s.jobq(t, "dlq", "retry", "--all", "--json")
	var out []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out) != 1 || out[0].ID != retried {
		t.Errorf("dlq retry --all --json: stdout %q (%v), want %s listed, which was re-enqueued", r.stdout, err, retried)
	}
	if r.code != 1 || !strings.Contains(r.stderr, "retried 1 of 2 dead letters; "+failed) {
		t.Errorf("dlq retry --all: got %s, want exit 1 saying it retried 1 of 2 and failed on %s", r, failed)
	}
}

// jetStream connects to s, as any JetStream client would; t.Cleanup closes
// the connection.
func (s *jobqServer) jetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(s.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// storeDeadLetter stores a dead letter of job id on subject in s's DLQ, as
// one from an earlier run, with the payload "payload of ID".
func (s *jobqServer) storeDeadLetter(t *testing.T, id, subject string) {
	t.Helper()
	js := s.jetStream(t)
	m := nats.NewMsg(queue.SubjectDLQPrefix + subject)
	m.Header.Set(queue.HeaderJobID, id)
	m.Header.Set(queue.HeaderSubject, subject)
	m.Data = []byte("payload of " + id)
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatalf("store dead letter %s: %v", id, err)
	}
}
