package queue

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// A job on a claim of its own keeps its claim, or is cancelled before it
// ends, while the pool's lease writes hang: the lease's renewal (of a
// lease whose last jobs left it, so it is bounded by opTimeout only) and a
// new batch's lease write into an empty lease (likewise, and holding the
// lease's lock that the renewal waits for) must not hold up the claim's
// InProgress, its renewal, or the cancelling of its handler once its claim
// lapsed. Otherwise J's claim runs out while its handler still runs here,
// and a second pool claims J's redelivery and runs it beside the first.
func TestClaimedJobWhileLeaseWritesHang(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"renewal of an emptied lease", "lease write of a new batch"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := objectsWith(t, Config{AckWait: 3 * time.Second, MaxDeliver: 20, Workers: 2, Prefetch: 1,
				RetryBackoff: []time.Duration{10 * time.Millisecond}, FetchWait: 200 * time.Millisecond})
			failedBefore(t, obj, "J") // J is claimed first, not leased

			var hang atomic.Bool
			var aRunning atomic.Bool
			aStarted, lRan := make(chan struct{}), make(chan struct{})
			var startedOnce, lOnce atomic.Bool
			a := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
				switch job.ID {
				case "L":
					// L ran on the lease: once it is recorded, the lease
					// lists no job and is dirty; its renewal hangs.
					hang.Store(true)
					if lOnce.CompareAndSwap(false, true) {
						close(lRan)
					}
					return nil
				case "J":
				default:
					<-ctx.Done()
					return ctx.Err()
				}
				aRunning.Store(true)
				defer aRunning.Store(false)
				if startedOnce.CompareAndSwap(false, true) {
					close(aStarted)
				}
				select {
				case <-ctx.Done(): // a well-behaved handler: it stops when told
					return ctx.Err()
				case <-time.After(20 * time.Second):
					return nil
				}
			}), servertest.Logger(t))
			a.ledger = data.NewLedger(obj.Ledger, obj.Config.lease(), hangingLeaseWrites{JetStream: obj.JS, hang: &hang})
			startPool(t, a)
			t.Cleanup(func() { hang.Store(false) }) // before A's Stop
			prod := NewProducer(obj.JS, obj.Config)
			if _, err := prod.Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-aStarted:
			case <-time.After(10 * time.Second):
				t.Fatal("pool A never ran J")
			}
			switch via {
			case "renewal of an emptied lease":
				if _, err := prod.Enqueue(ctx, "job.x", []byte("l"), EnqueueOptions{ID: "L"}); err != nil {
					t.Fatal(err)
				}
				select {
				case <-lRan:
				case <-time.After(10 * time.Second):
					t.Fatal("pool A never ran L")
				}
				a.fetchCancel() // A takes no more jobs: J's redelivery goes to B
			case "lease write of a new batch":
				// A's first lease write, of K's batch, hangs; K holds A's
				// other worker slot: J's redelivery goes to B.
				hang.Store(true)
				if _, err := prod.Enqueue(ctx, "job.x", []byte("k"), EnqueueOptions{ID: "K"}); err != nil {
					t.Fatal(err)
				}
				time.Sleep(500 * time.Millisecond)
				a.fetchCancel()
			}

			if bRunsJBesideA(t, obj, &aRunning) {
				t.Fatal("pool B ran J while pool A's handler of J still ran: A's heartbeat loop waited on a hanging lease write, so J's claim was neither renewed nor given up in time")
			}
		})
	}
}

