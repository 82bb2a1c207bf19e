package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
)

// StateLeased is the state LookUp gives a job that has no record and that
// a pool's lease holds: running, or fetched and waiting there for a worker;
// the lease does not tell which.
const StateLeased data.State = "leased"

// LookUp returns job id's ledger record. A first attempt runs on its pool's
// lease and has no record until it ends: for a job with none that a live
// lease holds, it returns what the lease tells (StateLeased, the pool's
// worker, the job's stream sequence, until when the lease holds it).
// data.ErrNotFound if neither; a record stored between the two reads, as
// the job ended, is read again. The leases are not read on a bucket without
// direct gets, where no pool leases jobs; one that cannot be read otherwise
// is an error: it stops every pool from leasing jobs, and this is where it
// shows.
func LookUp(ctx context.Context, obj *Objects, id string) (data.Record, error) {
	ledger := data.NewLedger(obj.Ledger, 0, obj.JS)
	defer ledger.Close()
	ledger.SetJobStreamCreated(jobStreamCreated(obj.JS))
	record := func() (data.Record, error) {
		rec, err := ledger.Get(ctx, id)
		if err != nil {
			return rec, err
		}
		// An earlier JOB's job's record is not this one's (a seq-N job
		// of a JOB made anew).
		earlier, err := ledger.Earlier(ctx, id, time.Time{}, rec) // no message at hand
		if err == nil && earlier {
			err = data.ErrNotFound
		}
		return rec, err
	}
	rec, err := record()
	if !errors.Is(err, data.ErrNotFound) {
		return rec, err
	}
	st, err := obj.Ledger.Status(ctx)
	if err != nil {
		return data.Record{}, fmt.Errorf("read bucket %s: %w", BucketProcessed, err)
	}
	if kv, ok := st.(*jetstream.KeyValueBucketStatus); ok && !kv.StreamInfo().Config.AllowDirect {
		return data.Record{}, data.ErrNotFound
	}
	snap, err := ledger.Check(ctx, []*data.Job{{ID: id}}, "")
	if err != nil {
		return data.Record{}, fmt.Errorf("no ledger record for job %q, and the pools' leases, which may hold it, cannot be read: %w", id, err)
	}
	if snap.Found[0] {
		// A record stored since the read above: the job ended meanwhile,
		// and its lease, rewritten since, may list it no more.
		if rec, err := record(); !errors.Is(err, data.ErrNotFound) {
			return rec, err
		}
	}
	ls, job, ok := snap.Leased(data.Key(id))
	if !ok || !snap.Holds(data.Key(id), time.Now()) {
		return data.Record{}, data.ErrNotFound
	}
	return data.Record{ID: id, State: StateLeased, Seq: job.Seq, Worker: ls.Worker, LeaseUntil: ls.Until}, nil
}

// ClaimLapsed reports whether rec is a running job's claim that was not
// renewed by its end, now (by this machine's clock): its worker stopped,
// lost the server, or cannot write the ledger, without recording an
// outcome. A later delivery, if one is left, runs the job again, marked
// resumed; else the sweep dead-letters it. The record says running until
// then.
func ClaimLapsed(rec data.Record, now time.Time) bool {
	return rec.State == data.StateRunning && !rec.LeaseUntil.IsZero() && now.After(rec.LeaseUntil)
}
