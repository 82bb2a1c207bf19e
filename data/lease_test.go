package data_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
)

// Two pools that checked the same jobs at the same moment cannot both
// lease them: each write expects the last lease write its check saw, so
// the second fails, and its next check finds the first pool's lease.
func TestLeaseWritesExpectTheLastLeaseOfAnyPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLedgerJS(t)
	jobs := []*data.Job{{ID: "a", Seq: 1, Attempt: 1}, {ID: "b c", Seq: 2, Attempt: 1}}
	entries := []data.LeasedJob{{Key: data.Key("a"), Seq: 1}, {Key: data.Key("b c"), Seq: 2}}
	until := time.Now().Add(time.Minute).UTC()

	p, err := l.Check(ctx, jobs, "p")
	if err != nil {
		t.Fatal(err)
	}
	q, err := l.Check(ctx, jobs, "q")
	if err != nil {
		t.Fatal(err)
	}
	if p.LeaseSeq != 0 || len(p.Leases) != 0 {
		t.Fatalf("empty bucket: got %+v, want no lease", p)
	}
	seq, err := l.WriteLease(ctx, "p", data.Lease{Worker: "wp", Until: until, Jobs: entries}, p.LeaseSeq)
	if err != nil {
		t.Fatalf("first lease: %v", err)
	}
	if _, err := l.WriteLease(ctx, "q", data.Lease{Worker: "wq", Until: until, Jobs: entries}, q.LeaseSeq); !errors.Is(err, data.ErrLeaseRaced) {
		t.Fatalf("second lease on the same check: got %v, want ErrLeaseRaced", err)
	}
	q, err = l.Check(ctx, jobs, "q")
	if err != nil {
		t.Fatal(err)
	}
	if q.LeaseSeq != seq || len(q.Leases) != 1 {
		t.Fatalf("check after the race: got %+v, want p's lease at %d", q, seq)
	}
	for _, e := range entries {
		ls, j, ok := q.Leased(e.Key)
		if !ok || ls.Owner != "p" || ls.Worker != "wp" || j != e || !ls.Until.Equal(until) || ls.Revision != seq {
			t.Errorf("leased %s: got %+v, %+v, %v; want p's lease, %+v", e.Key, ls, j, ok, e)
		}
		if !q.Holds(e.Key, time.Now()) || q.Holds(e.Key, until) {
			t.Errorf("holds %s: want held before the lease ends, not after", e.Key)
		}
	}
	if _, _, ok := q.Leased("other"); ok || q.Holds("other", time.Now()) {
		t.Error("leased other: got a lease, want none")
	}
	// A pool's own lease is left out of its check, but counts for the
	// next write's expectation.
	own, err := l.Check(ctx, jobs, "p")
	if err != nil || len(own.Leases) != 0 || own.LeaseSeq != seq {
		t.Fatalf("p's own check: got %+v, %v; want no lease, last sequence %d", own, err, seq)
	}

	// Renewing (the pool's own last write) and deleting count as lease
	// writes too.
	seq2, err := l.WriteLease(ctx, "p", data.Lease{Worker: "wp", Until: until.Add(time.Minute)}, seq)
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	if _, err := l.WriteLease(ctx, "q", data.Lease{Worker: "wq", Until: until, Jobs: entries}, seq); !errors.Is(err, data.ErrLeaseRaced) {
		t.Fatalf("lease expecting the write before a renewal: got %v, want ErrLeaseRaced", err)
	}
	if err := l.DeleteLease(ctx, "p", seq); err == nil {
		t.Fatal("delete of an older revision: got nil, want an error")
	}
	if err := l.DeleteLease(ctx, "p", seq2); err != nil {
		t.Fatalf("delete: %v", err)
	}
	after, err := l.Check(ctx, jobs, "q")
	if err != nil || len(after.Leases) != 0 || after.LeaseSeq <= seq2 {
		t.Fatalf("check after the delete: got %+v, %v; want no lease, a last sequence past %d", after, err, seq2)
	}
	if _, err := l.WriteLease(ctx, "q", data.Lease{Worker: "wq", Until: until, Jobs: entries}, after.LeaseSeq); err != nil {
		t.Fatalf("lease after the delete: %v", err)
	}
}

