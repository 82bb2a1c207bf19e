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
	killAt   time.Time // when timer sends SIGKILL
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
		g.killAt = time.Now().Add(delay)
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

// settlePoll is how often settle looks for the group's processes.
const settlePoll = 20 * time.Millisecond

// settle waits, if the command was cancelled, until its process group has
// no process left but except (its watchdog) or the SIGKILL is due. Call it
// once Wait returns, before done: the command's own sh dies on SIGTERM at
// once, while what it runs in a child (a command whose output goes to a
// file, say) may still be cleaning up, with none of jobq's pipes open for
// Wait to wait on.
func (g *groupKiller) settle(except int) {
	g.mu.Lock()
	canceled, killAt := g.canceled, g.killAt
	g.mu.Unlock()
	if !canceled {
		return
	}
	for time.Now().Before(killAt) && groupHasOthers(g.cmd.Process.Pid, except) {
		time.Sleep(min(settlePoll, time.Until(killAt)))
	}
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

// watchSignals are the signals the watchdog ignores: every one that can
// be caught and ends or stops a process, so that a signal to the command's
// group (a SIGUSR1 to reopen logs, the SIGTERM that cancels it) does not
// end the watchdog before the command. SIGKILL ends it with the group.
const watchSignals = "HUP INT QUIT ABRT USR1 USR2 PIPE ALRM TERM TSTP TTIN TTOU VTALRM PROF XCPU XFSZ"

// watchGroup starts a watchdog in the process group of cmd, just started,
// whose sh leads the group: a sh of jobq's own that waits on a pipe whose
// other end jobq holds, and kills the whole group unless jobq says "ok"
// there first. jobq says so once the command exited (stop); if jobq dies
// first, even by SIGKILL, the kernel closes its end, and the group goes
// with it: the command, and what it started, in the foreground or the
// background, never runs on beside the job's next attempt. A member of the
// group until stop reaps it, the watchdog keeps the group's ID from
// passing to another group while it watches (the command's sh, exited, is
// a zombie member until Wait). It is jobq's child, which stop reaps:
// orphaned, it would be a zombie under a jobq that is a container's PID 1.
func watchGroup(cmd *exec.Cmd) (stop func(), pid int, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, 0, fmt.Errorf("start the command's watchdog: %w", err)
	}
	defer r.Close()
	wd := exec.Command("sh", "-c", `trap '' `+watchSignals+`; read -r ok; [ "$ok" = ok ] || kill -KILL 0`)
	wd.Stdin = r
	wd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: cmd.Process.Pid}
	if err := wd.Start(); err != nil {
		w.Close()
		return nil, 0, fmt.Errorf("start the command's watchdog: %w", err)
	}
	return func() {
		_, _ = w.Write([]byte("ok\n"))
		w.Close()
		_ = wd.Wait()
	}, wd.Process.Pid, nil
}

// gateLine is put before the command, on its first line: the command's sh
// waits until jobq opens its gate (fd 3), then closes it and runs the
// command; if the gate closes unopened, as when jobq dies first, it exits
// and the command never runs. On the command's own first line, the command
// runs as sh -c -- COMMAND ran it (the same $0, $#, line numbers, and a
// syntax error on that line still runs nothing), in the same process: it
// leads the command's group, $$ names it, and it keeps its parent-death
// signal. The variable it reads is unset before the command runs.
const gateLine = `read -r JOBQ_GATE <&3 && [ "$JOBQ_GATE" = open ] && unset JOBQ_GATE && exec 3<&- || exit 125; `

// shellCommand returns the command that runs command with sh -c, held at a
// gate until the caller, once it started the command and its watchdog
// (watchGroup), calls open. The command's sh ran at once before: with many
// jobs starting together, its watchdog's start could wait behind theirs
// for some milliseconds, and a child the sh forked meanwhile (its first
// command) outlived a jobq killed then, unwatched, beside the job's next
// attempt; the parent-death signal reached only the sh. Call started once
// Start returned, and shut when done.
func shellCommand(ctx context.Context, command string) (*exec.Cmd, *commandGate, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, "sh", "-c", "--", gateLine+command)
	cmd.ExtraFiles = []*os.File{r}
	return cmd, &commandGate{r: r, w: w}, nil
}

// commandGate holds jobq's ends of a command's gate.
type commandGate struct{ r, w *os.File }

// started closes jobq's copy of the end the command reads.
func (g *commandGate) started() { _ = g.r.Close() }

// open lets the command run.
func (g *commandGate) open() {
	_, _ = g.w.Write([]byte("open\n"))
	_ = g.w.Close()
}

// shut closes the gate, unopened if open was not called: the command, if
// it still waits there, exits without running.
func (g *commandGate) shut() {
	_ = g.r.Close()
	_ = g.w.Close()
}

// exitCode returns the exit status in ps, or 128 plus the signal number when
// a signal ended the process, as sh reports it.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
