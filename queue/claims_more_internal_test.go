package queue

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// slowFirstUpdateOf delays the first record update of key by delay, then
// makes it: a claim that settles slowly (a slow leader, a retry), holding
// up the claims settled after it.
type slowFirstUpdateOf struct {
	jetstream.KeyValue
	key   string
	delay time.Duration
	once  *atomic.Bool
}

func (k slowFirstUpdateOf) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if key == k.key && k.once.CompareAndSwap(false, true) {
		time.Sleep(k.delay)
	}
	return k.KeyValue.Update(ctx, key, value, rev)
}

// Without leases (a replicated bucket), X's claim is written as X is
// fetched and settled after H's, which takes a while. X is settled a
// little before its claim's give-up moment (lease_until - ackwait/6), and
// before the heartbeat loop's next renewal of X, due a heartbeat after
// its last InProgress: claimed() renews it then, so that the loop does
// not cancel X's handler while the ledger answers every write at once.
func TestClaimSettledJustBeforeGiveUpIsNotCutOff(t *testing.T) {
	t.Parallel()
	obj := hAheadOfX(t, 20)

	var cut atomic.Value
	xStarted := make(chan time.Time, 4)
	var runs atomic.Int32
	p := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		if job.ID != "X" {
			return nil
		}
		runs.Add(1)
		xStarted <- time.Now()
		select {
		case <-ctx.Done():
			cut.Store(context.Cause(ctx))
			return ctx.Err()
		case <-time.After(3 * time.Second):
			return nil
		}
	}), servertest.Logger(t))
	if p.leasing {
		t.Fatal("pool leases: want every job claimed first")
	}
	// H's claim settles 2.7s after the fetch: X's claim, written then, is
	// 0.3s from its give-up moment; its next renewal is due ~1.3s later.
	p.ledger = data.NewLedger(slowFirstUpdateOf{KeyValue: obj.Ledger, key: "H", delay: 2700 * time.Millisecond, once: new(atomic.Bool)}, obj.Config.lease(), obj.JS)
	begin := time.Now()
	startPool(t, p)

	select {
	case at := <-xStarted:
		t.Logf("X started %s after the pool", at.Sub(begin).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("X never ran")
	}
	time.Sleep(4 * time.Second) // X's handler takes 3s
	if c, _ := cut.Load().(error); c != nil {
		t.Fatalf("X's handler was cancelled although the ledger answered every write (runs so far %d): %v", runs.Load(), c)
	}
}

// failingBucketInfo fails the first info request of the processed bucket's
// stream, as a JetStream API timeout does while a cluster elects a leader.
type failingBucketInfo struct {
	jetstream.JetStream
	once *atomic.Bool
}

func (j failingBucketInfo) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if name == "KV_"+BucketProcessed && j.once.CompareAndSwap(false, true) {
		return nil, context.DeadlineExceeded
	}
	return j.JetStream.Stream(ctx, name)
}

// Whether a pool leases is decided from the bucket's stream info; one
// unanswered info request as the pool is made (jobq serve on a cluster
// electing a leader) is asked again at Start, not taken for direct gets.
// Taken so, on a bucket without them (--replicas 3) the pool held every
// fetched job and ran none, until restarted.
func TestPoolOnABucketWithoutDirectGetsRunsJobsAfterATransientInfoError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := claimingObjects(t, Config{AckWait: 3 * time.Second, FetchWait: 200 * time.Millisecond})
	pobj := *obj
	pobj.JS = failingBucketInfo{JetStream: obj.JS, once: new(atomic.Bool)}
	ran := make(chan struct{}, 1)
	p := NewPool(&pobj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		select {
		case ran <- struct{}{}:
		default:
		}
		return nil
	}), servertest.Logger(t))
	startPool(t, p)
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("j"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatalf("J never ran in 10s (pool leasing=%v on a bucket without direct gets)", p.leasing)
	}
}