// A lease's jobs are settled once each has a record of its own, which wins
// over the lease.
func TestLeaseSettledOnceEveryJobHasARecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLedgerJS(t)
	ls := &data.Lease{Jobs: []data.LeasedJob{{Key: data.Key("s-1"), Seq: 1}, {Key: data.Key("s 2"), Seq: 2}}}
	for i, id := range []string{"s-1", "s 2"} {
		if settled, err := l.Settled(ctx, ls); err != nil || settled {
			t.Fatalf("with %d of 2 records: got %v, %v; want not settled", i, settled, err)
		}
		job := &data.Job{ID: id, Seq: uint64(i + 1), Attempt: 1}
		c := l.Prepare(job, "w", ls.Owner)
		if err := l.Done(ctx, &c, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if settled, err := l.Settled(ctx, ls); err != nil || !settled {
		t.Fatalf("with every record: got %v, %v; want settled", settled, err)
	}
}

// ledgerWithUnreadableLease returns a ledger whose bucket holds a lease
// that is not jobq's.
func ledgerWithUnreadableLease(t *testing.T) *data.Ledger {
	t.Helper()
	js, kv := newBucket(t)
	l := data.NewLedger(kv, time.Minute, js)
	t.Cleanup(l.Close)
	if _, err := kv.Put(context.Background(), data.LeasePrefix+"x", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	return l
}

// An unreadable lease could hide a running job: the check fails rather
// than take it for none.
func TestLeaseUnreadableFailsTheCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := ledgerWithUnreadableLease(t)
	if _, err := l.Check(ctx, []*data.Job{{ID: "a", Seq: 1, Attempt: 1}}, "p"); !errors.Is(err, data.ErrCorruptRecord) {
		t.Fatalf("check: got %v, want ErrCorruptRecord", err)
	}
}

// An orphan in a lease (a job whose handler ran and whose outcome could not
// be recorded) is a sign that the job may have run, not a job that runs: a
// lease that lists it does not hold it.
func TestLeaseOrphanIsNotHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLedgerJS(t)
	until := time.Now().Add(time.Minute).UTC()
	ls := data.Lease{Worker: "w", Until: until, Jobs: []data.LeasedJob{{Key: "run", Seq: 1}, {Key: "orphan", Seq: 2, Orphan: true}}}
	if _, err := l.WriteLease(ctx, "p", ls, 0); err != nil {
		t.Fatal(err)
	}
	s, err := l.Check(ctx, nil, "q")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Holds("run", time.Now()) || s.Holds("orphan", time.Now()) {
		t.Errorf("holds: run %v, orphan %v; want true, false", s.Holds("run", time.Now()), s.Holds("orphan", time.Now()))
	}
	if _, j, ok := s.Leased("orphan"); !ok || !j.Orphan {
		t.Errorf("leased orphan: got %+v, %v; want listed as an orphan", j, ok)
	}
	for id, want := range map[string]bool{"run": true, "orphan": false} {
		if held, err := l.Leased(ctx, &data.Job{ID: id}); err != nil || held != want {
			t.Errorf("ledger leased %s: got %v, %v; want %v", id, held, err, want)
		}
	}
}

