//go:build linux

package handlers_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// Each command's watchdog (see watchGroup) is gone once Process returns,
// and reaped: none is left behind, as a zombie per job would be under a
// jobq that is a container's PID 1. The test runs alone (no t.Parallel):
// no other test's command is a child meanwhile.
func TestExecLeavesNoWatchdogBehind(t *testing.T) {
	h := handlers.Exec("true", handlers.ExecOptions{})
	for i := range 5 {
		if err := h.Process(context.Background(), &data.Job{ID: strconv.Itoa(i), Subject: "job.x"}); err != nil {
			t.Fatal(err)
		}
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	me := strconv.Itoa(os.Getpid())
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		stat := string(b)
		i := strings.LastIndexByte(stat, ')')
		// A child of this process left, dead (a zombie, unreaped) or
		// alive: the commands' own sh are reaped by Wait.
		if fields := strings.Fields(stat[i+1:]); len(fields) > 1 && fields[1] == me && strings.HasSuffix(stat[:i+1], "(sh)") {
			t.Errorf("a watchdog is left behind: %s, state %s", stat[:i+1], fields[0])
		}
	}
}
