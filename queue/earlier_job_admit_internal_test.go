package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/server/servertest"
)

// A pull's jobs reach the pool one at a time, on the pull's subscription,
// while the pool looks JOB up on another goroutine. A job of the earlier
// JOB that the server sent before JOB was deleted and made anew, and that
// the pool admits only after its look-up found the new JOB, is still of
// the earlier JOB: its ack must not be sent, or it takes the new JOB's job
// at its sequence from the worker that holds it. It was taken for a job
// fetched from the new JOB (of = the new JOB), and acked.
func TestEarlierJOBsJobAdmittedAfterTheLookUpIsNotAcked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := Config{Workers: 1, Prefetch: 1, FetchWait: 2 * time.Second}
	obj := objectsWith(t, cfg)
	for _, id := range []string{"a0", "a1"} { // seqs 1 and 2
		m := nats.NewMsg("job.a")
		m.Header.Set(nats.MsgIdHdr, id)
		if _, err := obj.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	p := NewPool(obj, nil, servertest.Logger(t))
	// a0's admission waits (here, for the ack order's lock); a1 waits in
	// the pull's subscription behind it, sent by the server already.
	p.acks.mu.Lock()
	fetched := make(chan error, 1)
	go func() {
		_, err := p.fetchBatch(ctx, 2, 0)
		fetched <- err
	}()
	waitAckPending := func(c jetstream.Consumer, n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			info, err := c.Info(ctx)
			if err == nil && info.NumAckPending == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("WORKER: %v, %+v; want %d ack pending", err, info, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitAckPending(obj.Worker, 2)

	// JOB deleted and made anew; its new jobs b0, b1 at seqs 1 and 2 are
	// held by another worker.
	if err := obj.JS.DeleteStream(ctx, StreamJob); err != nil {
		t.Fatal(err)
	}
	obj2, err := Provision(ctx, obj.JS, cfg, servertest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"b0", "b1"} {
		m := nats.NewMsg("job.b")
		m.Header.Set(nats.MsgIdHdr, id)
		if _, err := obj.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := obj2.Worker.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range batch.Messages() {
	}
	waitAckPending(obj2.Worker, 2)

	// The pool's look-up finds the new JOB, then the pull's jobs go on.
	if !p.stream.lookUp(ctx) {
		t.Fatal("look-up of JOB not told")
	}
	p.acks.mu.Unlock()
	if err := <-fetched; err != nil {
		t.Fatal(err)
	}
	for range 2 {
		it := <-p.fetched
		if err := it.msg.Ack(); !errors.Is(err, errEarlierJOB) {
			t.Errorf("ack of the earlier JOB's job %s (seq %d): %v; want %v", it.job.ID, it.job.Seq, err, errEarlierJOB)
		}
	}
	time.Sleep(300 * time.Millisecond) // for the acks, had they gone out
	st, err := obj2.Jobs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.State.Msgs != 2 {
		t.Errorf("the new JOB holds %d jobs, want its 2, held by another worker: an earlier JOB's ack took them", st.State.Msgs)
	}
}