// Recorded reads any number of keys, beyond the 1024 records one batched
// read may return, as a large lease that ended needs when every job in it
// is recorded.
func TestLedgerRecordedReadsBeyondOneBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLedgerJS(t)
	keys := make([]string, 1100)
	for i := range keys {
		keys[i] = fmt.Sprintf("k-%d", i)
	}
	for i, key := range keys {
		if i == 3 {
			continue
		}
		c := l.Prepare(&data.Job{ID: key, Seq: uint64(i + 1), Attempt: 1}, "w", "")
		if err := l.Done(ctx, &c, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	found, err := l.Recorded(ctx, keys)
	if err != nil || len(found) != len(keys) {
		t.Fatalf("recorded: got %d answers, %v; want %d", len(found), err, len(keys))
	}
	for i, f := range found {
		if f != (i != 3) {
			t.Errorf("recorded %s: got %v", keys[i], f)
		}
	}
}

// A check still answers when the leases and the jobs together are more
// than one batched read returns (1024 found): it reads the leases first, then
// the records. More leases than one read returns is an error that says
// what to do, not a check that finds none.
func TestLeaseCheckWithManyLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLedgerJS(t)
	until := time.Now().Add(time.Minute).UTC()
	jobs := make([]*data.Job, 100)
	for i := range jobs {
		jobs[i] = &data.Job{ID: fmt.Sprintf("j-%d", i), Seq: uint64(i + 1), Attempt: 1}
	}
	for _, job := range jobs[:50] { // with the leases, more than 1024 found
		c := l.Prepare(job, "w", "")
		if err := l.Done(ctx, &c, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	var last uint64
	writeLeases := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			ls := data.Lease{Worker: "w", Until: until}
			if i == 0 {
				ls.Jobs = []data.LeasedJob{{Key: data.Key("j-53"), Seq: 54}}
			}
			seq, err := l.WriteLease(ctx, fmt.Sprintf("p%d", i), ls, last)
			if err != nil {
				t.Fatalf("lease %d: %v", i, err)
			}
			last = seq
		}
	}
	writeLeases(0, 1000)

	snap, err := l.Check(ctx, jobs, "p1")
	if err != nil {
		t.Fatalf("check, 1000 leases and 100 jobs: %v", err)
	}
	if len(snap.Leases) != 999 || snap.LeaseSeq != last {
		t.Errorf("leases: got %d, last at %d; want 999 (all but mine), last at %d", len(snap.Leases), snap.LeaseSeq, last)
	}
	if !snap.Holds(data.Key("j-53"), time.Now()) || snap.Holds(data.Key("j-54"), time.Now()) {
		t.Error("holds: want j-53 held by lease p0, j-54 not")
	}
	for i, f := range snap.Found {
		if f != (i < 50) {
			t.Errorf("found %s: got %v", jobs[i].ID, f)
		}
	}

	writeLeases(1000, 1030)
	_, err = l.Check(ctx, jobs, "p1")
	if err == nil || !strings.Contains(err.Error(), "more than 1024") || !strings.Contains(err.Error(), "delete the keys _claims.*") {
		t.Fatalf("check, 1030 leases: got %v, want an error that says there are too many leases and what to do", err)
	}
}

// KeepRecord, before a dead letter's re-drive, writes no record while it
// cannot read the leases that pools take: one could hold the job, whose
// running copy writes the record. Where pools take no leases, it does not
// look.
func TestKeepRecordFailsWhenTheLeasesCannotBeRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := ledgerWithUnreadableLease(t)
	job := &data.Job{ID: "k", Subject: "job.k", Seq: 1}
	err := l.KeepRecord(ctx, job, "boom", true)
	if err == nil || !strings.Contains(err.Error(), "cannot tell whether a pool runs it") {
		t.Fatalf("keep record, leases unreadable: got %v, want an error", err)
	}
	if _, err := l.Get(ctx, "k"); !errors.Is(err, data.ErrNotFound) {
		t.Fatalf("record after the failed keep: got %v, want none", err)
	}
	if err := l.KeepRecord(ctx, job, "boom", false); err != nil {
		t.Fatalf("keep record without leases: %v", err)
	}
	if rec, err := l.Get(ctx, "k"); err != nil || rec.State != data.StateFailed {
		t.Fatalf("record: got %+v, %v; want failed", rec, err)
	}
}
