//go:build linux

package handlers

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// dieWithJobq has the kernel kill the command when jobq dies, even by
// SIGKILL, which runs no code of jobq's: the command would otherwise run on
// beside the job's next attempt. It reaches the command's own process (sh,
// or what sh runs in its place), not what that process starts in the
// background. The kernel sends it when the thread that started the command
// ends, so Process keeps its goroutine on that thread until Wait returns.
func dieWithJobq(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

// groupHasOthers reports whether process group pgid has a process other
// than except that is not a zombie, as /proc tells; true if /proc cannot be
// read, so that the caller waits as if it had.
func groupHasOthers(pgid, except int) bool {
	d, err := os.Open("/proc")
	if err != nil {
		return true
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return true
	}
	want := strconv.Itoa(pgid)
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid == except {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// After the command's name in parentheses: state, ppid, pgrp.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 2 && f[2] == want && f[0] != "Z" && f[0] != "X" {
			return true
		}
	}
	return false
}
