//go:build !unix

package queue

import "time"

// processCPU is not measured here: jobq bench and the benchmarks report no
// CPU figures.
func processCPU() (time.Duration, bool) { return 0, false }
