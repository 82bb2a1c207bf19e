//go:build linux

package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// jobq next whose output cannot be written (here /dev/full, a full disk)
// fails with exit 1, saying that the attempt counts as failed: the job is
// not recorded done, as it was not shown.
func TestCLINextFailsWhenItCannotPrintTheJob(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	s.enqueue(t, "job.next", "payload", "p-1")
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("open /dev/full: %v", err)
	}
	defer full.Close()
	var stderr bytes.Buffer
	cmd := exec.Command(jobqBin, "next", "--server", s.url)
	cmd.Stdout, cmd.Stderr = full, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), "print job p-1") || !strings.Contains(stderr.String(), "counts as failed") {
		t.Errorf("next into a full disk: got %v, stderr %q; want exit 1 saying it could not print the job", err, stderr.String())
	}
	if rec, ok := s.record(t, "p-1"); ok && rec.State == "done" {
		t.Errorf("job p-1 recorded done, though next could not show it")
	}
	if got := s.status(t).counts(); got.Messages != 1 {
		t.Errorf("after next failed: JOB holds %d jobs, want p-1 still there", got.Messages)
	}
}
