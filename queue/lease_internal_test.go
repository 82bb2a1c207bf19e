package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// A lease write may rest on a check older than the pool's last write only
// if no check since saw more: here, another pool leases job a between an
// old check and a newer one that this pool wrote on, and the old check's
// batch, which holds a, must be checked again rather than leased.
func TestLeaseRefusesACheckOlderThanOneItWroteOn(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"a later batch", "a renewal"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			p := leasingPool(t, leasingObjects(t))
			it := func(id string, seq uint64) *inflight {
				return &inflight{job: &data.Job{ID: id, Seq: seq, Attempt: 1}}
			}
			a, b := []*inflight{it("a", 1)}, []*inflight{it("b", 2)}

			old, err := p.check(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			other := data.Lease{Worker: "w", Until: time.Now().Add(time.Minute), Jobs: []data.LeasedJob{{Key: "a", Seq: 1}}}
			switch via {
			case "a later batch":
				foreign, err := p.ledger.WriteLease(ctx, "other", other, old.LeaseSeq)
				if err != nil {
					t.Fatal(err)
				}
				newer, err := p.check(ctx, b)
				if err != nil || newer.LeaseSeq != foreign {
					t.Fatalf("newer check: got %+v, %v; want the other pool's lease at %d", newer, err, foreign)
				}
				if err := p.lease.add(ctx, p, b, newer.LeaseSeq); err != nil {
					t.Fatalf("lease b: %v", err)
				}
			case "a renewal":
				// The pool holds b, and its last write is the one
				// before the other pool's: the renewal races, checks
				// again and writes on that check.
				if err := p.lease.add(ctx, p, b, old.LeaseSeq); err != nil {
					t.Fatalf("lease b: %v", err)
				}
				if _, err := p.ledger.WriteLease(ctx, "other", other, p.lease.last); err != nil {
					t.Fatal(err)
				}
				p.lease.wrote = time.Time{}
				last := p.lease.last
				p.lease.renew(ctx, p)
				if p.lease.last == last {
					t.Fatal("renewal: the lease was not written")
				}
			}
			if err := p.lease.add(ctx, p, a, old.LeaseSeq); !errors.Is(err, data.ErrLeaseRaced) {
				t.Fatalf("lease a on the old check: got %v, want ErrLeaseRaced", err)
			}
			fresh, err := p.check(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			if ls, _, ok := fresh.Leased("a"); !ok || ls.Owner != "other" {
				t.Fatalf("check again: got %+v, want a in the other pool's lease", fresh)
			}
		})
	}
}

