//go:build linux

package handlers

import "syscall"

// dieWithJobq has the kernel kill the command when jobq dies, even by
// SIGKILL, which runs no code of jobq's: the command would otherwise run on
// beside the job's next attempt. It reaches the command's own process (sh,
// or what sh runs in its place), not what that process starts in the
// background. The kernel sends it when the thread that started the command
// ends, so Process keeps its goroutine on that thread until Wait returns.
func dieWithJobq(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
