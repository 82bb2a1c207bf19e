//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// One at a time after a SIGKILL: an exec handler's command dies with the
// jobq that started it (a parent-death signal), so the restarted jobq's
// rerun of the job, once the ack wait is over, does not run beside it.
func TestCLIKilledJobqTakesItsCommandAlong(t *testing.T) {
	t.Parallel()
	dir, work := t.TempDir(), t.TempDir()
	runs := filepath.Join(work, "runs")
	handler := "job.>=exec:echo \"$JOBQ_ATTEMPT $$\" >> " + shq(runs) + "; exec sleep 20"
	var pids []int
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	})
	readRuns := func() error {
		pids = pids[:0]
		for _, l := range lines(t, runs) {
			f := strings.Fields(l)
			pid, _ := strconv.Atoi(f[len(f)-1])
			pids = append(pids, pid)
		}
		return nil
	}
	s := startServe(t, serveOpts{dir: dir, args: []string{"--ack-wait", "3s", "--handler", handler}})
	s.enqueue(t, "job.long", "x", "long-1")
	checkFor(t, waitTimeout, pollInterval, func() error {
		readRuns()
		if len(pids) != 1 {
			return fmt.Errorf("%d runs, want 1", len(pids))
		}
		return nil
	})
	first := pids[0]
	s.Kill(t)
	s = startServe(t, serveOpts{dir: dir, args: []string{"--ack-wait", "3s", "--handler", handler}})
	checkFor(t, waitTimeout, pollInterval, func() error {
		readRuns()
		if len(pids) < 2 {
			return fmt.Errorf("%d runs, want the rerun", len(pids))
		}
		return nil
	})
	stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", first))
	if err := syscall.Kill(first, 0); !errors.Is(err, syscall.ESRCH) && !strings.Contains(string(stat), ") Z ") {
		t.Errorf("job long-1 runs twice at once: the first command (pid %d, started by the killed jobq) still runs beside the rerun (pid %d); runs: %q, /proc stat %q", first, pids[1], lines(t, runs), stat)
	}
	s.Kill(t)
}
