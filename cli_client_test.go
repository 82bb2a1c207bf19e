//go:build unix

package main

// Review tests of the client commands as a user meets them. Each fails on
// the code it was written against and shows a defect; see the report.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// A dead letter's re-drive has a Nats-Msg-Id of its own, which no job may
// take: the re-drive of DLQ seq 1 was once "retry-1", so that a job a user
// had enqueued with that ID within the dedupe window made it a duplicate.
// Nothing was stored, yet the dead letter was removed and the command said
// it was retried: the job was in neither stream.
func TestDLQRetryIsNotTakenForAUsersJob(t *testing.T) {
	t.Parallel()
	fixed := filepath.Join(t.TempDir(), "fixed")
	s := startServe(t, serveOpts{args: []string{
		"--handler", "job.>=exec:[ \"$JOBQ_SUBJECT\" != job.invoice ] || [ -e " + shq(fixed) + " ] || exit 65",
	}})
	s.enqueue(t, "job.report", "monthly", "retry-1")
	s.waitState(t, "retry-1", "done")
	s.enqueue(t, "job.invoice", `{"n":7}`, "invoice-7")
	s.waitState(t, "invoice-7", "failed")
	if err := os.WriteFile(fixed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s.mustJobq(t, "dlq", "retry", "invoice-7")
	if rec := s.waitState(t, "invoice-7", "done"); rec.Attempts != 2 {
		t.Errorf("invoice-7 after its re-drive: %d attempts, want 2", rec.Attempts)
	}
	r := s.jobq(t, "enqueue", "job.x", "p", "--id", "jobq-retry-1-5")
	wantOneLineError(t, r, 2, "jobq-retry-", "re-driven dead letters")
}

// README, `jobq next`: exit 1 "if the job could not be printed (the attempt
// counts as failed: the job is retried ...)". Into a closed pipe (jobq next
// | head -1, a pager quit early) jobq is killed by SIGPIPE instead: no
// message, no failed attempt recorded, and the job is stuck on the dead
// process's lease, away from every worker until the ack wait runs out.
func TestNextIntoAClosedPipe(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	s.enqueue(t, "job.next", "payload", "pipe-1")
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	rd.Close() // the reader went away
	var stderr bytes.Buffer
	cmd := exec.Command(jobqBin, "next", "--server", s.url)
	cmd.Env = subprocessEnv()
	cmd.Stdout, cmd.Stderr = wr, &stderr
	err = cmd.Run()
	wr.Close()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "print job pipe-1") {
		t.Errorf("next into a closed pipe: got %v, stderr %q; want exit 1 saying it could not print job pipe-1", err, stderr.String())
	}
	rec, ok := s.record(t, "pipe-1")
	if !ok || rec.State != "retrying" {
		st := s.status(t)
		t.Errorf("job pipe-1 after next failed to print it: record %v %q, want the failed attempt recorded (retrying); JOB %d jobs, %d ack pending, %d pool leases",
			ok, rec.State, st.Stream.Messages, st.Consumer.AckPending, st.Ledger.Leases)
	}
}

// delayingProxy forwards TCP connections to target; on each connection,
// the first client chunk holding match is held for delay before it goes on.
func delayingProxy(t *testing.T, target, match string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { io.Copy(c, up); c.Close() }()
				buf, held := make([]byte, 64<<10), false
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if !held && bytes.Contains(buf[:n], []byte(match)) {
							held = true
							time.Sleep(delay)
						}
						if _, werr := up.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	})
	return "nats://" + ln.Addr().String()
}

// --timeout is "how long to wait for the server", for every client command.
// The dlq commands (and next) use the request context without it, so each
// JetStream request gets nats.go's default of 5s: a server that takes 7s to
// answer fails `jobq dlq list --timeout 20s`, and --timeout 1s waits 5s.
func TestDLQListHonoursTimeout(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	s.storeDeadLetter(t, "slow-1", "job.x")
	slow := delayingProxy(t, strings.TrimPrefix(s.url, "nats://"), "GET.DLQ", 7*time.Second)
	// The control: status through the same kind of proxy, held 7s on its
	// DLQ read, honours --timeout 20s.
	slowInfo := delayingProxy(t, strings.TrimPrefix(s.url, "nats://"), "STREAM.INFO.DLQ", 7*time.Second)
	if r := jobq(t, "status", "--server", slowInfo, "--timeout", "20s"); r.code != 0 {
		t.Errorf("status --timeout 20s with a 7s answer: got %s", r)
	}
	start := time.Now()
	r := jobq(t, "dlq", "list", "--server", slow, "--timeout", "20s")
	if r.code != 0 || !strings.Contains(r.stdout, "slow-1") {
		t.Errorf("dlq list --timeout 20s with a 7s answer: after %s got %s", time.Since(start).Round(100*time.Millisecond), r)
	}
}

