//go:build unix

package queue

import (
	"syscall"
	"time"
)

// processUsage is the CPU time this process has used so far, user and
// system, and the page faults it took that read nothing from disk (minor
// faults: mostly memory touched for the first time).
func processUsage() (cpu time.Duration, faults int64, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), int64(ru.Minflt), true
}
