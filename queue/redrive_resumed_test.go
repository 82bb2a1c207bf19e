package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
)

// A pool ran job R on its last delivery, on a claim of its own (as every
// job on a replicated bucket) or on its lease, and died before recording an
// outcome. The sweep dead-letters R once the claim or the lease ended;
// re-driven, R runs again, and that run may repeat the dead one's effect:
// it must be told it is resumed.
func TestRedriveOfAJobWhoseLastClaimLapsedIsResumed(t *testing.T) {
	t.Parallel()
	redriveAfterADeadRun(t, func(ctx context.Context, b *testBundle, job *data.Job) {
		if _, err := data.NewLedger(b.obj.Ledger, 500*time.Millisecond, nil).Claim(ctx, job, "dead-pool"); err != nil {
			t.Fatal(err)
		}
	})
}

func TestRedriveOfAJobWhoseLastLeaseEndedIsResumed(t *testing.T) {
	t.Parallel()
	redriveAfterADeadRun(t, func(ctx context.Context, b *testBundle, job *data.Job) {
		ls := data.Lease{Worker: "dead-pool", Until: time.Now().Add(500 * time.Millisecond).UTC(), Jobs: []data.LeasedJob{{Key: data.Key(job.ID), Seq: job.Seq}}}
		if _, err := data.NewLedger(b.obj.Ledger, 0, b.obj.JS).WriteLease(ctx, "dead-pool", ls, 0); err != nil {
			t.Fatal(err)
		}
	})
}

// redriveAfterADeadRun has job R fetched once (its one delivery), run by a
// pool that dies (dead: its claim or lease, which ends in 500ms), then
// dead-lettered by a live pool's sweep and re-driven, and checks that the
// re-drive's run is resumed.
func redriveAfterADeadRun(t *testing.T, dead func(context.Context, *testBundle, *data.Job)) {
	ctx := context.Background()
	b := setup(t, queue.Config{MaxDeliver: 1, AckWait: time.Second})
	b.enqueue(t, "job.x", "R", "r")

	batch, err := b.obj.Worker.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	msg := <-batch.Messages()
	if msg == nil {
		t.Fatal("no job fetched")
	}
	meta, err := msg.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	job := &data.Job{ID: "R", Subject: msg.Subject(), Seq: meta.Sequence.Stream, Attempt: 1, EnqueuedAt: meta.Timestamp}
	dead(ctx, b, job)
	time.Sleep(1500 * time.Millisecond) // its one delivery and its claim or lease ran out

	var mu sync.Mutex
	var resumed []bool
	c := newCounter()
	b.startPool(t, c.wrap(func(_ context.Context, job *data.Job) error {
		mu.Lock()
		resumed = append(resumed, job.Resumed)
		mu.Unlock()
		return nil
	}))
	b.redriveFailed(t, "R")
	b.waitState(t, "R", data.StateDone)
	mu.Lock()
	defer mu.Unlock()
	if len(resumed) != 1 || !resumed[0] {
		t.Errorf("re-driven R ran with resumed %v; want one run, resumed: the dead pool's run may have had its effect", resumed)
	}
}
