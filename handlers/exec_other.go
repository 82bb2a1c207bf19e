//go:build !unix

package handlers

import (
	"context"
	"os"
	"os/exec"
	"time"
)

// groupKiller is a no-op where process groups are not available: cancelling
// kills only the command's own process, as exec.CommandContext does.
type groupKiller struct{}

func killGroupOnCancel(*exec.Cmd, time.Duration) *groupKiller { return &groupKiller{} }

// done reports whether ctx ended, which here cannot be told from ctx
// ending after the command exited.
func (*groupKiller) done(ctx context.Context) bool { return ctx.Err() != nil }

// exitCode returns the exit status in ps.
func exitCode(ps *os.ProcessState) int { return ps.ExitCode() }

// settle does nothing here: there is no process group to wait for.
func (*groupKiller) settle(int) {}

// shellCommand returns the command that runs command with sh -c, ungated:
// there is no watchdog to wait for here.
func shellCommand(ctx context.Context, command string) (*exec.Cmd, commandGate, error) {
	return exec.CommandContext(ctx, "sh", "-c", "--", command), commandGate{}, nil
}

// commandGate does nothing here.
type commandGate struct{}

func (commandGate) started() {}
func (commandGate) open()    {}
func (commandGate) shut()    {}

// watchGroup does nothing here: there are no process groups to watch.
func watchGroup(*exec.Cmd) (func(), int, error) { return func() {}, 0, nil }
