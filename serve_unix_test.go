//go:build unix

package main

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A serve that cannot open its --http address exits 1 before its workers
// start: it takes no stored job, which would otherwise spend one of its
// deliveries and wait out the ack wait before it ran again.
func TestCLIServeWithHTTPTakenTakesNoJobs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	runs := filepath.Join(t.TempDir(), "runs")
	s := startServe(t, serveOpts{dir: dir})
	var ndjson strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&ndjson, "{\"subject\":\"job.bulk\",\"id\":\"bulk-%d\",\"payload\":\"x\"}\n", i)
	}
	if r := s.jobqIn(t, ndjson.String(), "import", "-"); r.code != 0 {
		t.Fatalf("import: %s", r)
	}
	s.Stop(t)

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	r := jobq(t, "serve", "--store-dir", dir, "--listen", freeAddr(t), "--http", taken.Addr().String(),
		"--log-format", "json", "--handler", `job.>=exec:echo "$JOBQ_JOB_ID" >> `+shq(runs))
	if r.code != 1 || !strings.Contains(r.stderr, "listen on --http") {
		t.Fatalf("serve with --http taken: got %s, want exit 1 naming --http", r)
	}
	if strings.Contains(r.stderr, "workers started") {
		t.Errorf("serve with --http taken started its workers before it gave up")
	}

	// What it left behind, seen from a broker on the same store.
	s = startServe(t, serveOpts{dir: dir})
	st := s.status(t)
	if st.Consumer.AckPending != 0 || st.Ledger.Leases != 0 {
		t.Errorf("after the serve that failed to start: %d jobs delivered and not handed back, %d pool leases left; want 0 and 0 (handlers ran %d times)",
			st.Consumer.AckPending, st.Ledger.Leases, len(lines(t, runs)))
	}
}

// SIGTERM while serve starts up (here: as soon as the embedded server is
// up, while JOB, WORKER and the bucket are provisioned) stops it with exit
// status 0, as it does a moment later: a stop, not a failure.
func TestCLISigtermDuringStartUpExitsZero(t *testing.T) {
	t.Parallel()
	for attempt := range 5 {
		s := launchServe(t, serveOpts{dir: t.TempDir()})
		s.ended = true
		for !strings.Contains(s.logText(), "embedded nats server ready") && !s.exited() {
			time.Sleep(time.Millisecond)
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		<-s.done
		if code := s.state.ExitCode(); code != 0 {
			t.Fatalf("attempt %d: SIGTERM during start-up: got %s, want exit status 0; log tail:\n%s", attempt, s.state, s.logTail(5))
		}
	}
}

// jobq serve --server, stopped while that server is away (a NATS cluster
// restarted for maintenance), stops within --shutdown-timeout: it has no
// running job to wait for, and the server cannot answer it anyway. It
// waited 10s more for the delete of its pool's lease.
func TestServeStopsInTimeWhileItsServerIsAway(t *testing.T) {
	t.Parallel()
	broker := startServe(t, serveOpts{})
	w := startServe(t, serveOpts{args: []string{"--server", broker.url, "--handler", "job.>=log", "--shutdown-timeout", "2s"}})
	broker.enqueue(t, "job.away", "x", "away-1")
	broker.waitState(t, "away-1", "done")
	broker.Stop(t)
	time.Sleep(time.Second) // its connections see the server gone

	if took := w.Stop(t); took > 5*time.Second {
		t.Errorf("serve --server --shutdown-timeout 2s, its server away, took %s to stop after SIGTERM; want within 5s", took.Round(100*time.Millisecond))
	}
}
