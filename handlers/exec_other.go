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

// watchGroup does nothing here: there are no process groups to watch.
func watchGroup(*exec.Cmd) (func(), int, error) { return func() {}, 0, nil }
