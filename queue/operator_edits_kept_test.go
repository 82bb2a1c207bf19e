package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
)

// An operator capped the ledger's message size (nats stream edit
// KV_processed --max-msg-size 64). Started again, jobq must not keep
// that: a record or lease larger is refused, and a job whose record
// cannot be stored never ends done.
func TestLedgerMessageSizeCapIsNotKept(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: 2 * time.Second})
	b.editLedger(t, func(c *jetstream.StreamConfig, _ jetstream.StreamState) { c.MaxMsgSize = 64 })
	b.reprovision(t)
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	id := "a-job-with-a-rather-long-id-0001"
	b.enqueue(t, "job.x", id, "x")
	waitFor(t, 10*time.Second, func() error {
		if c.get(id) != 1 || b.status(t).Stream.Messages != 0 {
			return fmt.Errorf("job %s ran %d times; JOB holds %d jobs; want 1 run and 0", id, c.get(id), b.status(t).Stream.Messages)
		}
		return nil
	})
}

// An operator gave WORKER priority groups (nats consumer edit JOB WORKER
// --priority-groups g --priority-policy pinned). jobq's pulls name no
// group: started again, jobq must still run every job.
func TestWorkerWithPriorityGroupsStillRunsJobs(t *testing.T) {
	t.Parallel()
	for name, pp := range map[string]jetstream.PriorityPolicy{"pinned": jetstream.PriorityPolicyPinned, "overflow": jetstream.PriorityPolicyOverflow, "prioritized": jetstream.PriorityPolicyPrioritized} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{AckWait: 2 * time.Second})
			b.editWorker(t, func(c *jetstream.ConsumerConfig) {
				c.PriorityPolicy, c.PriorityGroups = pp, []string{"g"}
				if pp == jetstream.PriorityPolicyPinned {
					c.PinnedTTL = time.Minute
				}
			})
			b.reprovision(t)
			c := newCounter()
			b.startPool(t, c.wrap(ok))
			b.enqueue(t, "job.x", "p-1", "x")
			waitFor(t, 10*time.Second, func() error {
				if c.get("p-1") != 1 {
					return fmt.Errorf("job p-1 ran %d times; want 1 (JOB holds %d jobs)", c.get("p-1"), b.status(t).Stream.Messages)
				}
				return nil
			})
		})
	}
}

// An operator kept more history in the ledger (nats stream edit
// KV_processed --max-msgs-per-subject 5), which provisioning keeps. jobq
// status counts records, one per job ID: a job that failed once and then
// succeeded is one record, not two.
func TestStatusCountsRecordsNotRevisions(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	b.editLedger(t, func(c *jetstream.StreamConfig, _ jetstream.StreamState) { c.MaxMsgsPerSubject = 5 })
	b.reprovision(t)
	var runs atomic.Int32
	b.startPool(t, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		if runs.Add(1) == 1 {
			return errors.New("once")
		}
		return nil
	}))
	b.enqueue(t, "job.x", "r-1", "x")
	b.waitState(t, "r-1", data.StateDone)
	if st := b.status(t); st.Ledger.Records != 1 {
		t.Errorf("status counts %d ledger records for one job; want 1", st.Ledger.Records)
	}
}

// An operator let JOB take roll-ups (nats stream edit JOB --allow-rollup).
// A job another client publishes with a Nats-Rollup header (which jobq
// runs as any job) would then purge every job stored before it, unrun.
// Started again, jobq must not keep that.
func TestJobStreamRollupsAreNotKept(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	b.editJobs(t, func(c *jetstream.StreamConfig) { c.AllowRollup = true })
	b.reprovision(t)
	b.enqueue(t, "job.a", "a-1", "x")
	b.enqueue(t, "job.a", "a-2", "x")
	m := nats.NewMsg("job.b")
	m.Header.Set("Nats-Rollup", "all")
	_, err := b.js.PublishMsg(context.Background(), m)
	if st := b.status(t); st.Stream.Messages < 2 {
		t.Errorf("JOB holds %d jobs after another client's job with Nats-Rollup: all (publish: %v); want a-1 and a-2 still there", st.Stream.Messages, err)
	}
}
