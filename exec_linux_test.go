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
	"time"
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

// A jobq killed (SIGKILL, a crash) takes its commands along, what they
// started too, in the foreground or the background: the job's next attempt
// never runs beside them. The kernel's parent-death signal (Linux) reached
// only sh, so a command of more than one step ran on; now a watchdog in the
// command's process group kills the group once jobq's end of its pipe
// closes. It ignores the signals the group may get: a SIGUSR1 to the group
// (say, "reopen your logs", which the command handles) ended it once, and
// a jobq killed after that left the group running.
func TestCLIKilledJobqTakesWhatItsCommandStartedAlong(t *testing.T) {
	t.Parallel()
	for _, signal := range []syscall.Signal{0, syscall.SIGUSR1} {
		t.Run(fmt.Sprintf("group signal %d", signal), func(t *testing.T) {
			t.Parallel()
			runs := filepath.Join(t.TempDir(), "runs")
			handler := "job.>=exec:trap '' USR1; echo $$ >> " + shq(runs) + "; sleep 300 & sleep 300; true"
			s := startServe(t, serveOpts{args: []string{"--handler", handler}})
			s.enqueue(t, "job.long", "x", "long-1")
			var pgid int
			checkFor(t, waitTimeout, pollInterval, func() error {
				l := lines(t, runs)
				if len(l) != 1 {
					return fmt.Errorf("%d runs, want 1", len(l))
				}
				pid, _ := strconv.Atoi(strings.TrimSpace(l[0])) // sh's
				if pgid = groupOf(t, pid); pgid == 0 {
					return fmt.Errorf("no group for pid %d", pid)
				}
				return nil
			})
			t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
			checkFor(t, waitTimeout, pollInterval, func() error { // both sleeps started
				if n := len(liveInGroup(t, pgid)); n < 4 {
					return fmt.Errorf("%d processes in the command's group, want the watchdog, sh and two sleeps", n)
				}
				return nil
			})
			if signal != 0 {
				if err := syscall.Kill(-pgid, signal); err != nil {
					t.Fatal(err)
				}
			}
			s.Kill(t)
			checkFor(t, waitTimeout, pollInterval, func() error {
				if live := liveInGroup(t, pgid); len(live) > 0 {
					return fmt.Errorf("after jobq was SIGKILLed, its command's process group %d still runs: %q", pgid, live)
				}
				return nil
			})
		})
	}
}

// groupOf returns the process group of pid, from /proc; 0 if it is gone.
func groupOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	stat := string(b)
	f := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
	if len(f) < 3 {
		return 0
	}
	pgid, _ := strconv.Atoi(f[2])
	return pgid
}

// liveInGroup lists the processes of group pgid that are not zombies (a
// zombie is dead, waiting for whoever adopted it to reap it), from /proc.
func liveInGroup(t *testing.T, pgid int) []string {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var live []string
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, not ')'.
		stat := string(b)
		i := strings.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(stat[i+1:])
		if len(f) < 3 || f[0] == "Z" || f[2] != strconv.Itoa(pgid) {
			continue
		}
		live = append(live, stat[:i+1])
	}
	return live
}

// A jobq killed while it starts many commands at once leaves none of them
// running. Each command's sh ran free from its start until its watchdog
// joined its group, and with many jobs starting at once that watchdog's
// own start waited behind theirs: a sh that forked its first child
// meanwhile (here sleep) was killed by the parent-death signal, but the
// child ran on, unwatched, beside the job's next attempt. The command now
// waits for its watchdog before it runs. Before, about two rounds in five
// left a sleep behind (on 2 cores), so ten rounds nearly always did.
func TestCLIKilledJobqWhileStartingCommandsLeavesNoneBehind(t *testing.T) {
	t.Parallel()
	mark := fmt.Sprintf("KILLTEST_MARK=%d-%d", os.Getpid(), time.Now().UnixNano())
	handler := "job.crash.>=exec:sleep 300; true"
	t.Cleanup(func() {
		for _, p := range markedProcesses(t, mark, 0) {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	})
	for round := range 10 {
		s := startServe(t, serveOpts{env: []string{mark}, args: []string{"--handler", handler, "--workers", "64"}})
		publishJobs(t, s.url, 64)
		// Kill once the first command's child runs: the other commands
		// are starting then.
		pid := s.cmd.Process.Pid
		checkFor(t, waitTimeout, time.Millisecond, func() error {
			for _, p := range markedProcesses(t, mark, pid) {
				if p.cmdline == "sleep 300" {
					return nil
				}
			}
			return errors.New("no command's child runs yet")
		})
		s.Kill(t)
		var left []markedProcess
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if left = markedProcesses(t, mark, 0); len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			t.Fatalf("round %d: 3s after jobq was SIGKILLed, what its commands started still runs (%d processes): %+v", round+1, len(left), left)
		}
	}
}

type markedProcess struct {
	pid           int
	cmdline, stat string
}

// markedProcesses lists the live processes (not zombies) but except whose
// environment holds mark, from /proc.
func markedProcesses(t *testing.T, mark string, except int) []markedProcess {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var out []markedProcess
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		if pid == except || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(d + "/environ")
		if err != nil || !strings.Contains("\x00"+string(env), "\x00"+mark+"\x00") {
			continue
		}
		stat, _ := os.ReadFile(d + "/stat")
		s := string(stat)
		if i := strings.LastIndexByte(s, ')'); i < 0 || strings.HasPrefix(s[i+1:], " Z") || strings.HasPrefix(s[i+1:], " X") {
			continue
		}
		cmdline, _ := os.ReadFile(d + "/cmdline")
		out = append(out, markedProcess{pid: pid, cmdline: strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " ")), stat: strings.TrimSpace(s)})
	}
	return out
}
