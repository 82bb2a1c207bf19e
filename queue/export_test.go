package queue

// ProcessCPU is processCPU, for the benchmarks of package queue_test.
var ProcessCPU = processCPU
