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