// A first attempt runs on its pool's lease and has no record until it
// ends: jobq job shows it leased, on which worker, rather than that it has
// no record because it has "run for less than a third of --ack-wait"; and
// so a job fetched into the lease and waiting for a worker: the lease does
// not tell the two apart, and neither is shown running.
func TestJobOfAJobRunningOnItsPoolsLease(t *testing.T) {
	t.Parallel()
	started := filepath.Join(t.TempDir(), "started")
	s := startServe(t, serveOpts{args: []string{
		"--workers", "1", "--ack-wait", "3s", "--shutdown-timeout", "1s",
		"--handler", "job.slow=exec:echo \"$JOBQ_JOB_ID\" >> " + shq(started) + "; exec sleep 30",
	}})
	s.enqueue(t, "job.slow", "x", "first")
	checkFor(t, waitTimeout, pollInterval, func() error {
		_, err := os.Stat(started)
		return err
	})
	s.enqueue(t, "job.slow", "x", "second")
	time.Sleep(4 * time.Second) // past the whole ack wait; second fetched, waiting for the one worker
	if got := lines(t, started); len(got) != 1 {
		t.Fatalf("handlers started: %q, want only the first", got)
	}
	for _, id := range []string{"first", "second"} {
		rec := s.waitState(t, id, "leased")
		if rec.Worker == "" || rec.LeaseUntil.IsZero() {
			t.Errorf("jobq job %s: %+v; want its worker and until when it is held", id, rec)
		}
		r := s.jobq(t, "job", id)
		if r.code != 0 || strings.Contains(r.stdout, "running") || !strings.Contains(r.stdout, "its record is written when it ends") {
			t.Errorf("jobq job %s: got %s", id, r)
		}
	}
}

// A payload that is not UTF-8 comes out of next --json and dlq show --json
// in payload_base64, as import takes it: as JSON text each such byte would
// be U+FFFD, and the job, recorded done, could not be had again. A UTF-8
// payload stays text.
func TestJSONOutputKeepsABinaryPayload(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})               // no workers: next takes the jobs
	payload := []byte("caf\xe9 \xff\xfe\x00\x01") // Latin-1 "café", then binary
	f := filepath.Join(t.TempDir(), "payload.bin")
	if err := os.WriteFile(f, payload, 0o644); err != nil {
		t.Fatal(err)
	}
	type out struct {
		Payload       *string `json:"payload"`
		PayloadBase64 string  `json:"payload_base64"`
	}
	check := func(what, got string, want []byte) {
		t.Helper()
		var o out
		if err := json.Unmarshal([]byte(got), &o); err != nil {
			t.Fatalf("%s: decode %q: %v", what, got, err)
		}
		b, err := base64.StdEncoding.DecodeString(o.PayloadBase64)
		switch {
		case utf8.Valid(want) && (o.Payload == nil || *o.Payload != string(want) || o.PayloadBase64 != ""):
			t.Errorf("%s: got %q; want the payload %q as text", what, got, want)
		case !utf8.Valid(want) && (o.Payload != nil || err != nil || !bytes.Equal(b, want)):
			t.Errorf("%s: got %q; want the payload %q in payload_base64 alone", what, got, want)
		}
	}
	s.mustJobq(t, "enqueue", "job.bin", "--file", f, "--id", "bin-1")
	s.mustJobq(t, "enqueue", "job.txt", "café ✓", "--id", "txt-1")
	check("next --json of a binary payload", s.mustJobq(t, "next", "--json"), payload)
	check("next --json of a text payload", s.mustJobq(t, "next", "--json"), []byte("café ✓"))
	js := s.jetStream(t)
	m := nats.NewMsg(queue.SubjectDLQPrefix + "job.bin")
	m.Header.Set(queue.HeaderJobID, "dead-bin")
	m.Data = payload
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	check("dlq show --json of a binary payload", s.mustJobq(t, "dlq", "show", "--json", "--by-id", "dead-bin"), payload)
}

// dlq list cuts an error at 80 bytes, which may fall inside a UTF-8
// character: the table then holds invalid UTF-8 (a stray byte and "…").
func TestDLQListCutsErrorsInsideACharacter(t *testing.T) {
	t.Parallel()
	msg := strings.Repeat("x", 62) + "é la facture est introuvable" // "exit status 65: " + 62 bytes: é at bytes 78-79
	s := startServe(t, serveOpts{args: []string{"--handler", "job.fr=exec:echo " + shq(msg) + " >&2; exit 65"}})
	s.enqueue(t, "job.fr", "x", "fr-1")
	s.waitState(t, "fr-1", "failed")
	out := s.mustJobq(t, "dlq", "list")
	if !utf8.ValidString(out) {
		t.Errorf("dlq list: output is not valid UTF-8: %q", out)
	}
}

