package queue

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// hookMsg is a stub delivery whose ack and release call hook, and say
// which came.
type hookMsg struct {
	stubMsg
	hook   func()
	mu     *sync.Mutex
	acked  *bool
	naked  *bool
	nakFor *time.Duration
}

func newHookMsg(hook func()) hookMsg {
	return hookMsg{hook: hook, mu: new(sync.Mutex), acked: new(bool), naked: new(bool), nakFor: new(time.Duration)}
}

func (m hookMsg) fire() {
	if m.hook != nil {
		m.hook()
	}
}

func (m hookMsg) DoubleAck(context.Context) error {
	m.mu.Lock()
	*m.acked = true
	m.mu.Unlock()
	m.fire()
	return nil
}
func (m hookMsg) Ack() error { return m.DoubleAck(context.Background()) }
func (m hookMsg) Nak() error { return m.NakWithDelay(0) }
func (m hookMsg) NakWithDelay(d time.Duration) error {
	m.mu.Lock()
	*m.naked, *m.nakFor = true, d
	m.mu.Unlock()
	m.fire()
	return nil
}

// The sweep runs in its own goroutine, beside the pool's admitBatch, and
// both now add to the same lease. lease.add only guards against other
// pools' writes (the expected lease sequence), not against this pool's
// own: admitBatch decides in sortBatch that copy B of X is free, the
// sweep of copy A (same ID, deliveries exhausted) then leases X, records
// it awaiting its dead letter, and (variant "whole") dead-letters it and
// drops it from the lease, or (variant "overlap") is still at its record
// write; admitBatch's lease write then succeeds on its older sort. B runs
// on a prepared claim whose done record is refused (the sweep's record
// is there): B, which succeeded, runs again on its redelivery, which is
// the very defect the change meant to remove.
//
// The interleaving is driven through the release of another job C of the
// same batch that sortBatch hands back (another pool's live lease holds
// it), between B's sort and the batch's lease write.
func TestSweepBetweenItsOwnPoolsSortAndLeaseWriteKeepsOneRun(t *testing.T) {
	t.Parallel()
	for _, variant := range []string{"whole", "overlap"} {
		t.Run(variant, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := objectsWith(t, Config{FetchWait: 200 * time.Millisecond})
			_, mA, bMsg := twoCopiesOfX(t, obj)
			q := leasingPool(t, obj)
			leaseOne(t, q, stubJob("C", 1000)) // C runs on q's live lease

			// p: the pool that sweeps A and admits B; its writes of X's
			// record can be held up.
			atRecord, goOn := make(chan struct{}), make(chan struct{})
			var once sync.Once
			pObj := *obj
			pObj.Ledger = &recordWriteHook{KeyValue: obj.Ledger, key: data.Key("X"), before: func() {
				if variant == "overlap" {
					once.Do(func() {
						close(atRecord)
						<-goOn
					})
				}
			}}
			p := NewPool(&pObj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
			t.Cleanup(p.ledger.Close)

			itB := stubJob("X", bMsg.Sequence)
			itB.job.Subject, itB.job.EnqueuedAt = "job.x", bMsg.Time
			var fired bool
			sweepDone := make(chan error, 1)
			itC := &inflight{job: &data.Job{ID: "C", Seq: 1001, Attempt: 1}}
			itC.msg = newHookMsg(func() {
				if fired {
					return
				}
				fired = true
				go func() {
					_, err := p.sweepOne(ctx, mA)
					sweepDone <- err
				}()
				if variant == "overlap" {
					<-atRecord // the sweep leased X and is at its record write
				} else if err := <-sweepDone; err != nil {
					t.Errorf("sweep A: %v", err)
				}
			})
			leased, claimFirst, later := p.admitBatch(ctx, checkOf(t, p, []*inflight{itB, itC}))
			if !fired {
				t.Fatal("C was not handed back")
			}
			if variant == "overlap" {
				close(goOn)
				if err := <-sweepDone; err != nil {
					t.Errorf("sweep A: %v", err)
				}
			}
			var claimB *data.Claim
			for _, it := range leased {
				if it == itB {
					claimB = &itB.claim
				}
			}
			for _, it := range claimFirst {
				if it == itB {
					if c, err := p.ledger.Claim(ctx, itB.job, "p"); err == nil {
						claimB = &c
					}
				}
			}
			if len(later) != 0 {
				t.Logf("%d to check again", len(later))
			}
			if claimB != nil {
				if err := p.ledger.Done(ctx, claimB, time.Millisecond); err != nil {
					t.Errorf("B ran (leased %v) and its done record was refused: %v", len(leased) > 0, err)
				}
			}
		})
	}
}

