package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
				if err := p.lease.add(ctx, p, b, newer.LeaseSeq, p.lease.generation()); err != nil {
					t.Fatalf("lease b: %v", err)
				}
			case "a renewal":
				// The pool holds b, and its last write is the one
				// before the other pool's: the renewal races, checks
				// again and writes on that check.
				if err := p.lease.add(ctx, p, b, old.LeaseSeq, p.lease.generation()); err != nil {
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
			if err := p.lease.add(ctx, p, a, old.LeaseSeq, p.lease.generation()); !errors.Is(err, data.ErrLeaseRaced) {
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

func leasingObjects(t *testing.T) *Objects { return objectsWith(t, Config{}) }

// objectsWith provisions jobq's objects with cfg on a server of their own.
func objectsWith(t *testing.T, cfg Config) *Objects {
	t.Helper()
	srv := servertest.Start(t)
	js, err := jetstream.New(servertest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := Provision(context.Background(), js, cfg, servertest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// claimingObjects provisions jobq as objectsWith does, with a bucket that
// answers no direct gets, as jobq creates a replicated one: its pools
// claim every job first rather than lease them.
func claimingObjects(t *testing.T, cfg Config) *Objects {
	t.Helper()
	obj := objectsWith(t, cfg)
	ctx := context.Background()
	st, err := obj.JS.Stream(ctx, "KV_"+BucketProcessed)
	if err != nil {
		t.Fatal(err)
	}
	scfg := st.CachedInfo().Config
	scfg.AllowDirect = false
	if _, err := obj.JS.UpdateStream(ctx, scfg); err != nil {
		t.Fatal(err)
	}
	// A handle that reads it without direct gets, as Provision makes.
	if obj.Ledger, err = obj.JS.KeyValue(ctx, BucketProcessed); err != nil {
		t.Fatal(err)
	}
	return obj
}

// startPool starts p, and stops it when the test ends.
func startPool(t *testing.T, p *Pool) {
	t.Helper()
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Stop(ctx)
	})
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

// checkOf checks batch for p, as checkBatches does.
func checkOf(t *testing.T, p *Pool, batch []*inflight) checked {
	t.Helper()
	gen := p.lease.generation()
	snap, err := p.check(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	return checked{batch: batch, snap: snap, gen: gen}
}

// leaseOne puts it in p's lease, as admitBatch does for a fetched batch.
func leaseOne(t *testing.T, p *Pool, it *inflight) {
	t.Helper()
	if leased, _, _ := p.admitBatch(context.Background(), checkOf(t, p, []*inflight{it})); len(leased) != 1 {
		t.Fatalf("%s not leased", it.job.ID)
	}
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
	n := checkOf(t, a, []*inflight{stubJob("X", 1)})
	n1 := checkOf(t, a, []*inflight{stubJob("J", 2)}) // one batch ahead
	if leased, _, _ := b.admitBatch(ctx, checkOf(t, b, []*inflight{stubJob("J", 3)})); len(leased) != 1 {
		t.Fatalf("B leased %d jobs, want 1", len(leased))
	}
	if leased, _, _ := a.admitBatch(ctx, n); len(leased) != 1 {
		t.Fatalf("A leased %d jobs of its first batch, want 1", len(leased))
	}
	if leased, _, _ := a.admitBatch(ctx, n1); len(leased) != 0 {
		t.Errorf("A leased J although B's live lease holds it: both pools would run J at once")
	}
}

// A check made while a job's first copy runs on the pool's own lease,
// which checks leave out, is used after that copy's completion is recorded
// and the job left the lease: the second copy is checked again, claimed
// first, finds the record, and does not run.
func TestLeaseCheckOlderThanADropChecksAgain(t *testing.T) {
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
	leased, _, _ := a.admitBatch(ctx, checked{batch: first, snap: snap, gen: gen})
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
	took, claimFirst, later := a.admitBatch(ctx, checked{batch: second, snap: snap2, gen: gen})
	if len(took) != 0 || len(claimFirst) != 0 || len(later) != 1 {
		t.Fatalf("second copy of J on the old check: leased %d, claimed first %d, later %d; want it checked again", len(took), len(claimFirst), len(later))
	}
	took, claimFirst, later = a.admitBatch(ctx, checkOf(t, a, later))
	if len(took) != 0 || len(claimFirst) != 1 || len(later) != 0 {
		t.Fatalf("second copy of J checked again: leased %d, claimed first %d, later %d; want it claimed first", len(took), len(claimFirst), len(later))
	}
	if a.claimed(ctx, claimFirst[0]) {
		t.Error("the second copy of J was handed to a worker although J is recorded done")
	}
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
	startPool(t, p)
	ack, err := NewProducer(obj.JS, obj.Config).Enqueue(context.Background(), "job.x", []byte("x"), EnqueueOptions{ID: "L"})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	moved, err := p.sweepSeq(context.Background(), exhausted{seq: ack.Sequence, at: time.Now()})
	close(release)
	if err != nil || moved {
		t.Fatalf("sweep of a job on a live lease: got moved %v, %v; want left alone", moved, err)
	}
}

// A MAX_DELIVERIES advisory that waited for the sweeper while JOB was made
// anew names the sequence of a new job that never ran: the sweep leaves it
// alone, as it was stored after the advisory went out. It was dead-lettered
// unrun.
func TestSweepOfAnAdvisoryLeavesAJobStoredSince(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	sent := time.Now().Add(-time.Second) // the advisory of an earlier JOB's job
	ack, err := NewProducer(obj.JS, obj.Config).Enqueue(context.Background(), "job.x", []byte("x"), EnqueueOptions{ID: "N"})
	if err != nil {
		t.Fatal(err)
	}
	moved, err := p.sweepSeq(context.Background(), exhausted{seq: ack.Sequence, at: sent})
	if err != nil || moved {
		t.Fatalf("sweep of an advisory sent before the job at its sequence was stored: moved %v, %v; want it left alone", moved, err)
	}
	if _, err := obj.Jobs.GetMsg(context.Background(), ack.Sequence); err != nil {
		t.Errorf("the new job is gone from JOB: %v", err)
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
		l.putLocked(fmt.Sprintf("%0*d", n, i), uint64(i))
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

// recMsg records the acks and naks of a stand-in delivered job.
type recMsg struct {
	stubMsg
	acked, naked *atomic.Int32
}

func (m recMsg) Ack() error                       { m.acked.Add(1); return nil }
func (m recMsg) DoubleAck(context.Context) error  { m.acked.Add(1); return nil }
func (m recMsg) Nak() error                       { m.naked.Add(1); return nil }
func (m recMsg) NakWithDelay(time.Duration) error { m.naked.Add(1); return nil }

func recJob(id string, seq uint64) (*inflight, recMsg) {
	m := recMsg{acked: new(atomic.Int32), naked: new(atomic.Int32)}
	return &inflight{msg: m, job: &data.Job{ID: id, Seq: seq, Attempt: 1}}, m
}

// A job that does not fit pool A's full lease is not claimed (a record
// made outside any lease, which pool B's check could miss) but checked
// again later, by when B's lease holds it.
func TestLeaseFullChecksAgainRatherThanClaim(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a, b := leasingPool(t, obj), leasingPool(t, obj)
	ctx := context.Background()
	for i := 0; i <= maxLeaseBytes/(100+leasedJobBytes); i++ {
		a.lease.putLocked(fmt.Sprintf("%0100d", i), uint64(1000+i))
	}
	cB := checkOf(t, b, []*inflight{stubJob("K", 2)})
	took, first, later := a.admitBatch(ctx, checkOf(t, a, []*inflight{stubJob("K", 1)}))
	if len(took)+len(first) != 0 || len(later) != 1 {
		t.Fatalf("A, lease full: leased %d, claimed first %d, later %d; want it checked again", len(took), len(first), len(later))
	}
	if took, _, _ := b.admitBatch(ctx, cB); len(took) != 1 {
		t.Fatal("B did not lease K")
	}
	for key := range a.lease.jobs { // room again
		a.lease.dropLocked(key)
	}
	took, first, later = a.admitBatch(ctx, checkOf(t, a, later))
	if len(took)+len(first)+len(later) != 0 {
		t.Errorf("A, checked again: leased %d, claimed first %d, later %d; want K handed back, as B's lease holds it", len(took), len(first), len(later))
	}
}

// An orphan (its handler ran, its outcome could not be recorded) that pool
// A's lease lists after A dead-lettered and acked the job holds nothing
// back: dlq retry writes the job's record, and pool B claims the re-driven
// copy rather than ack it as a duplicate of a running job.
func TestLeaseOrphanDoesNotSwallowARedrive(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a, b := leasingPool(t, obj), leasingPool(t, obj)
	ctx := context.Background()
	ack, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"})
	if err != nil {
		t.Fatal(err)
	}
	it, _ := recJob("J", ack.Sequence)
	it.job.Subject = "job.x"
	if leased, _, _ := a.admitBatch(ctx, checkOf(t, a, []*inflight{it})); len(leased) != 1 {
		t.Fatal("J not leased")
	}
	// As fail() does when the ledger refuses the failed record: the dead
	// letter is stored, the job acked, and it leaves the lease an orphan.
	it.ran = true
	if err := deadLetter(ctx, obj.JS, it.job, nats.Header{}, "permanent"); err != nil {
		t.Fatal(err)
	}
	a.leaveLease(it)
	a.lease.wrote = time.Time{}
	a.lease.renew(ctx, a)
	d, err := FindDeadLetter(ctx, obj, "J")
	if err != nil {
		t.Fatal(err)
	}
	redriven, err := RetryDeadLetter(ctx, obj, d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.ledger.Get(ctx, "J"); err != nil {
		t.Fatalf("after dlq retry: %v; want the job's record written", err)
	}
	cp, m := recJob("J", redriven.Sequence)
	_, first, _ := b.admitBatch(ctx, checkOf(t, b, []*inflight{cp}))
	if len(first) != 1 || m.acked.Load() != 0 {
		t.Errorf("B: claimed first %d, acked %d; want the re-driven copy claimed", len(first), m.acked.Load())
	}
}

// Pool A's lease ended unrenewed (its heartbeat loop was late) and pool B
// took the job over. A's next lease write, for another batch, must not
// revive the lease under the job: A gives its leased jobs up first.
func TestLeaseLapsedIsGivenUpBeforeTheNextWrite(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a, b := leasingPool(t, obj), leasingPool(t, obj)
	ctx := context.Background()
	k, _ := recJob("K", 1)
	a.beats.add(k)
	if leased, _, _ := a.admitBatch(ctx, checkOf(t, a, []*inflight{k})); len(leased) != 1 {
		t.Fatal("K not leased")
	}
	var cancelled atomic.Bool
	k.mu.Lock()
	k.ran, k.cancel = true, func(error) { cancelled.Store(true) }
	k.mu.Unlock()
	past := time.Now().Add(-time.Second).UTC()
	seq, err := a.ledger.WriteLease(ctx, a.lease.owner, data.Lease{Worker: "a", Until: past, Jobs: []data.LeasedJob{{Key: "K", Seq: 1}}}, a.lease.last)
	if err != nil {
		t.Fatal(err)
	}
	a.lease.last, a.lease.until = seq, past
	kB := stubJob("K", 1) // redelivered to B
	if leased, _, _ := b.admitBatch(ctx, checkOf(t, b, []*inflight{kB})); len(leased) != 1 || !kB.job.Resumed {
		t.Fatalf("B: leased %d (resumed %v); want K taken over as a resumed attempt", len(leased), kB.job.Resumed)
	}
	if leased, _, _ := a.admitBatch(ctx, checkOf(t, a, []*inflight{stubJob("X", 2)})); len(leased) != 1 {
		t.Fatal("X not leased")
	}
	if !cancelled.Load() {
		t.Error("A's handler of K runs on beside B's: its lapsed lease was written again")
	}
}

// An orphan stays in the lease, marked, however long it takes, until its
// job has a record: the next attempt, in another pool and with a delivery
// count of 1, is leased as a resumed one, and once it is recorded the
// orphan leaves.
func TestLeaseOrphanStaysUntilItsJobIsRecorded(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a, b := leasingPool(t, obj), leasingPool(t, obj)
	ctx := context.Background()
	orphan(t, a, "O")
	renew := func() { renewNow(ctx, a) }
	renew()
	if j, held, _ := a.lease.find("O"); !held || !j.orphan {
		t.Fatal("O left the lease without a record, want it kept as an orphan")
	}
	again := stubJob("O", 7) // published again after the dedupe window
	leased, _, _ := b.admitBatch(ctx, checkOf(t, b, []*inflight{again}))
	if len(leased) != 1 || !again.job.Resumed || !again.claim.Record.Resumed {
		t.Fatalf("B: leased %d, resumed %v (record %v); want O leased as a resumed attempt", len(leased), again.job.Resumed, again.claim.Record.Resumed)
	}
	renew()
	if j, held, _ := a.lease.find("O"); !held || !j.orphan {
		t.Fatal("O left A's lease before its job was recorded")
	}
	if err := b.ledger.Done(ctx, &again.claim, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	renew()
	if _, held, _ := a.lease.find("O"); held {
		t.Error("O still in A's lease after its job was recorded")
	}
}

// orphan leases job id in p and has it leave the lease as an orphan: its
// handler ran, and no record was stored.
func orphan(t *testing.T, p *Pool, id string) {
	t.Helper()
	it := stubJob(id, 1)
	if leased, _, _ := p.admitBatch(context.Background(), checkOf(t, p, []*inflight{it})); len(leased) != 1 {
		t.Fatalf("%s not leased", id)
	}
	it.ran = true
	p.leaveLease(it)
}

// renewNow renews p's lease as its next heartbeat would.
func renewNow(ctx context.Context, p *Pool) {
	p.lease.mu.Lock()
	p.lease.wrote = time.Time{}
	p.lease.mu.Unlock()
	p.lease.renew(ctx, p)
}

// An orphan whose job gets no record stays no longer than a record would
// have: ProcessedTTL after it was orphaned, it leaves the lease.
func TestLeaseOrphanLeavesAfterTheLedgerTTL(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a := leasingPool(t, obj)
	ctx := context.Background()
	orphan(t, a, "O")
	renew := func() { renewNow(ctx, a) }
	renew()
	if j, held, _ := a.lease.find("O"); !held || !j.orphan {
		t.Fatal("O left the lease at once, want it kept as an orphan")
	}
	a.lease.mu.Lock()
	a.lease.jobs["O"].orphanedAt = time.Now().Add(-a.cfg.ProcessedTTL)
	a.lease.mu.Unlock()
	renew()
	if _, held, _ := a.lease.find("O"); held {
		t.Fatal("O still in the lease a ledger TTL after it was orphaned")
	}
	snap, err := a.ledger.Check(ctx, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := snap.Leased("O"); ok {
		t.Error("O still in the stored lease")
	}
}

// collect deletes the leases of other pools that ended once their jobs all
// have records, or once they ended a ledger TTL ago; it leaves live leases
// and ended ones with a job still unrecorded.
func TestLeaseCollectDeletesEndedLeases(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	p := leasingPool(t, obj)
	ctx := context.Background()
	recorded := stubJob("recorded", 1)
	c := p.ledger.Prepare(recorded.job, "w", p.lease.owner)
	if err := p.ledger.Done(ctx, &c, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	ended := time.Now().Add(-2 * p.cfg.lease())
	leases := []struct {
		owner string
		until time.Time
		key   string
		keep  bool
	}{
		{"live", time.Now().Add(time.Minute), "unrecorded", true},
		{"ended", ended, "unrecorded", true},
		{"settled", ended, "recorded", false},
		{"expired", time.Now().Add(-p.cfg.ProcessedTTL - time.Minute), "unrecorded", false},
	}
	var last uint64
	for _, l := range leases {
		seq, err := p.ledger.WriteLease(ctx, l.owner, data.Lease{Worker: "w", Until: l.until, Jobs: []data.LeasedJob{{Key: l.key, Seq: 1}}}, last)
		if err != nil {
			t.Fatal(err)
		}
		last = seq
	}
	p.lease.collect(ctx, p)
	snap, err := p.ledger.Check(ctx, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]bool{}
	for _, ls := range snap.Leases {
		left[ls.Owner] = true
	}
	for _, l := range leases {
		if left[l.owner] != l.keep {
			t.Errorf("lease %s: kept %v, want %v", l.owner, left[l.owner], l.keep)
		}
	}
}

// A re-driven copy that finds the pool's own run of the job is dropped as
// a duplicate while that run's handler runs, but not once it returned: the
// copy may then be the re-drive of that very run's dead letter, and it is
// released for another look in a moment instead.
func TestLeaseRedriveOfAFinishingRunIsNotDropped(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a := leasingPool(t, obj)
	ctx := context.Background()
	run := stubJob("R", 1)
	if leased, _, _ := a.admitBatch(ctx, checkOf(t, a, []*inflight{run})); len(leased) != 1 {
		t.Fatal("R not leased")
	}
	redrive := func(seq uint64) recMsg {
		it, m := recJob("R", seq)
		it.job.Header = map[string][]string{HeaderJobID: {"R"}}
		if took, first, later := a.admitBatch(ctx, checkOf(t, a, []*inflight{it})); len(took)+len(first)+len(later) != 0 {
			t.Fatalf("re-drive of R: leased %d, claimed first %d, later %d; want it handed back", len(took), len(first), len(later))
		}
		return m
	}
	if m := redrive(2); m.acked.Load() != 1 || m.naked.Load() != 0 {
		t.Errorf("re-drive while R runs: acked %d, naked %d; want it dropped", m.acked.Load(), m.naked.Load())
	}
	a.lease.finishing(data.Key("R"), run)
	if m := redrive(3); m.acked.Load() != 0 || m.naked.Load() != 1 {
		t.Errorf("re-drive once R's handler returned: acked %d, naked %d; want it released", m.acked.Load(), m.naked.Load())
	}
}

// A retry of a job that failed on another pool's lease is claimed, not
// held back by that lease, which lists the job until its next write: the
// run's retry record, written through its prepared claim after the lease's
// write, says that the run is over. Held back, the retry would be released
// until the lease ends and lose one of its deliveries.
func TestLeaseRetryOnAnotherPoolIsNotHeldByAStaleLease(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a, b := leasingPool(t, obj), leasingPool(t, obj)
	ctx := context.Background()
	it, _ := recJob("J", 1)
	leaseOne(t, a, it)
	// As runOne and fail do for a failure that is retried.
	it.ran = true
	if err := a.ledger.Retry(ctx, &it.claim, time.Millisecond, "boom"); err != nil {
		t.Fatal(err)
	}
	a.leaveLease(it)

	retry, m := recJob("J", 1)
	retry.job.Attempt = 2
	took, first, later := b.admitBatch(ctx, checkOf(t, b, []*inflight{retry}))
	if len(first) != 1 {
		t.Errorf("B, J's retry: leased %d, claimed first %d, later %d, released %d; want it claimed first, not released until A's lease ends", len(took), len(first), len(later), m.naked.Load())
	}
}

// A record that a job's run on another pool's lease did not write, here
// one that a dead letter's re-drive wrote while the run goes on, leaves the
// lease holding the job.
func TestLeaseHoldsAJobWhoseRecordItsRunDidNotWrite(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a, b := leasingPool(t, obj), leasingPool(t, obj)
	ctx := context.Background()
	it, _ := recJob("J", 1)
	leaseOne(t, a, it)
	if err := a.ledger.FailUnclaimed(ctx, &data.Job{ID: "J", Subject: "job.x", Seq: 1}, "an old failure"); err != nil {
		t.Fatal(err)
	}
	copyOf, m := recJob("J", 2)
	took, first, later := b.admitBatch(ctx, checkOf(t, b, []*inflight{copyOf}))
	if len(took)+len(first)+len(later) != 0 || m.acked.Load()+m.naked.Load() != 1 {
		t.Errorf("B, a copy of J while A runs it: leased %d, claimed first %d, later %d; want it handed back while A's lease holds J", len(took), len(first), len(later))
	}
}

// A record that a job's run on one lease wrote after that lease's write
// frees the job of that lease only, not of another live lease that runs
// it. Pool A's lease lapses (A paused) while A runs J; pool B leases J's
// redelivery and runs it, with no record yet; A comes back, leases a new
// batch (J still in its lease) and records its cut-off run of J. A copy of
// J reaching pool C must wait for B's lease, though A's ends last.
func TestLeaseRecordOfOneLeaseDoesNotFreeAJobAnotherLeaseRuns(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{AckWait: 3 * time.Second})
	a, b, c := leasingPool(t, obj), leasingPool(t, obj), leasingPool(t, obj)
	ctx := context.Background()

	itA, _ := recJob("J", 1)
	leaseOne(t, a, itA)
	itA.ran = true // A's handler runs; A is paused past its lease's end
	a.lease.mu.Lock()
	until := a.lease.until
	a.lease.mu.Unlock()
	time.Sleep(time.Until(until) + 50*time.Millisecond)

	itB, _ := recJob("J", 1) // J redelivered, to B
	leaseOne(t, b, itB)
	itB.ran = true

	itK, _ := recJob("K", 2) // A is back, and leases a new batch
	leaseOne(t, a, itK)
	if err := a.ledger.Retry(ctx, &itA.claim, time.Millisecond, data.CauseLeaseLost); err != nil { // as leaseLost does
		t.Fatal(err)
	}

	copyOf, m := recJob("J", 3)
	copyOf.job.Header = nats.Header{HeaderJobID: {"J"}} // a re-drive
	took, first, later := c.admitBatch(ctx, checkOf(t, c, []*inflight{copyOf}))
	if len(took)+len(first)+len(later) != 0 || m.naked.Load() != 1 {
		t.Errorf("C, a copy of J while B's live lease runs it: leased %d, claimed first %d, later %d, released %d; want it released until B's lease ends", len(took), len(first), len(later), m.naked.Load())
	}
}

// A sweep stops between jobs once the pool is stopping: Stop does not wait
// for a sweep of many exhausted jobs, which the next start sweeps again.
func TestSweepStopsWhenThePoolStops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{MaxDeliver: 1, AckWait: time.Second})
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "X"}); err != nil {
		t.Fatal(err)
	}
	if msg, err := fetchOne(ctx, obj, nil, 5*time.Second); err != nil || msg == nil {
		t.Fatalf("fetch X: %v, %v", msg, err) // and never acked: its one delivery runs out
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info, err := obj.Worker.Info(ctx)
		if err == nil && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("X still pending after 10s: %v", err)
		}
	}
	p := NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), servertest.Logger(t))
	t.Cleanup(p.ledger.Close)
	p.stopping.Store(true)
	if n, err := p.sweep(ctx); n != 0 || err != nil {
		t.Errorf("sweep of a stopping pool: moved %d, %v; want none", n, err)
	}
	p.stopping.Store(false)
	if n, err := p.sweep(ctx); n != 1 || err != nil {
		t.Errorf("sweep: moved %d, %v; want X", n, err)
	}
}

// hookedNak is a delivered job whose Nak runs hook first, then records its
// delay and when it was sent.
type hookedNak struct {
	stubMsg
	hook  func()
	delay *atomic.Int64
	at    *atomic.Int64
}

func (m hookedNak) NakWithDelay(d time.Duration) error {
	m.hook()
	m.delay.Store(int64(d))
	m.at.Store(time.Now().UnixNano())
	return nil
}

// A job on pool A's lease whose handler ran and whose retrying (or
// cut-off) record the ledger refused is released no earlier than its place
// in A's lease ends, and leaves the lease (an orphan) in the same step.
// It became an orphan only later, in release (leaveLease): a lease write
// between the two (the heartbeat loop's
// renewal, or the lease.add of another fetched batch, on their own
// goroutines) stores the lease listing the job as running, not an orphan,
// until a later end than the Nak's delay was computed from. If A then
// writes no more (it stops: Stop never rewrites a lease that keeps an
// orphan; or it is killed), the job's redelivery meets that lease and is
// handed back, spending a delivery (its last: dead-lettered with fewer
// runs than --max-deliver).
//
// The renewal is forced into the window here by running it as the Nak
// goes out; in a pool it is the heartbeat loop's, racing the worker.
func TestLeasedJobReleasedAsItsLeaseIsRenewedSpendsNoDelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// lease 4s, heartbeat 2s: a renewal is due 2s after a write.
	obj := objectsWith(t, Config{AckWait: 6 * time.Second, MaxDeliver: 3, RetryBackoff: []time.Duration{10 * time.Millisecond}})
	a, b := leasingPool(t, obj), leasingPool(t, obj)
	var delay, at atomic.Int64
	m := hookedNak{hook: func() {}, delay: &delay, at: &at}
	it := &inflight{msg: m, job: &data.Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 1}}
	leaseOne(t, a, it)
	it.mu.Lock()
	it.ran = true // its handler ran and failed
	it.mu.Unlock()

	time.Sleep(2100 * time.Millisecond) // A's renewal is due
	m.hook = func() { a.lease.renew(ctx, a) }
	it.msg = m
	a.recordFailed(it, errors.New("record job J retrying: nats: timeout"), *a.jobLog(it.job))
	a.leaveLease(it) // as release does; A writes its lease no more (stopped)

	if at.Load() == 0 {
		t.Fatal("J was not released")
	}
	back := time.Unix(0, at.Load()).Add(time.Duration(delay.Load()))
	time.Sleep(time.Until(back))
	// J's redelivery, to pool B (or to the pool started after A's).
	again, msg := recJob("J", 1)
	again.job.Subject, again.job.Attempt = "job.x", 2
	took, first, later := b.admitBatch(ctx, checkOf(t, b, []*inflight{again}))
	if len(took) != 1 {
		snap := checkOf(t, b, []*inflight{again}).snap
		ls, j, _ := snap.Leased(data.Key("J"))
		t.Errorf("J, released with delay %s, came back and was leased %d, claimed first %d, later %d, naked %d (a delivery spent): A's stored lease lists it orphan=%v until %s, %s after it came back",
			time.Duration(delay.Load()), len(took), len(first), len(later), msg.naked.Load(), j.Orphan, ls.Until.Format(time.RFC3339Nano), time.Until(ls.Until).Round(time.Millisecond))
	}
}

// done and letGo tell a job's own lease entry from another copy's, and
// from another delivery's: a redelivery of the same message has the same
// stream sequence, by which alone they told it. Pool A releases J (its retry record refused): letGo marks
// J's entry an orphan, the Nak goes out. J's redelivery is leased by A, as
// a resumed attempt, before the first copy's release() runs leaveLease;
// that leaveLease then acts on the redelivery's entry: it marks the
// running redelivery an orphan ("holds nothing back"). Once A's lease is
// written so, pool B leases another copy of J (a republish after the
// dedupe window) while the redelivery still runs in A: two handlers of J
// at once.
func TestLeaseFirstDeliverysLeaveDoesNotTouchItsRedeliverysEntry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{AckWait: 6 * time.Second, MaxDeliver: 3, RetryBackoff: []time.Duration{10 * time.Millisecond}})
	a, b := leasingPool(t, obj), leasingPool(t, obj)

	first, _ := recJob("J", 1)
	first.job.Subject = "job.x"
	leaseOne(t, a, first)
	first.mu.Lock()
	first.ran = true // its handler ran and failed
	first.mu.Unlock()
	a.recordFailed(first, errors.New("record job J retrying: nats: timeout"), *a.jobLog(first.job))

	// J's redelivery (same stream sequence) comes back to A and is leased.
	again, _ := recJob("J", 1)
	again.job.Subject, again.job.Attempt = "job.x", 2
	if took, _, _ := a.admitBatch(ctx, checkOf(t, a, []*inflight{again})); len(took) != 1 {
		t.Fatalf("A: redelivery of J leased %d, want 1", len(took))
	}
	again.mu.Lock()
	again.ran = true // its handler runs now
	again.mu.Unlock()

	a.leaveLease(first) // the first copy's release, as release() does

	if j, held, _ := a.lease.find(data.Key("J")); !held || j.orphan {
		t.Errorf("A's entry of J, run by its redelivery: held %v, orphan %v; want held, running", held, j.orphan)
	}
	renewNow(ctx, a)
	other, m := recJob("J", 7) // published again, after the dedupe window
	other.job.Subject = "job.x"
	if took, _, _ := b.admitBatch(ctx, checkOf(t, b, []*inflight{other})); len(took) != 0 {
		t.Errorf("B leased a copy of J (acked %d, naked %d) while A runs J's redelivery: two handlers of J at once", m.acked.Load(), m.naked.Load())
	}
}
