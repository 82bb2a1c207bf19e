//go:build linux

package handlers_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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

// The command's group keeps its ID while its watchdog may kill it: once
// the command's sh exited, and while Process waits out output that
// something outside the group still holds, the ID is not free for another
// group, which a dying jobq's watchdog would kill. The watchdog is a member
// of the group, alive until Process reaps it.
func TestExecGroupKeepsItsIDWhileWatched(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	t.Parallel()
	dir := t.TempDir()
	shPID, bgPID := filepath.Join(dir, "sh.pid"), filepath.Join(dir, "bg.pid")
	var out bytes.Buffer
	// sh writes its PID and its group's ID: "PID PGID".
	h := handlers.Exec(`read -r pid _ _ _ pgid _ < /proc/$$/stat; echo "$pid $pgid" > "$SH_PID"; setsid sh -c 'echo $$ > "$BG_PID"; exec sleep 30' &`,
		handlers.ExecOptions{Stdout: &out, Env: []string{"SH_PID=" + shPID, "BG_PID=" + bgPID}})
	t.Cleanup(func() {
		if b, err := os.ReadFile(bgPID); err == nil {
			if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	done := make(chan error, 1)
	go func() { done <- h.Process(context.Background(), &data.Job{ID: "g", Subject: "job.x"}) }()
	var sh, pgid int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the command did not start")
		}
		b, err := os.ReadFile(shPID)
		if f := strings.Fields(string(b)); err == nil && len(f) == 2 {
			sh, _ = strconv.Atoi(f[0])
			pgid, _ = strconv.Atoi(f[1])
			break
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", sh)); os.IsNotExist(err) {
			break // sh exited and was reaped; its output is still held
		}
		if time.Now().After(deadline) {
			t.Fatal("the command's sh did not exit")
		}
	}
	select {
	case err := <-done:
		t.Fatalf("Process returned (%v) before the held output was waited out", err)
	default:
	}
	if err := syscall.Kill(-pgid, 0); err != nil {
		t.Errorf("the command's group %d is gone (%v) while its watchdog may still kill it: its ID is free for another group", pgid, err)
	}
	<-done
}

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
