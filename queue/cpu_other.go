//go:build !unix

package queue

import "time"

// processUsage is not measured here: jobq bench and the benchmarks report
// no CPU or page-fault figures.
func processUsage() (cpu time.Duration, faults int64, ok bool) { return 0, 0, false }
