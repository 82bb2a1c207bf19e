package queue

// ProcessUsage is processUsage, for the benchmarks of package queue_test.
var ProcessUsage = processUsage

// AfterJOBLookUp makes f run in jobq next's check of JOB, on obj, after its
// look-ups and before it looks at the connection again.
func AfterJOBLookUp(obj *Objects, f func()) { obj.afterJOBLookUp = f }