// A re-drive (jobq dlq retry) of the dead letter that the sweep just
// stored, fetched by the sweeping pool before the sweep drops X from its
// lease, is acked as a "duplicate of a running job": the sweep's lease
// entry is never marked finishing, as a run's is once its handler
// returned (see sortBatch's first case). The re-drive took the dead
// letter out of DLQ: X is neither run nor dead-lettered.
func TestARedriveOfTheSweepsDeadLetterIsNotDroppedAsACopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{FetchWait: 200 * time.Millisecond})
	_, mA, _ := twoCopiesOfX(t, obj)

	var fired bool
	var itR *inflight
	var p *Pool
	pObj := *obj
	pObj.Ledger = &recordWriteHook{KeyValue: obj.Ledger, key: data.Key("X"), before: func() {}}
	hook := pObj.Ledger.(*recordWriteHook)
	p = NewPool(&pObj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	t.Cleanup(p.ledger.Close)
	var created bool
	hook.before = func() {
		// The first write is the sweep's record (Create), the next its
		// failed record (Update), after the dead letter is stored.
		if !created {
			created = true
			return
		}
		if fired {
			return
		}
		fired = true
		d, err := DeadLetterOf(ctx, obj, "X")
		if err != nil {
			t.Errorf("no dead letter yet: %v", err)
			return
		}
		r, err := RetryDeadLetter(ctx, obj, d)
		if err != nil {
			t.Errorf("re-drive: %v", err)
			return
		}
		itR = &inflight{msg: newHookMsg(nil), job: &data.Job{ID: r.ID, Subject: "job.x", Seq: r.Sequence, Attempt: 1,
			Header: map[string][]string{HeaderJobID: {r.ID}}}}
		p.admitBatch(ctx, checkOf(t, p, []*inflight{itR}))
	}
	if moved, err := p.sweepOne(ctx, mA); err != nil || !moved {
		t.Fatalf("sweep A: moved %v, %v", moved, err)
	}
	if !fired || itR == nil {
		t.Fatal("no re-drive")
	}
	m := itR.msg.(hookMsg)
	if *m.acked {
		_, derr := DeadLetterOf(ctx, obj, "X")
		t.Errorf("the re-drive of X was acked without running (dead letter: %v): X is lost", derr)
	}
}

// A job whose handler ran in this pool and whose outcome could not be
// recorded stays in the lease as an orphan (rule 4): the only sign that
// it may have run. When its deliveries run out and the sweep's record
// write fails (as it likely does: the ledger that failed the run's record
// is the same), leaseForDeadLetter has already replaced the orphan entry
// with its own, and its deferred drop then removes it: no record, no
// lease says that X may have run.
func TestSweepKeepsAnOrphanWhenItsRecordFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{FetchWait: 200 * time.Millisecond})
	_, mA, _ := twoCopiesOfX(t, obj)
	pObj := *obj
	failing := &failingCreate{KeyValue: obj.Ledger, key: data.Key("X")}
	pObj.Ledger = failing
	p := NewPool(&pObj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	t.Cleanup(p.ledger.Close)

	it := stubJob("X", mA.Sequence)
	it.job.Subject, it.job.EnqueuedAt = "job.x", mA.Time
	leaseOne(t, p, it)
	p.lease.done(data.Key("X"), it, true) // ran; its record could not be stored
	failing.on = true
	if _, err := p.sweepOne(ctx, mA); err == nil {
		t.Fatal("sweep A: no error, with its record write failing")
	}
	if j, held, _ := p.lease.find(data.Key("X")); !held || !j.orphan {
		t.Errorf("X left the pool's lease (held %v, orphan %v) with no record: nothing says it may have run", held, j.orphan)
	}
}

// failingCreate fails every Create of key once on is set.
type failingCreate struct {
	jetstream.KeyValue
	key string
	on  bool
}

func (kv *failingCreate) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if kv.on && key == kv.key {
		return 0, errors.New("ledger unavailable")
	}
	return kv.KeyValue.Create(ctx, key, value, opts...)
}
