package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server"
	"github.com/jobq/jobq/server/servertest"
)

// TestFullStoreRefusesNewJobsAndKeepsStoredOnes simulates a full disk with
// the server's storage limit: JOB is capped below it, so publishing fails
// with a clear error while the ledger still has room to finish every stored
// job, and publishing works again once the workers drained JOB.
func TestFullStoreRefusesNewJobsAndKeepsStoredOnes(t *testing.T) {
	t.Parallel()
	const maxStore = 4 << 20
	srv := servertest.StartConfig(t, server.Config{MaxStore: maxStore, Logger: servertest.Logger(t)})
	b := setupOn(t, srv, queue.Config{MaxBytes: maxStore / 4})
	payload := strings.Repeat("x", 16<<10)
	var stored []string
	var full error
	for i := range 1000 {
		id := fmt.Sprintf("big-%d", i)
		_, err := b.prod.Enqueue(context.Background(), "job.big", []byte(payload), queue.EnqueueOptions{ID: id})
		if err != nil {
			full = err
			break
		}
		stored = append(stored, id)
	}
	if full == nil {
		t.Fatalf("stored 1000 jobs of 16 KiB under a 1 MiB cap, want a refusal")
	}
	if !errors.Is(full, queue.ErrFull) || !strings.Contains(full.Error(), "full") {
		t.Errorf("refusal: got %q, want ErrFull that says JOB is full", full)
	}
	t.Logf("stored %d jobs, then: %v", len(stored), full)

	c := newCounter()
	b.startPool(t, c.wrap(ok))
	b.waitDrained(t)
	for _, id := range stored {
		if got := c.get(id); got != 1 {
			t.Errorf("job %s ran %d times, want 1", id, got)
		}
		if rec := b.record(t, id); rec.State != data.StateDone {
			t.Errorf("job %s: got %s, want done", id, rec.State)
		}
	}
	if _, err := b.prod.Enqueue(context.Background(), "job.big", []byte(payload), queue.EnqueueOptions{ID: "after"}); err != nil {
		t.Errorf("enqueue after draining: %v", err)
	}
}
