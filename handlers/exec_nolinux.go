//go:build unix && !linux

package handlers

import "syscall"

// dieWithJobq does nothing here: only Linux has a parent-death signal. A
// command can outlive a killed jobq.
func dieWithJobq(*syscall.SysProcAttr) {}
