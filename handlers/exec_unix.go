//go:build unix

package handlers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// groupKiller signals a command's process group when its context ends.
type groupKiller struct {
	cmd *exec.Cmd

	mu       sync.Mutex
	canceled bool
	finished bool
	timer    *time.Timer
}

// killGroupOnCancel starts cmd in a process group of its own and sets its
// Cancel to send SIGTERM to the whole group, then SIGKILL after delay. Call
// done once Wait returns.
func killGroupOnCancel(cmd *exec.Cmd, delay time.Duration) *groupKiller {
	g := &groupKiller{cmd: cmd}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	dieWithJobq(cmd.SysProcAttr)
	cmd.Cancel = func() error {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.finished {
			return os.ErrProcessDone
		}
		g.canceled = true
		g.timer = time.AfterFunc(delay, func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if !g.finished {
				_ = g.signal(syscall.SIGKILL)
			}
		})
		return g.signal(syscall.SIGTERM)
	}
	return g
}

// done stops the kill timer and reports whether the command was cancelled
// while it ran. If it was, it kills what is left of its group, so nothing
// the job started outlives Process.
func (g *groupKiller) done(context.Context) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.finished = true
	if g.timer != nil {
		g.timer.Stop()
	}
	if g.canceled {
		_ = g.signal(syscall.SIGKILL)
	}
	return g.canceled
}

// signal sends sig to the command's process group. The caller holds g.mu.
func (g *groupKiller) signal(sig syscall.Signal) error {
	if g.cmd.Process == nil {
		return os.ErrProcessDone
	}
	err := syscall.Kill(-g.cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// watchdogScript runs the command ($1) after it starts a watchdog in the
// command's process group: a subshell that waits on fd 3, a pipe whose
// other end jobq holds, and kills the whole group unless jobq says "ok"
// there first. jobq says so once the command exited; if jobq dies first,
// even by SIGKILL, the kernel closes its end, and the group goes with it:
// the command, and what it started, in the foreground or the background,
// never runs on beside the job's next attempt. The command itself runs as
// before: in the shell, by eval, with stdin, $0 and no arguments.
const watchdogScript = `( read -r ok <&3; [ "$ok" = ok ] || kill -KILL 0 ) </dev/null >/dev/null 2>&1 &
exec 3<&-
cmd=$1
shift
eval "$cmd"`

// commandArgs returns the arguments of sh that run command under the
// watchdog (see watchdogScript), and sets up its pipe on cmd. Call release
// with the pipe once Wait returned.
func commandArgs(cmd *exec.Cmd, command string) (args []string, release func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("start command: %w", err)
	}
	cmd.ExtraFiles = []*os.File{r} // fd 3
	return []string{"-c", watchdogScript, "sh", command}, func() {
		r.Close()
		// The command exited: the watchdog goes without a kill. Nobody
		// may read any more (the group was killed): the write fails.
		_, _ = w.Write([]byte("ok\n"))
		w.Close()
	}, nil
}

// exitCode returns the exit status in ps, or 128 plus the signal number when
// a signal ended the process, as sh reports it.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
