//go:build unix && !linux

package handlers

import "syscall"

// dieWithJobq does nothing here: only Linux has a parent-death signal. A
// command can outlive a killed jobq.
func dieWithJobq(*syscall.SysProcAttr) {}

// groupHasOthers reports true: there is no cheap way here to list a
// process group, so the caller waits as if it had other processes.
func groupHasOthers(int, int) bool { return true }