// dlq list shows 100 dead letters by default and nothing says there are
// more: with 101 in DLQ the table looks complete. (A judgement call; the
// default is documented, but import's summary says "… and N more".)
func TestDLQListSaysWhenItShowsOnlySome(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	js := s.jetStream(t)
	for i := range 101 {
		m := nats.NewMsg(queue.SubjectDLQPrefix + "job.x")
		m.Header.Set(queue.HeaderJobID, "many-"+strconv.Itoa(i))
		m.Header.Set(queue.HeaderSubject, "job.x")
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	out := s.mustJobq(t, "dlq", "list")
	if rows := strings.Count(out, "many-"); rows != 100 || !strings.HasSuffix(out, "… and 1 more (--limit 0 shows all)\n") {
		t.Errorf("dlq list with 101 dead letters: %d rows, output ends %q; want 100 and a line saying there is 1 more", rows, out[max(0, len(out)-80):])
	}
	if out := s.mustJobq(t, "dlq", "list", "--limit", "0"); strings.Count(out, "many-") != 101 || strings.Contains(out, "more") {
		t.Errorf("dlq list --limit 0: want all 101 rows and no note: %q", out[max(0, len(out)-80):])
	}
}

// A --file that is not there is a runtime failure (exit 1), where a
// --tls-ca or --config file that is not there is bad usage (exit 2), and
// the message does not name the flag. (A judgement call.)
func TestEnqueueMissingFileIsBadUsage(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "payload.json")
	r := jobq(t, "enqueue", "job.x", "--file", missing, "--server", "nats://"+freeAddr(t))
	wantOneLineError(t, r, 2, "--file", "payload.json", "no such file")
	r = jobq(t, "import", missing, "--server", "nats://"+freeAddr(t))
	wantOneLineError(t, r, 2, "import", "payload.json", "no such file")
}

// A bad -H is bad usage (exit 2), found before jobq enqueue connects: with
// no server there, it was reported as one that cannot be reached (exit 1).
// A value with spaces or tabs around is refused: the server stored it
// trimmed, another value than given.
func TestEnqueueBadHeaderIsBadUsageWithoutAServer(t *testing.T) {
	t.Parallel()
	down := "nats://" + freeAddr(t)
	r := jobq(t, "enqueue", "--server", down, "--timeout", "1s", "-H", "Jobq-Job-Id=other", "job.h", "x")
	wantOneLineError(t, r, 2, "Jobq-Job-Id", "jobq's own")
	r = jobq(t, "enqueue", "--server", down, "--timeout", "1s", "-H", "X-Sig=  v  ", "job.h", "x")
	wantOneLineError(t, r, 2, "X-Sig", "space or tab")
}

// jobq enqueue waits --timeout for each publish's acknowledgement, and
// sends a lost one again within the 4 x --timeout it waits in all. Each
// publish waited 5s whatever --timeout said: a server answering in 6s
// failed every attempt of an enqueue --timeout 20s, and with --timeout 1s
// the first publish took the whole wait, a lost one never sent again.
func TestEnqueueWaitsTimeoutForEachPublish(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	px := servertest.NewProxy(t, strings.TrimPrefix(s.url, "nats://"))
	var dropped atomic.Bool
	px.Watch(func(chunk []byte) bool {
		switch {
		case bytes.Contains(chunk, []byte("PUB job.slow")):
			time.Sleep(6 * time.Second) // a slow server: the publish reaches it 6s late
		case bytes.Contains(chunk, []byte("PUB job.lost")) && dropped.CompareAndSwap(false, true):
			return false // the first publish is lost on the way
		}
		return true
	}, nil)
	var wg sync.WaitGroup
	wg.Go(func() {
		r := jobq(t, "enqueue", "--server", px.URL, "--timeout", "8s", "--id", "slow-1", "job.slow", "x")
		if r.code != 0 {
			t.Errorf("enqueue --timeout 8s, its publish answered in 6s: %s", r)
		}
	})
	wg.Go(func() {
		r := jobq(t, "enqueue", "--server", px.URL, "--timeout", "1s", "--id", "lost-1", "job.lost", "x")
		if r.code != 0 {
			t.Errorf("enqueue --timeout 1s, its first publish lost: %s; want it sent again", r)
		}
	})
	wg.Wait()
	if st := s.status(t); st.Stream.Messages != 2 {
		t.Errorf("JOB holds %d jobs, want slow-1 and lost-1", st.Stream.Messages)
	}
}

