//go:build !unix

package queue_test

import "time"

// processCPU is not measured here: the benchmarks report no CPU figures.
func processCPU() (time.Duration, bool) { return 0, false }