// A lapsed lease gives its jobs up at once, though a job on a claim of its
// own holds its lock meanwhile, as its renewal does while the ledger hangs
// (up to the claim's own give-up time, an ack-wait/6 later at most). The
// lease's give-up (from its renewal, or from a new batch's lease write)
// waited for that lock, holding the heartbeats' too, so a leased handler
// was cancelled only at the lease's end, when another pool may take the
// job over.
func TestLeaseGiveUpDoesNotWaitForAClaimRenewal(t *testing.T) {
	t.Parallel()
	for range 20 {
		h := &heartbeats{jobs: map[*inflight]struct{}{}}
		var claims []*inflight
		for i := range 10 {
			it := stubJob("C", uint64(i+1))
			it.claim.Revision = 1
			h.add(it)
			claims = append(claims, it)
		}
		leased := stubJob("L", 100)
		ctx, cancel := context.WithCancelCause(context.Background())
		leased.unclaimed, leased.cancel = true, cancel
		h.add(leased)
		for _, it := range claims {
			it.mu.Lock() // their renewals wait for the ledger
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.loseLeased(data.ErrClaimLost)
		}()
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
			t.Error("a leased job was not given up while claims' renewals held their locks")
		}
		for _, it := range claims {
			it.mu.Unlock()
		}
		<-done
		if t.Failed() {
			return
		}
	}
}

// One claim's renewal that hangs, bounded by its own give-up time, does not
// hold up another claim's renewal, nor its give-up, past that claim's own
// give-up time. A claim settled late (a job claimed first after waiting in
// the pool) is given up as much as an ack-wait/2 after its renewal begins,
// while a claim renewed on the heartbeats' beat gives up an ack-wait/6
// after it is due: if the loop waits for the first renewal before it
// renews, or gives up, the second, the second claim ends while its handler
// still runs here, and another pool may claim the job.
func TestClaimGiveUpIsNotHeldUpByAnotherClaimsRenewal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second})
	hb := obj.Config.heartbeat() // 1s; the loop ticks every 250ms
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	var stuck atomic.Bool
	p.ledger = data.NewLedger(stuckUpdates{KeyValue: obj.Ledger, stuck: &stuck, hang: true}, obj.Config.lease(), nil)
	t.Cleanup(p.ledger.Close)

	// X's claim is fresh: it ends two thirds of the ack wait from now,
	// and it is due for its renewal at the loop's first tick.
	lx := data.NewLedger(obj.Ledger, obj.Config.lease(), nil)
	t.Cleanup(lx.Close)
	// Y's claim was renewed on the beat: it ends a heartbeat after it is
	// due, at the loop's second tick.
	ly := data.NewLedger(obj.Ledger, hb*7/5, nil)
	t.Cleanup(ly.Close)
	x, y := stubJob("X", 1), stubJob("Y", 2)
	x.job.Subject, y.job.Subject = "job.x", "job.x"
	var err error
	if x.claim, err = lx.Claim(ctx, x.job, "a"); err != nil {
		t.Fatal(err)
	}
	if y.claim, err = ly.Claim(ctx, y.job, "a"); err != nil {
		t.Fatal(err)
	}
	yEnds := y.claim.Record.LeaseUntil
	var yCancelled atomic.Bool
	x.cancel = func(error) {}
	y.cancel = func(error) { yCancelled.Store(true) }
	x.ran, y.ran = true, true
	start := time.Now()
	p.beats.add(x)
	p.beats.add(y)
	x.mu.Lock()
	x.lastBeat = start.Add(-hb * 4 / 5)
	x.mu.Unlock()
	y.mu.Lock()
	y.lastBeat = start.Add(-hb * 3 / 5)
	y.mu.Unlock()
	stuck.Store(true) // A's ledger writes hang from here on

	done, looped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(looped)
		p.beats.loop(ctx, ctx, p, done)
	}()
	defer func() {
		close(done)
		stuck.Store(false)
		<-looped
	}()

	// Another pool claims Y once its claim ended.
	lb := data.NewLedger(obj.Ledger, obj.Config.lease(), nil)
	t.Cleanup(lb.Close)
	time.Sleep(time.Until(yEnds.Add(50 * time.Millisecond)))
	if _, err := lb.Claim(ctx, &data.Job{ID: "Y", Subject: "job.x", Seq: 3, Attempt: 1}, "b"); err != nil {
		return // Y's claim still holds it: fine
	}
	if !yCancelled.Load() {
		t.Fatalf("pool B claimed Y as its claim ended (%s after the loop began), and pool A had not cancelled Y's handler: A's loop waited for X's hanging renewal (given up only at %s)",
			yEnds.Sub(start).Round(time.Millisecond), p.claimGiveUpAt(&x.claim).Sub(start).Round(time.Millisecond))
	}
}
