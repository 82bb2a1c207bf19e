package queue_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
)

// WORKER deleted while a job runs its last delivery. The job fails, is
// dead-lettered, recorded failed, and acked: that ack goes to the WORKER
// made anew, which has not delivered the job yet and drops it (or to no
// consumer at all). The new WORKER delivers the job again; the ledger
// tells this copy, dead-lettered, from a re-drive (a new copy), and it is
// acked without running. It ran again before, and ended both done and in
// DLQ.
func TestDeadLetteredJobDoesNotRunAgainAfterWorkerIsMadeAnew(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 1, AckWait: 3 * time.Second, FetchWait: time.Second})
	c := newCounter()
	started, release := make(chan struct{}, 4), make(chan struct{})
	b.startPool(t, c.wrap(func(ctx context.Context, job *data.Job) error {
		if c.get(job.ID) > 1 {
			return nil // a second run succeeds
		}
		started <- struct{}{}
		<-release
		return errors.New("boom")
	}))
	b.enqueue(t, "job.x", "J", "x")
	<-started
	if err := b.js.DeleteConsumer(context.Background(), queue.StreamJob, queue.ConsumerWorker); err != nil {
		t.Fatal(err)
	}
	close(release) // J fails on its last delivery: dead-lettered
	waitFor(t, 20*time.Second, func() error {
		di, err := b.obj.Dead.Info(context.Background())
		if err != nil {
			return err
		}
		if di.State.Msgs != 1 {
			return fmt.Errorf("DLQ holds %d", di.State.Msgs)
		}
		return nil
	})
	time.Sleep(8 * time.Second) // WORKER made anew, J's fate settled
	rec := b.record(t, "J")
	st := b.status(t)
	if n := c.get("J"); n != 1 {
		t.Errorf("J (max deliver 1) ran %d times; its dead letter is in DLQ, its record says %s; JOB holds %d", n, rec.State, st.Stream.Messages)
	}
}
