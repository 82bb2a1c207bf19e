package queue_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// LookUp reads a job's record, and, finding none, the pools' leases. A job
// that a lease held at the first read and that ended before the second
// (its record stored, then its lease rewritten without it) was in neither:
// jobq job said "no ledger record for job …: it is pending, unknown, or its
// record expired" of a job that was done, and exited 1. The job's record,
// which the lease read finds, is read again.
func TestLookUpOfAJobThatEndsBetweenItsReads(t *testing.T) {
	t.Parallel()
	srv := servertest.StartListening(t)
	b := setupOn(t, srv, queue.Config{})
	ctx := context.Background()
	l := data.NewLedger(b.obj.Ledger, time.Minute, b.js)
	defer l.Close()
	job := &data.Job{ID: "ending", Subject: "job.e", Seq: 1, Attempt: 1}
	lease := data.Lease{Worker: "pool-1", Until: time.Now().Add(time.Minute).UTC(), Jobs: []data.LeasedJob{{Key: data.Key(job.ID), Seq: job.Seq}}}
	rev, err := l.WriteLease(ctx, "pool-1", lease, 0)
	if err != nil {
		t.Fatal(err)
	}
	// As LookUp reads the leases, the job ends: the write through its
	// prepared claim stores its record, and the pool's next lease write
	// leaves it out.
	px := servertest.NewProxy(t, srv.ClientURL()[len("nats://"):])
	var once sync.Once
	px.Watch(func(chunk []byte) bool {
		if bytes.Contains(chunk, []byte("multi_last")) {
			once.Do(func() {
				c := l.Prepare(job, "pool-1", "pool-1")
				if err := l.Done(ctx, &c, time.Millisecond); err != nil {
					t.Errorf("store the job's record: %v", err)
				}
				lease.Jobs = nil
				if _, err := l.WriteLease(ctx, "pool-1", lease, rev); err != nil {
					t.Errorf("rewrite the lease: %v", err)
				}
			})
		}
		return true
	}, nil)
	_, js := connectThrough(t, px)
	obj, err := queue.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := queue.LookUp(ctx, obj, job.ID)
	if err != nil || rec.State != data.StateDone {
		t.Errorf("LookUp of a job that ended between its reads: got %+v, %v; want its done record", rec, err)
	}
}
