//go:build unix

package handlers_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// A cancelled command's group gets its 5s between SIGTERM and SIGKILL also
// when the command's own sh ends at once and holds no pipe of jobq's: a
// command that sends its output to a file (the usual way to keep it, as
// jobq discards stdout) is run by sh in a child, which sh, dying on
// SIGTERM, leaves to finish its cleanup. It was killed as soon as sh was
// gone.
func TestExecCancelGivesTheGroupItsGrace(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	child := `trap 'sleep 1; echo clean > "$1/cleaned"; exit 0' TERM
echo $$ > "$1/pid.tmp" && mv "$1/pid.tmp" "$1/pid"
while :; do sleep 0.1; done
`
	if err := os.WriteFile(filepath.Join(dir, "child.sh"), []byte(child), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := "sh " + shellQuote(filepath.Join(dir, "child.sh")) + " " + shellQuote(dir) + " >/dev/null 2>&1"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- handlers.Exec(cmd, handlers.ExecOptions{}).Process(ctx, &data.Job{Subject: "job.x"}) }()
	eventually(t, "the command starts", func() bool {
		_, err := os.Stat(filepath.Join(dir, "pid"))
		return err == nil
	})
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, dir, "pid")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Process = %v, want an error wrapping %v", err, context.Canceled)
	}
	if _, err := os.Stat(filepath.Join(dir, "cleaned")); err != nil {
		t.Errorf("the command's child did not finish its SIGTERM cleanup (%v): got SIGKILL before its 5s were up", err)
	}
	if !processGone(pid) {
		t.Errorf("process %d runs on after Process returned, want the group gone", pid)
	}
}

// A Stdout writer that fails does not fail the job: the command exited 0,
// and its exit status decides, as a failing Stderr writer does not either.
// The job was retried, its work done again.
func TestExecStdoutWriteErrorDoesNotFailTheJob(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := writeScript(t, dir, `echo out; echo done > "$1/effect"`+"\n")
	err := handlers.Exec(cmd, handlers.ExecOptions{Stdout: errWriter{}}).Process(context.Background(), &data.Job{Subject: "job.x"})
	if _, serr := os.Stat(filepath.Join(dir, "effect")); serr != nil {
		t.Fatalf("the command did not run: %v", serr)
	}
	if err != nil {
		t.Errorf("Process = %v, want nil: the command exited 0", err)
	}
}

// An Exec handler runs jobs at once (one per worker); their output reaches
// a Stdout and Stderr they share one write at a time, as one command's
// does: a bytes.Buffer given to Exec is safe (go test -race).
func TestExecConcurrentJobsShareTheWriters(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	h := handlers.Exec("echo out; echo err >&2", handlers.ExecOptions{Stdout: &buf, Stderr: &buf})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if err := h.Process(context.Background(), &data.Job{ID: strconv.Itoa(i), Subject: "job.x"}); err != nil {
				t.Errorf("Process = %v, want nil", err)
			}
		})
	}
	wg.Wait()
	if got, want := strings.Count(buf.String(), "out\n"), 4; got != want {
		t.Errorf("stdout lines = %d, want %d", got, want)
	}
}