// --max-store lowered on an existing store (the disk got smaller, or the
// first guess was too generous): JOB and DLQ get their new, smaller caps,
// and the stored job is kept. jobq serve did not start: the caps from
// before added up to more than the new limit, and the server refused even
// the edits that lower them (10047, insufficient storage resources).
func TestServeStartsAfterMaxStoreIsLowered(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServe(t, serveOpts{dir: dir, args: []string{"--max-store", "1073741824"}}) // 1 GiB
	s.enqueue(t, "job.keep", "x", "lowered-1")
	s.Stop(t)

	s = launchServe(t, serveOpts{dir: dir, args: []string{"--max-store", "268435456"}}) // 256 MiB
	if err := s.waitReady(readyTimeout); err != nil {
		s.ended = true
		t.Fatalf("serve with --max-store lowered from 1 GiB to 256 MiB: %v\nlog:\n%s", err, s.logTail(4))
	}
	js := s.jetStream(t)
	for name, want := range map[string]int64{"JOB": 192 << 20, "DLQ": 32 << 20} {
		st, err := js.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CachedInfo().Config.MaxBytes; got != want {
			t.Errorf("stream %s: max bytes %d, want %d", name, got, want)
		}
	}
	if got := s.status(t).counts(); got.Messages != 1 {
		t.Errorf("after restart: got %+v, want the stored job kept", got)
	}
}

// On a bucket without direct gets no pool leases jobs, and the leases
// cannot be read: jobq job of a job with no record says so, as before it
// read the leases, rather than fail on the read.
func TestJobOfAPendingJobOnABucketWithoutDirectGets(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	js := s.jetStream(t)
	ctx := context.Background()
	st, err := js.Stream(ctx, "KV_"+queue.BucketProcessed)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("turn direct gets off: %v", err)
	}
	s.enqueue(t, "job.pending", "x", "pending-1") // no workers: it stays pending
	r := s.jobq(t, "job", "pending-1")
	wantOneLineError(t, r, 1, `no ledger record for job "pending-1"`)
}

// Ctrl-C ends a jobq next that is still connecting at once: it holds no
// job yet. Caught before, it waited out --timeout.
func TestNextInterruptedWhileConnecting(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts, and never says INFO
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	cmd := exec.Command(jobqBin, "next", "--timeout", "30s", "--server", "nats://"+ln.Addr().String())
	cmd.Env = subprocessEnv()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	sent := time.Now()
	cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Errorf("jobq next still running %s after Ctrl-C (waiting to connect, --timeout 30s)", time.Since(sent).Round(time.Second))
	}
}

// An unreadable lease stops every pool from taking new jobs until it is
// deleted. jobq job of a job with no record says that the leases cannot be
// read, and why, rather than that the job is merely pending.
func TestJobReportsAnUnreadableLease(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	kv, err := s.jetStream(t).KeyValue(context.Background(), queue.BucketProcessed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), data.LeasePrefix+"bogus", []byte("not a lease")); err != nil {
		t.Fatal(err)
	}
	s.enqueue(t, "job.pending", "x", "pending-1")
	r := s.jobq(t, "job", "pending-1")
	if !strings.Contains(r.stderr, "corrupt") {
		t.Errorf("jobq job with an unreadable lease in the ledger: got %s; want the lease's error", r)
	}
}

// A deleted DLQ holds no dead letters, and the client commands go on
// without it: they all failed at their look-up of DLQ ("is jobq serve
// running?") until a pool made it again, which takes a failed job, which
// no job enqueued by jobq could be meanwhile.
func TestClientCommandsWhileDLQIsDeleted(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{args: []string{"--handler", "job.>=log"}})
	if err := s.jetStream(t).DeleteStream(context.Background(), "DLQ"); err != nil {
		t.Fatal(err)
	}
	if r := s.jobq(t, "enqueue", "job.x", "hi", "--id", "after-dlq-rm"); r.code != 0 {
		t.Errorf("enqueue with DLQ deleted: %s; want the job stored (exit 0)", r)
	}
	for _, args := range [][]string{{"dlq", "list"}, {"status"}, {"dlq", "purge"}, {"dlq", "retry", "--all"}} {
		if r := s.jobq(t, args...); r.code != 0 {
			t.Errorf("jobq %s with DLQ deleted: %s; want exit 0", strings.Join(args, " "), r)
		}
	}
	r := s.jobq(t, "dlq", "retry", "1")
	wantOneLineError(t, r, 1, "no such dead letter", "DLQ was deleted")
}

// --max-store gives JOB three quarters and DLQ an eighth: the rest is the
// ledger's, which dead letters nobody cleared could otherwise take.
func TestServeMaxStoreSplitsTheStore(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{args: []string{"--max-store", "8388608"}})
	js := s.jetStream(t)
	for name, want := range map[string]int64{"JOB": 6 << 20, "DLQ": 1 << 20} {
		st, err := js.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CachedInfo().Config.MaxBytes; got != want {
			t.Errorf("stream %s: max bytes %d, want %d", name, got, want)
		}
	}
}
