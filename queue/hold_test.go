package queue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
)

// A job held for its refused done record gets InProgress often enough that
// WORKER never redelivers it, however long the ledger stays full: the
// retries' growing pause (up to 5s) does not space its heartbeats past an
// ack wait of 3s.
func TestHeldJobIsNotRedelivered(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 3, AckWait: 3 * time.Second})
	c, finish := b.runBlocked(t, "J")
	setLedgerFull(t, b, true)
	finish()

	maxRedelivered := 0
	for end := time.Now().Add(9 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		maxRedelivered = max(maxRedelivered, b.status(t).Consumer.Redelivered)
	}
	if maxRedelivered != 0 {
		t.Errorf("J was redelivered while held for its record (%d redelivered): its heartbeats lapsed past the ack wait", maxRedelivered)
	}
	setLedgerFull(t, b, false)
	b.waitDrained(t)
	c.wantOnce(t, "J")
}

// A job with a record of its own (claimed first) whose handler succeeded on
// its last delivery, and whose done record the ledger refuses, is held, and
// not dead-lettered meanwhile: it succeeded.
func TestHeldClaimedJobIsNotDeadLetteredOnItsLastDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 1, AckWait: 3 * time.Second})
	// J has a record of an earlier attempt that failed: it is claimed first.
	l := data.NewLedger(b.obj.Ledger, time.Minute, nil)
	cl, err := l.Claim(ctx, &data.Job{ID: "J", Subject: "job.x", Seq: 1000, Attempt: 1}, "earlier")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Retry(ctx, &cl, time.Millisecond, "boom"); err != nil {
		t.Fatal(err)
	}
	c, finish := b.runBlocked(t, "J")
	setDiscardNewPerSubject(t, b, true) // the ledger refuses J's done record
	finish()

	time.Sleep(9 * time.Second)
	if st := b.status(t); st.DLQ.Messages != 0 {
		t.Errorf("DLQ holds %d dead letters while J, which succeeded, was held for its record; want none", st.DLQ.Messages)
	}
	setDiscardNewPerSubject(t, b, false)
	b.waitState(t, "J", data.StateDone)
	if st := b.status(t); st.DLQ.Messages != 0 {
		t.Errorf("DLQ holds %d dead letters after J's done record was stored; want none", st.DLQ.Messages)
	}
	c.wantOnce(t, "J")
}

// Jobs held for their records keep to the pool's bound on jobs delivered
// and not acked (twice Workers+Prefetch, see NewPool and Config.Prefetch):
// a pool whose ledger refuses records stops pulling and running jobs it
// cannot record, rather than take up to WORKER's MaxAckPending of them.
// A job whose handler succeeded gives its room back before its record is
// answered, and counts again once the refusal comes: in between, one more
// pull may go out (it did once in .ci/run, 5 jobs against 4), so the test
// allows a pull's worth more. The 12 jobs here would all be delivered if
// held jobs did not count.
func TestHeldJobsKeepToThePoolsRoom(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{Workers: 1, Prefetch: 1, AckWait: 30 * time.Second})
	_, finish := b.runBlocked(t, "J0")
	setLedgerFull(t, b, true)
	finish()
	for i := 1; i < 12; i++ {
		b.enqueue(t, "job.x", fmt.Sprintf("J%d", i), "x")
	}
	time.Sleep(3 * time.Second)
	room := 1 + 1
	bound := 2*room + room
	if got := b.status(t).Consumer.AckPending; got > bound {
		t.Errorf("%d jobs delivered and not acked with the ledger full, want at most %d (twice the pool's room, and a pull's worth more)", got, bound)
	}
	setLedgerFull(t, b, false)
	b.waitDrained(t)
}

// runBlocked starts a pool whose handlers wait for finish, enqueues id and
// waits until its handler started; c counts the runs. finish lets every
// handler return, this one's and those to come.
func (b *testBundle) runBlocked(t *testing.T, id string) (c *counter, finish func()) {
	t.Helper()
	started, done := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c = newCounter()
	b.startPool(t, c.wrap(func(context.Context, *data.Job) error {
		once.Do(func() { close(started) })
		<-done
		return nil
	}))
	b.enqueue(t, "job.x", id, "x")
	<-started
	return c, func() { close(done) }
}
