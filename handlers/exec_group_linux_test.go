//go:build linux

package handlers_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// $$ names the command's process group, which its sh leads, as before the
// watchdog: kill -- -$$ in the command, or a supervisor's kill(-PID), as
// main_test.go's killGroup does, reach it. With the watchdog as the
// group's leader they did not.
func TestExecCommandsPIDNamesItsGroup(t *testing.T) {
	t.Parallel()
	pidf := filepath.Join(t.TempDir(), "pid")
	h := handlers.Exec(`echo $$ > "$PIDF.tmp"; mv "$PIDF.tmp" "$PIDF"; sleep 30 & wait`,
		handlers.ExecOptions{Env: []string{"PIDF=" + pidf}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.Process(context.Background(), &data.Job{ID: "r", Subject: "job.x"})
	}()
	var pid int
	for deadline := time.Now().Add(10 * time.Second); pid == 0; time.Sleep(5 * time.Millisecond) {
		if b, err := os.ReadFile(pidf); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		} else if time.Now().After(deadline) {
			t.Fatal("the command did not start")
		}
	}
	pgid, _ := syscall.Getpgid(pid)
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL); <-done })
	if err := syscall.Kill(-pid, syscall.SIGTERM); err != nil {
		t.Errorf("kill(-%d, SIGTERM), the command's sh's PID: %v; its group is %d, the watchdog's", pid, err, pgid)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Errorf("the command still runs 5s after SIGTERM to -$$")
	}
}
