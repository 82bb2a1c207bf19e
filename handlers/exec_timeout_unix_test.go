//go:build unix

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

// A command's exit status decides its job also when the job's ctx ends
// (--job-timeout, shutdown) after the command exited, while Wait waits up
// to 6s (WaitDelay) for the output that something it left behind holds:
// a done job is not retried, and a permanent failure is not retried.
func TestExecExitStatusDecidesAfterTheCommandExited(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		exit      int
		permanent bool
	}{{"exit 0", 0, false}, {"exit 65", 65, true}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cmd := writeScript(t, dir, `
sleep 30 &
echo $! > "$1/pid.tmp" && mv "$1/pid.tmp" "$1/pid"
echo ran > "$1/effect"
exit `+strconv.Itoa(tt.exit)+"\n")
			t.Cleanup(func() {
				if b, err := os.ReadFile(filepath.Join(dir, "pid")); err == nil {
					if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			})
			// The job timeout ends 2s in: the command exited long before.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			err := handlers.Exec(cmd, handlers.ExecOptions{}).Process(ctx, &data.Job{Subject: "job.x"})
			if _, serr := os.Stat(filepath.Join(dir, "effect")); serr != nil {
				t.Fatalf("the command did not run: %v", serr)
			}
			if tt.exit == 0 && err != nil {
				t.Errorf("Process = %v, want nil: the command exited 0 before the job timeout", err)
			}
			if tt.exit != 0 && !handlers.IsPermanent(err) {
				t.Errorf("Process = %v, want a permanent error: the command exited %d before the job timeout", err, tt.exit)
			}
		})
	}
}
