package queue

import (
	"encoding/binary"
	"testing"
)

func TestBenchCountsFindLossAndDuplicates(t *testing.T) {
	c := newBenchCounts(5, false)
	job := func(i uint32) []byte {
		b := make([]byte, 12)
		binary.BigEndian.PutUint32(b[8:], i)
		return b
	}
	for _, i := range []uint32{0, 1, 1, 3, 4, 4, 4, 9} { // 2 missing, 1 and 4 twice or more, 9 out of range
		c.handle(job(i))
	}
	if lost, dup := c.verify(); lost != 1 || dup != 2 {
		t.Errorf("verify: got %d lost, %d duplicated; want 1 and 2", lost, dup)
	}
	if got := c.handled.Load(); got != 4 {
		t.Errorf("handled: got %d distinct jobs, want 4", got)
	}
}