func leasingObjects(t *testing.T) *Objects {
	t.Helper()
	srv := servertest.Start(t)
	js, err := jetstream.New(servertest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := Provision(context.Background(), js, Config{}, servertest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

func leasingPool(t *testing.T, obj *Objects) *Pool {
	t.Helper()
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	if !p.leasing {
		t.Fatal("pool does not lease")
	}
	t.Cleanup(p.ledger.Close)
	return p
}

// stubMsg stands in for a delivered job: its acks and naks go nowhere.
type stubMsg struct{ jetstream.Msg }

func (stubMsg) Ack() error                       { return nil }
func (stubMsg) DoubleAck(context.Context) error  { return nil }
func (stubMsg) Nak() error                       { return nil }
func (stubMsg) NakWithDelay(time.Duration) error { return nil }
func (stubMsg) InProgress() error                { return nil }

func stubJob(id string, seq uint64) *inflight {
	return &inflight{msg: stubMsg{}, job: &data.Job{ID: id, Seq: seq, Attempt: 1}}
}

// The same through admitBatch: pool A checks its next batch (a copy of J)
// ahead while its write of the batch before races pool B's lease of
// another copy of J; A checks that batch again and writes it. Its next
// batch must not then be leased on its older check.
func TestLeaseRetriedWriteThenAnOlderCheck(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a, b := leasingPool(t, obj), leasingPool(t, obj)
	ctx := context.Background()
	checkOf := func(p *Pool, batch []*inflight) checked {
		gen := p.lease.generation()
		snap, err := p.check(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		return checked{batch: batch, snap: snap, gen: gen}
	}
	n := checkOf(a, []*inflight{stubJob("X", 1)})
	n1 := checkOf(a, []*inflight{stubJob("J", 2)}) // one batch ahead
	if leased, _ := b.admitBatch(ctx, checkOf(b, []*inflight{stubJob("J", 3)})); len(leased) != 1 {
		t.Fatalf("B leased %d jobs, want 1", len(leased))
	}
	if leased, _ := a.admitBatch(ctx, n); len(leased) != 1 {
		t.Fatalf("A leased %d jobs of its first batch, want 1", len(leased))
	}
	if leased, _ := a.admitBatch(ctx, n1); len(leased) != 0 {
		t.Errorf("A leased J although B's live lease holds it: both pools would run J at once")
	}
}

// A check made while a job's first copy runs on the pool's own lease,
// which checks leave out, is used after that copy's completion is recorded
// and the job left the lease: the second copy is claimed first, finds the
// record, and does not run.
func TestLeaseCheckOlderThanADropClaimsFirst(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a := leasingPool(t, obj)
	ctx := context.Background()
	first := []*inflight{stubJob("J", 1)}
	gen := a.lease.generation()
	snap, err := a.check(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	leased, _ := a.admitBatch(ctx, checked{batch: first, snap: snap, gen: gen})
	if len(leased) != 1 {
		t.Fatal("J not leased")
	}
	second := []*inflight{stubJob("J", 2)}
	gen = a.lease.generation()
	snap2, err := a.check(ctx, second) // while J's first copy runs
	if err != nil {
		t.Fatal(err)
	}
	it := leased[0]
	it.ran = true
	if err := a.ledger.Done(ctx, &it.claim, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	a.leaveLease(it)
	took, claimFirst := a.admitBatch(ctx, checked{batch: second, snap: snap2, gen: gen})
	if len(took) != 0 || len(claimFirst) != 1 {
		t.Fatalf("second copy of J: leased %d, claimed first %d; want it claimed first", len(took), len(claimFirst))
	}
	if !a.claimed(ctx, claimFirst[0]) {
		return // acked as done
	}
	t.Error("the second copy of J was handed to a worker although J is recorded done")
}

// The sweep, told that a job's deliveries ran out, leaves alone a job that
// runs on a live lease, as it does one with a live claim.
func TestSweepLeavesAJobOnALiveLease(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	started, release := make(chan struct{}), make(chan struct{})
	p := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		close(started)
		<-release
		return nil
	}), servertest.Logger(t))
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Stop(ctx)
	})
	ack, err := NewProducer(obj.JS, obj.Config).Enqueue(context.Background(), "job.x", []byte("x"), EnqueueOptions{ID: "L"})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	moved, err := p.sweepSeq(context.Background(), ack.Sequence)
	close(release)
	if err != nil || moved {
		t.Fatalf("sweep of a job on a live lease: got moved %v, %v; want left alone", moved, err)
	}
}

// A lease record stays under maxLeaseBytes: the jobs that would take it
// over are claimed first instead.
func TestLeaseFitKeepsTheRecordSmall(t *testing.T) {
	t.Parallel()
	l := newLease()
	// Keys that leave 50 bytes of room: one for a short job, none for a
	// job with a 100-byte key, or for any after it.
	size := 0
	for i := 0; maxLeaseBytes-50-size > leasedJobBytes; i++ {
		n := min(500, maxLeaseBytes-50-size-leasedJobBytes)
		l.jobs[fmt.Sprintf("%0*d", n, i)] = &leased{seq: uint64(i)}
		size += n + leasedJobBytes
	}
	batch := []*inflight{stubJob("short", 1), stubJob(strings.Repeat("x", 100), 2), stubJob("=never-fits", 3)}
	fits, rest := l.fit(batch)
	if len(fits) != 1 || len(rest) != 2 || fits[0] != batch[0] {
		t.Fatalf("fit: got %d fitting, %d left; want the first job only", len(fits), len(rest))
	}
	if fits, rest := newLease().fit(batch); len(fits) != 3 || len(rest) != 0 {
		t.Fatalf("fit in an empty lease: got %d fitting, %d left; want all", len(fits), len(rest))
	}
}
