package queue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
)

// Pool A's lease of J lapsed (its renewals failed) and A's handler of J,
// cut off, returns only after the lease ended: leaseLost then creates J's
// record through the prepared claim, outside any live lease. Pool B
// checked a copy of J just before that record landed (A's lease ended, no
// record: B takes J over as a resumed attempt), and writes its lease only
// after pool C, given J's release, checked J, found the record and claimed
// it. B's lease write expects only the lease sequence, which no record
// write moves: both B and C would run J at once.
func TestARecordStoredLateByALapsedLeaseKeepsItsJobToOnePool(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a, b, c := leasingPool(t, obj), leasingPool(t, obj), leasingPool(t, obj)
	ctx := context.Background()

	itA := stubJob("J", 1)
	leaseOne(t, a, itA)
	itA.mu.Lock()
	itA.ran = true // A's handler started
	itA.mu.Unlock()
	// A's lease is not renewed in time: it ends (as in
	// TestLeaseLapsedIsGivenUpBeforeTheNextWrite).
	past := time.Now().Add(-time.Second).UTC()
	seq, err := a.ledger.WriteLease(ctx, a.lease.owner, data.Lease{Worker: "a", Until: past, Jobs: []data.LeasedJob{{Key: "J", Seq: 1}}}, a.lease.last)
	if err != nil {
		t.Fatal(err)
	}
	a.lease.last, a.lease.until = seq, past

	// B checks a copy of J (the batch ahead of the one it is writing).
	copyB := stubJob("J", 2)
	nb := checkOf(t, b, []*inflight{copyB})

	// A's handler returns now, cut off by its lost lease.
	a.leaseLost(itA, fmt.Errorf("%w: lease lapsed", data.ErrClaimLost), a.log)

	// J's release reaches C, which checks it and claims it.
	itC := stubJob("J", 1)
	itC.job.Attempt = 2
	leasedC, firstC, _ := c.admitBatch(ctx, checkOf(t, c, []*inflight{itC}))
	cRuns := len(leasedC) == 1 || len(firstC) == 1 && c.claimed(ctx, firstC[0])

	// B's lease write, on its check from before A's record.
	leasedB, firstB, _ := b.admitBatch(ctx, nb)
	bRuns := len(leasedB) == 1 || len(firstB) == 1 && b.claimed(ctx, firstB[0])

	if cRuns && bRuns {
		t.Errorf("J runs in pool C (on a claim of its record) and in pool B (on B's lease, leased on a check from before the record) at once")
	}
	if !cRuns && !bRuns {
		t.Errorf("J runs nowhere")
	}
}

// A pool's lease lapsed (its renewals failed past its end, as in a ledger
// outage) while it held only an orphan. Once the ledger answers again,
// the renewals must go on: here the orphan's job is recorded, and the
// next renewals should drop it and write the lease. Every renewal runs
// under a deadline that passed (the lapsed lease's give-up time), so none
// can ever write again while the lease holds a job: the pool logs a
// failed renewal every tick, for good (or until another batch is leased).
func TestALapsedLeaseIsWrittenAgainOnceTheLedgerAnswers(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	a := leasingPool(t, obj)
	ctx := context.Background()
	orphan(t, a, "O")
	a.lease.mu.Lock()
	a.lease.until = time.Now().Add(-time.Second)
	last := a.lease.last
	a.lease.mu.Unlock()
	c := a.ledger.Prepare(&data.Job{ID: "O", Subject: "job.x", Seq: 1, Attempt: 1}, "w", "other")
	if err := a.ledger.Done(ctx, &c, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		renewNow(ctx, a)
	}
	if _, held, _ := a.lease.find("O"); held {
		t.Error("O's job is recorded, yet O stays in the lapsed lease: no renewal can run")
	}
	a.lease.mu.Lock()
	defer a.lease.mu.Unlock()
	if a.lease.last == last {
		t.Error("the lapsed lease was never written again")
	}
}

// Stop begins after checkBatches checked a batch and before admitBatch
// takes it in: handBackAtStop then hands back the jobs not on their last
// delivery, and the batch shrinks, while the check's Found (and Holder's
// records) are by the index of each job in the batch as checked. Here X
// (first delivery, no record) comes before D (last delivery, recorded
// done): with X handed back, D is sorted by X's entry and leased as a job
// without a record: its handler would run although it is recorded done
// (or, with a live claim of another pool's on D, beside that run).
func TestStopBetweenCheckAndAdmitChecksTheJobsThatStillRun(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{MaxDeliver: 3})
	p := leasingPool(t, obj)
	ctx := context.Background()
	done := &data.Job{ID: "D", Subject: "job.x", Seq: 2, Attempt: 1}
	c, err := p.ledger.Claim(ctx, done, "w")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ledger.Done(ctx, &c, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	x := stubJob("X", 1)
	d := stubJob("D", 2)
	d.job.Attempt = 3 // its last delivery: it runs still at Stop (keepAtStop)
	ck := checkOf(t, p, []*inflight{x, d})
	if ck.snap.Found[0] || !ck.snap.Found[1] {
		t.Fatalf("check: found %v, want X without a record and D with one", ck.snap.Found)
	}
	// Stop begins; the pull is drained.
	p.fetchDone = make(chan struct{})
	close(p.fetchDone)
	p.stopping.Store(true)
	leased, claimFirst, later := p.admitBatch(ctx, ck)
	for _, it := range leased {
		if it.job.ID == "D" {
			t.Errorf("D, recorded done, was leased to run as a job without a record (claim first %d, later %d)", len(claimFirst), len(later))
		}
	}
	if len(claimFirst) == 1 && p.claimed(ctx, claimFirst[0]) {
		t.Errorf("D, recorded done, was handed to a worker")
	}
}
