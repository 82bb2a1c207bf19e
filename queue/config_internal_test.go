package queue

import (
	"strings"
	"testing"
	"time"
)

func TestConfigRefusesAFetchWaitThatWouldSpin(t *testing.T) {
	for _, tt := range []struct {
		wait time.Duration
		ok   bool
	}{{0, true}, {10 * time.Millisecond, true}, {time.Second, true}, {time.Millisecond, false}, {-time.Second, false}} {
		err := Config{FetchWait: tt.wait}.Validate()
		if tt.ok != (err == nil) || err != nil && !strings.Contains(err.Error(), "fetch wait") {
			t.Errorf("FetchWait %s: Validate = %v, want ok %v", tt.wait, err, tt.ok)
		}
	}
}

// A client learns DLQ's share of the store from JOB's (see Open): the two
// agree for any store --max-store takes.
func TestDeadShareOfJOBsIsStoreShares(t *testing.T) {
	for _, store := range []int64{1 << 20, 8 << 20, 1<<30 + 7, 123_456_789} {
		jobs, dead := StoreShares(store)
		if got := deadShareOf(jobs); got != dead {
			t.Errorf("store %d: JOB %d, DLQ %d; DLQ from JOB's share %d", store, jobs, dead, got)
		}
	}
}
