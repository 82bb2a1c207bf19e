package queue_test

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// jobq next takes job x-1, which a lease that ended lists (a crashed
// pool's), into its own lease as a resumed attempt; its read of x-1's
// record after the lease write finds a record stored meanwhile (the
// crashed run's late write, or a copy's run), so x-1 leaves the lease, is
// found done and acked without running. Next then fetches y-1, which has
// no record and should run on next's lease. Before, processOne deleted the
// lease and marked it closed as it returned for x-1, so every lease write
// for y-1 failed ("the pool stopped and deleted its lease") until the
// ledger's 10s bound: jobq next failed, blaming the ledger, and handed y-1
// back unrun.
func TestNextLeasesAgainAfterATakenOverJobWasFoundDone(t *testing.T) {
	t.Parallel()
	srv := servertest.StartListening(t)
	b := setupOn(t, srv, queue.Config{})
	ctx := context.Background()
	b.enqueue(t, "job.r", "x-1", "x") // seq 1
	b.enqueue(t, "job.r", "y-1", "y") // seq 2
	// A crashed pool's lease, ended a minute ago, lists x-1.
	dead, err := json.Marshal(data.Lease{Worker: "crashed", Until: time.Now().Add(-time.Minute).UTC(),
		Jobs: []data.LeasedJob{{Key: data.Key("x-1"), Seq: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.obj.Ledger.Put(ctx, data.LeasePrefix+"crashed", dead); err != nil {
		t.Fatal(err)
	}
	// Once next's lease write went out, its next batched read of records
	// (the re-read of x-1) waits until x-1's record is stored.
	px := servertest.NewProxy(t, srv.ClientURL()[len("nats://"):])
	var leased, stalled atomic.Bool
	var storeOnce sync.Once
	storeDone := func() {
		l := data.NewLedger(b.obj.Ledger, time.Minute, b.js)
		defer l.Close()
		job := &data.Job{ID: "x-1", Subject: "job.r", Seq: 1, Attempt: 1}
		c, err := l.Claim(ctx, job, "elsewhere")
		if err == nil {
			err = l.Done(ctx, &c, time.Millisecond)
		}
		if err != nil {
			t.Errorf("store x-1's record: %v", err)
		}
	}
	px.Watch(func(chunk []byte) bool {
		if bytes.Contains(chunk, []byte("PUB $KV."+queue.BucketProcessed+"."+data.LeasePrefix)) {
			leased.Store(true)
		} else if leased.Load() && bytes.Contains(chunk, []byte("DIRECT.GET.KV_"+queue.BucketProcessed)) && !stalled.Load() {
			stalled.Store(true)
			storeOnce.Do(storeDone)
		}
		return true
	}, nil)
	_, js := connectThrough(t, px)
	obj, err := queue.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ran []string
	start := time.Now()
	found, err := queue.Next(ctx, obj, handlers.HandlerFunc(func(_ context.Context, j *data.Job) error {
		mu.Lock()
		ran = append(ran, j.ID)
		mu.Unlock()
		return nil
	}), 5*time.Second, servertest.Logger(t))
	t.Logf("next: %v %v after %s; ran %v; re-read stalled: %v", found, err, time.Since(start).Round(time.Millisecond), ran, stalled.Load())
	if !stalled.Load() {
		t.Skip("next's lease write and re-read were not seen through the proxy")
	}
	if err != nil || !found || len(ran) != 1 || ran[0] != "y-1" {
		t.Fatalf("next after x-1 was found done: got %v %v, ran %v; want y-1 run on next's lease", found, err, ran)
	}
	// Its own lease is gone once it returns: only the crashed pool's is left.
	if n := b.status(t).Ledger.Leases; n != 1 {
		t.Errorf("after next: %d leases, want 1 (the crashed pool's)", n)
	}
}

// Ctrl-C reaches jobq next while its lease write for job s-1 is on its way:
// the write lands, its answer is cut off with the context, and next hands
// s-1 back. Before, next left its lease in the bucket, listing s-1 as
// running until the lease ended (it deleted only a lease whose write was
// answered): a pool that took s-1's redelivery released it until then,
// a delivery spent and the job held up to an ack wait after next exited.
func TestNextInterruptedDuringItsLeaseWriteLeavesNoLease(t *testing.T) {
	t.Parallel()
	srv := servertest.StartListening(t)
	b := setupOn(t, srv, queue.Config{AckWait: 30 * time.Second})
	bg := context.Background()
	b.enqueue(t, "job.s", "s-1", "s")
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	px := servertest.NewProxy(t, srv.ClientURL()[len("nats://"):])
	var seen atomic.Bool
	px.Watch(func(chunk []byte) bool {
		if bytes.Contains(chunk, []byte("PUB $KV."+queue.BucketProcessed+"."+data.LeasePrefix)) && seen.CompareAndSwap(false, true) {
			cancel() // Ctrl-C, as the write goes out
		}
		return true
	}, nil)
	_, js := connectThrough(t, px)
	obj, err := queue.Open(bg, js)
	if err != nil {
		t.Fatal(err)
	}
	found, err := queue.Next(ctx, obj, handlers.HandlerFunc(ok), 5*time.Second, servertest.Logger(t))
	t.Logf("next: %v %v", found, err)
	if !seen.Load() {
		t.Skip("next's lease write was not seen through the proxy")
	}
	if found {
		t.Fatalf("next ran s-1 though cancelled during its lease write")
	}
	leases, err := data.NewLedger(b.obj.Ledger, time.Minute, b.js).ReadLeases(bg)
	if err != nil {
		t.Fatal(err)
	}
	for _, ls := range leases {
		for _, j := range ls.Jobs {
			if j.Key == data.Key("s-1") && !j.Orphan && ls.Until.After(time.Now()) {
				t.Errorf("after next returned: lease %s lists s-1 running until %s (in %s); want next's lease deleted as it exits", ls.Owner, ls.Until.Format(time.RFC3339), time.Until(ls.Until).Round(time.Second))
			}
		}
	}
}
