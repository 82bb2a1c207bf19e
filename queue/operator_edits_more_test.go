package queue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/queue"
)

// An operator let the ledger refuse a key's second message (nats stream
// edit KV_processed --discard-per-subject, with history 1), under which
// every record update and every second lease write is refused: the pool
// ran the first job and then none. Provisioning puts it back.
func TestLedgerDiscardNewPerSubjectIsNotKept(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: 2 * time.Second})
	b.editLedger(t, func(c *jetstream.StreamConfig, _ jetstream.StreamState) {
		c.Discard, c.DiscardNewPerSubject = jetstream.DiscardNew, true
	})
	b.reprovision(t)
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	for i := range 3 {
		id := fmt.Sprintf("j-%d", i)
		b.enqueue(t, "job.x", id, "x")
		waitFor(t, 10*time.Second, func() error {
			if c.get(id) != 1 {
				return fmt.Errorf("job %s ran %d times; want 1 (JOB holds %d jobs)", id, c.get(id), b.status(t).Stream.Messages)
			}
			return nil
		})
	}
}
