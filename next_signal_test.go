package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobq/jobq/server/servertest"
)

// jobq next shows its job and records it done; its look-ups of JOB before
// the ack go unanswered (three tries, up to ten seconds), and the user hits
// Ctrl-C meanwhile. jobq next says that the job ran and was not
// acknowledged. Before, it said that the job was handed back unshown: any
// error after a signal was taken for one the signal caused.
func TestNextInterruptedWhileItsAckWaitsForItsLookUpSaysWhatHappened(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	s.enqueue(t, "job.next", "MARKER-sig-1", "sig-1")
	// From the job's delivery on, jobq next's look-ups of JOB go
	// unanswered, the connection up.
	px := servertest.NewProxy(t, strings.TrimPrefix(s.url, "nats://"))
	var stall atomic.Bool
	px.Watch(func(chunk []byte) bool {
		return !stall.Load() || !bytes.Contains(chunk, []byte("$JS.API.STREAM.INFO.JOB"))
	}, func(chunk []byte) {
		if bytes.Contains(chunk, []byte("MARKER-sig-1")) {
			stall.Store(true)
		}
	})
	cmd := exec.Command(jobqBin, "next", "--server", px.URL)
	cmd.Env = subprocessEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	shown := make(chan string, 1)
	go func() {
		var out strings.Builder
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "MARKER-sig-1") {
				shown <- out.String()
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case out := <-shown:
		t.Logf("jobq next showed:\n%s", out)
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("jobq next did not show its job")
	}
	time.Sleep(2 * time.Second) // its ack waits for a look-up of JOB
	cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("jobq next still running 30s after Ctrl-C")
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("jobq next: %v, want exit status 1; stderr: %s", err, stderr.String())
	}
	if rec, ok := s.record(t, "sig-1"); !ok || rec.State != "done" {
		t.Fatalf("job sig-1: record %+v (found %v), want done", rec, ok)
	}
	if strings.Contains(stderr.String(), "handed back unshown") || !strings.Contains(stderr.String(), "not acknowledged") {
		t.Errorf("jobq next, interrupted after it showed job sig-1 and recorded it done, its ack held back, says:\n%s\nwant it to say the job ran and was not acknowledged, not that it was handed back unshown", stderr.String())
	}
}
