package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// setLedgerSilentFor makes the ledger bucket stop answering writes to job
// id's key, as a bucket whose leader is gone does: the stream no longer
// listens on the key's subject, and a subscriber that never answers takes
// the writes (so they get no "no responders" either). Leases and reads
// keep working. The returned func undoes it.
func setLedgerSilentFor(t *testing.T, b *testBundle, id string) func() {
	t.Helper()
	ctx := context.Background()
	st, err := b.js.Stream(ctx, "KV_"+queue.BucketProcessed)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	orig := cfg.Subjects
	cfg.Subjects = []string{"$KV." + queue.BucketProcessed + "." + data.LeasePrefix + ">"}
	if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("silence ledger: %v", err)
	}
	sub, err := b.nc.Subscribe("$KV."+queue.BucketProcessed+"."+data.Key(id), func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	b.nc.Flush()
	var once sync.Once
	return func() {
		once.Do(func() {
			sub.Unsubscribe()
			cfg.Subjects = orig
			if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
				t.Errorf("restore ledger: %v", err)
			}
		})
	}
}

// A job whose done record the ledger does not answer keeps its heartbeats
// while it waits for the write's answer (up to 10s) and after: with an ack
// wait of 3s, WORKER does not redeliver it.
func TestUnansweredDoneRecordKeepsItsHeartbeats(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 3, AckWait: 3 * time.Second})
	started, finish := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c := newCounter()
	b.startPool(t, c.wrap(func(context.Context, *data.Job) error {
		once.Do(func() { close(started) })
		<-finish
		return nil
	}))
	b.enqueue(t, "job.x", "J", "x")
	<-started
	restore := setLedgerSilentFor(t, b, "J")
	defer restore()
	close(finish)

	maxRedelivered := 0
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		maxRedelivered = max(maxRedelivered, b.status(t).Consumer.Redelivered)
	}
	if maxRedelivered != 0 {
		t.Errorf("J was redelivered %d times while its done record went unanswered: it got no heartbeat before keepRecording took it", maxRedelivered)
	}
	restore()
	b.waitState(t, "J", data.StateDone)
	b.waitDrained(t)
	c.wantOnce(t, "J")
}

// jobq next whose done record the ledger refuses for its whole 10s fails,
// and releases the job only once the lease it ran on ended: a redelivery
// inside the lease would be handed back and spend a delivery, so that with
// MaxDeliver 2 the job, which succeeded, would be dead-lettered rather than
// run again as a resumed attempt.
func TestNextReleasesAJobWhoseRecordItCouldNotStoreToRunAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 2, AckWait: 3 * time.Second})
	b.enqueue(t, "job.x", "J", "x")
	_, err := queue.Next(ctx, b.obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		setLedgerFull(t, b, true)
		return nil
	}), 5*time.Second, servertest.Logger(t))
	if err == nil {
		t.Fatal("Next: want an error, the record was refused throughout")
	}
	setLedgerFull(t, b, false)
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	b.waitDrained(t)
	if st := b.status(t); st.DLQ.Messages != 0 || c.get("J") != 1 {
		rec := b.record(t, "J")
		t.Errorf("after Next failed: J ran %d more times, DLQ holds %d (record %s: %q); want J run again as a resumed attempt and recorded done", c.get("J"), st.DLQ.Messages, rec.State, rec.LastError)
	}
}
