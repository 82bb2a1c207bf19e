package queue_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// A pool's lease ends one heartbeat (AckWait/3) before the ack wait that
// its last write started, and the pool writes it with every batch it
// leases. The server redelivers a held job an ack wait after its last
// InProgress, whose time a restart of the server keeps to the second.
// With InProgress every heartbeat, checked every quarter of one, a job's
// ack wait ran out before the end of the lease that a busy pool had just
// written: after a crash, the restarted pool was handed the job while the
// dead pool's lease still held it, and released it until that lease
// ended, a delivery spent (4 to 27 of 126 jobs in flight at a kill, with
// a 6s ack wait). Here a long job's InProgress must come within a
// heartbeat less a second of the one before (and of its start), while
// the pool leases other jobs beside it.
func TestInProgressKeepsTheAckWaitPastThePoolsLease(t *testing.T) {
	t.Parallel()
	const ackWait = 6 * time.Second
	b := setup(t, queue.Config{AckWait: ackWait})

	var mu sync.Mutex
	var beats []time.Time // the long job's start, then each of its InProgress
	sniff := servertest.Connect(t, b.srv)
	if _, err := sniff.Subscribe("$JS.ACK."+queue.StreamJob+"."+queue.ConsumerWorker+".>", func(m *nats.Msg) {
		// $JS.ACK.JOB.WORKER.<delivery count>.<stream seq>.…: the long
		// job is stored first.
		if tok := strings.Split(m.Subject, "."); len(tok) > 5 && tok[5] == "1" && string(m.Data) == "+WPI" {
			mu.Lock()
			beats = append(beats, time.Now())
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := sniff.Flush(); err != nil {
		t.Fatal(err)
	}

	started := make(chan struct{})
	b.startPool(t, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		if job.ID != "long" {
			return nil
		}
		mu.Lock()
		beats = append(beats, time.Now())
		mu.Unlock()
		close(started)
		select {
		case <-time.After(ackWait + ackWait/6):
		case <-ctx.Done():
		}
		return nil
	}))
	b.enqueue(t, "job.x", "long", "")
	<-started
	// Other jobs all along, each batch of them a lease write.
	for i, start := 0, time.Now(); time.Since(start) < ackWait; i++ {
		b.enqueue(t, "job.x", "other-"+strconv.Itoa(i), "")
		time.Sleep(20 * time.Millisecond)
	}
	b.waitState(t, "long", data.StateDone)

	mu.Lock()
	defer mu.Unlock()
	heartbeat := ackWait / 3
	limit := heartbeat - time.Second
	if len(beats) < 4 {
		t.Fatalf("the long job got %d InProgress in %s, want 3 or more", len(beats)-1, ackWait)
	}
	for i := 1; i < len(beats); i++ {
		if gap := beats[i].Sub(beats[i-1]); gap > limit {
			t.Errorf("InProgress %d came %s after the one before (or the job's start), want at most %s: a heartbeat less the second to which a restart of the server rounds its time", i, gap.Round(time.Millisecond), limit)
		}
	}
}
