package data

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Sentinel errors of the ledger. Callers match them with errors.Is.
var (
	// ErrAlreadyDone: the job's completion is recorded; do not run it.
	ErrAlreadyDone = errors.New("job already done")
	// ErrClaimed: a live claim by another worker holds the job.
	ErrClaimed = errors.New("job claimed by another worker")
	// ErrClaimLost: the claim was taken over (its lease expired) or the
	// record vanished; the holder must not record an outcome.
	ErrClaimLost = errors.New("claim lost")
	// ErrDeadLettered: this very copy of the job (its stream sequence,
	// stored before the record's first attempt) was dead-lettered; its
	// removal from the stream did not happen, so it came again. Do not run
	// it: its dead letter is stored, and a re-drive is a new copy.
	ErrDeadLettered = errors.New("job already dead-lettered")
	// ErrAwaitingDeadLetter: this very copy of the job failed for good,
	// and DLQ had no room for its dead letter (see AwaitingDeadLetter). Do
	// not run it again: dead-letter it, and record that with Claim's
	// Record and Revision.
	ErrAwaitingDeadLetter = errors.New("job failed for good, its dead letter awaiting room in DLQ")
	// ErrNotFound: no record for the job ID (pending, unknown or expired).
	ErrNotFound = errors.New("no ledger record")
)

// Ledger records each job's state in the processed bucket, keyed by Key(ID).
// Every write after the claim is a compare-and-set on the claim's revision,
// so at most one worker holds a job and a worker that lost its claim cannot
// overwrite its successor. It is safe for concurrent use.
type Ledger struct {
	kv     jetstream.KeyValue
	js     jetstream.JetStream // for the async writes; nil: they wait
	prefix string              // the bucket's subject prefix, "$KV.processed."
	lease  time.Duration
	reads  reads
	writes writes
	// jobStreamCreated tells when JOB was created (nil: not asked); see
	// SetJobStreamCreated.
	jobStreamCreated func(context.Context) (time.Time, error)
}

// SetJobStreamCreated gives the ledger a way to learn when JOB, whose jobs
// it records, was created. A job published without a Nats-Msg-Id is known
// by its stream sequence (SeqID), and a JOB made anew (deleted, then
// provisioned again) numbers its jobs from 1 again: a record under such an
// ID that is older than JOB is another job's, of the JOB before, and the
// job taken for done by it would be acked unrun. It is asked only when such
// a job finds a record not held by a live claim (a redelivery, a retry), so
// that a JOB made anew while jobq runs is seen too.
func (l *Ledger) SetJobStreamCreated(f func(context.Context) (time.Time, error)) {
	l.jobStreamCreated = f
}

// Earlier reports whether rec, the record under id, is of a job of an
// earlier JOB than the one there now (see SetJobStreamCreated): not id's
// job, though it bears its name. stored is when the message of id's job at
// hand was stored, if known: a record of that very message (its StoredAt
// the same to the nanosecond) is its own, whatever the clock did since.
// Otherwise it goes by when the record's job was stored, or for a record
// without StoredAt, when it first ran, against JOB's creation: a clock set
// back past JOB's creation would make that look earlier.
func (l *Ledger) Earlier(ctx context.Context, id string, stored time.Time, rec Record) (bool, error) {
	at := rec.StoredAt
	if !at.IsZero() && at.Equal(stored) {
		return false, nil
	}
	if at.IsZero() {
		at = rec.FirstAt // a record written before StoredAt was kept
	}
	if l.jobStreamCreated == nil || !IsSeqID(id) || at.IsZero() {
		return false, nil
	}
	created, err := l.jobStreamCreated(ctx)
	if err != nil {
		return false, fmt.Errorf("job %s: tell its record from an earlier stream's: %w", id, err)
	}
	return at.Before(created), nil
}

// NewLedger returns a Ledger over kv whose claims last lease unless renewed.
// With js, ClaimAsync and DoneAsync publish without waiting for the reply;
// without, they fall back to the synchronous writes.
func NewLedger(kv jetstream.KeyValue, lease time.Duration, js jetstream.JetStream) *Ledger {
	return &Ledger{kv: kv, js: js, prefix: "$KV." + kv.Bucket() + ".", lease: lease, reads: reads{turn: make(chan struct{}, 1)}}
}

// Claim is a worker's hold on one job: valid while Revision is the record's
// latest revision.
type Claim struct {
	Key      string
	Revision uint64
	Record   Record
	// Replaced is set when the claim overwrote a record that could not be
	// read; the caller should log it.
	Replaced error
}

// Claim records that worker runs job now. It returns ErrAlreadyDone if the
// job's completion is recorded, ErrDeadLettered if this copy of it was
// dead-lettered, and ErrClaimed if another live claim holds it;
// with either, the returned Claim's Record is the existing record. A claim
// that takes over an expired one, or follows an attempt that was cut off,
// sets Record.Resumed and job.Resumed.
func (l *Ledger) Claim(ctx context.Context, job *Job, worker string) (Claim, error) {
	c := Claim{Key: Key(job.ID)}
	rec := l.newClaimRecord(job, worker)
	now := rec.StartedAt
	rev, err := l.kv.Create(ctx, c.Key, rec.encode())
	if err == nil {
		c.Revision, c.Record = rev, rec
		job.Resumed = rec.Resumed
		return c, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return c, fmt.Errorf("claim job %s: %w", job.ID, err)
	}
	for range 8 {
		entry, err := l.kv.Get(ctx, c.Key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			// Deleted or expired since Create: try to create it again.
			if rev, err := l.kv.Create(ctx, c.Key, rec.encode()); err == nil {
				c.Revision, c.Record = rev, rec
				job.Resumed = rec.Resumed
				return c, nil
			}
			continue
		}
		if err != nil {
			return c, fmt.Errorf("claim job %s: read record: %w", job.ID, err)
		}
		prev, derr := decodeRecord(entry.Value())
		next := rec
		var earlier bool
		if derr == nil && !(prev.State == StateRunning && now.Before(prev.LeaseUntil)) {
			if earlier, err = l.Earlier(ctx, job.ID, job.EnqueuedAt, prev); err != nil {
				return c, fmt.Errorf("claim job %s: %w", job.ID, err)
			}
		}
		switch {
		case derr != nil:
			c.Replaced = derr
			next.Resumed = true
		case earlier:
			// Another job's, of an earlier JOB: this job's first claim
			// takes its place, and keeps none of its times, which would
			// make this job's own records look as old.
		case prev.State == StateDone:
			c.Record = prev
			return c, ErrAlreadyDone
		case prev.State == StateRunning && now.Before(prev.LeaseUntil):
			c.Record = prev
			return c, ErrClaimed
		case prev.DeadLettered(job):
			c.Record = prev
			return c, ErrDeadLettered
		case prev.AwaitsDeadLetter(job):
			c.Record, c.Revision = prev, entry.Revision()
			return c, ErrAwaitingDeadLetter
		default:
			// An expired claim, a failed attempt, a cut-off attempt or a
			// dead-lettered job being run again.
			next.Attempts = prev.Attempts + 1
			next.Resumed = prev.State == StateRunning || prev.State == StateFailed && prev.Resumed ||
				prev.State == StateRetrying && (prev.LastError == CauseCutOff || prev.LastError == CauseLeaseLost || prev.LastError == CauseReleased && prev.Resumed)
			if !prev.FirstAt.IsZero() {
				next.FirstAt = prev.FirstAt
			}
			next.LastError = prev.LastError
		}
		rev, err := l.kv.Update(ctx, c.Key, next.encode(), entry.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // another worker moved first: look again
		}
		if err != nil {
			return c, fmt.Errorf("claim job %s: %w", job.ID, err)
		}
		c.Revision, c.Record = rev, next
		job.Resumed = next.Resumed
		return c, nil
	}
	// Not ErrClaimed: no record was seen to hold the job, and a caller
	// takes that for another run of it (and may drop this copy).
	return c, fmt.Errorf("claim job %s: its record changed under each of 8 claims; try again", job.ID)
}

// DeadLettered reports whether r, a record of job's ID that is not an
// earlier JOB's (see Earlier), says that this very copy of job was
// dead-lettered: its stream sequence, and when it was stored, to the
// nanosecond where the record keeps it (StoredAt), else no later than the
// start of the attempt that wrote the record, which ran this copy (or, for
// a record no attempt wrote, than the failure). The time tells this copy
// from a job stored under the same sequence in a stream made anew since,
// while an earlier copy ran. It is not the record's first attempt, which a
// re-drive's record keeps from its first copy: a re-drive, stored after
// it, was taken for another copy, run again and dead-lettered twice.
func (r Record) DeadLettered(job *Job) bool {
	return r.State == StateFailed && r.names(job)
}

// AwaitingDeadLetter begins the last error of a retrying record whose job
// failed for good, and whose dead letter DLQ had no room for; the cause
// follows. The job's next delivery is dead-lettered without running (see
// ErrAwaitingDeadLetter).
const AwaitingDeadLetter = "awaiting room in DLQ for its dead letter: "

// AwaitsDeadLetter reports whether r, as DeadLettered, says that this very
// copy of job failed for good and awaits room for its dead letter.
func (r Record) AwaitsDeadLetter(job *Job) bool {
	return r.State == StateRetrying && strings.HasPrefix(r.LastError, AwaitingDeadLetter) && r.names(job)
}

// names reports whether r is the record of this very copy of job, whose
// outcome it recorded: see DeadLettered.
func (r Record) names(job *Job) bool {
	switch {
	case r.Seq != job.Seq || job.EnqueuedAt.IsZero():
		return false
	case !r.StoredAt.IsZero():
		return r.StoredAt.Equal(job.EnqueuedAt)
	case !r.StartedAt.IsZero():
		return !job.EnqueuedAt.After(r.StartedAt)
	}
	return !job.EnqueuedAt.After(r.FinishedAt)
}

// newClaimRecord is the record of a first claim on job. A job delivered
// before that has no record yet had an earlier attempt that may have run its
// handler without recording an outcome (see Prepare), so this one counts as
// resumed, and its attempts are its deliveries; so does one that the caller
// marked resumed (job.Resumed), as one found in a lease that ended.
func (l *Ledger) newClaimRecord(job *Job, worker string) Record {
	now := time.Now().UTC()
	return Record{
		ID: job.ID, State: StateRunning, Subject: job.Subject, Seq: job.Seq,
		Attempts: max(job.Attempt, 1), Worker: worker, LeaseUntil: now.Add(l.lease), FirstAt: now, StartedAt: now,
		Resumed: job.Attempt > 1 || job.Resumed, StoredAt: storedAt(job),
	}
}

// storedAt is the StoredAt of job's records: when its message was stored.
// Earlier goes by it for a job known by its stream sequence alone; for
// every job it tells which copy an outcome is of (see DeadLettered), also
// a copy stored at an earlier copy's sequence in a JOB made anew, before
// that one started.
func storedAt(job *Job) time.Time {
	if job.EnqueuedAt.IsZero() {
		return time.Time{}
	}
	return job.EnqueuedAt.UTC()
}

// CauseCutOff is the last error recorded for an attempt that shutdown cut
// off; the next attempt counts as resumed.
const CauseCutOff = "attempt cut off by shutdown"

// CauseLeaseLost is the last error recorded for an attempt cut off because
// its pool's lease lapsed, the ledger taking no renewal in time; the next
// attempt counts as resumed.
const CauseLeaseLost = "attempt cut off: its pool's lease lapsed, the ledger taking no renewal in time"

// CauseReleased is the last error recorded for a claimed job that shutdown
// handed back before its handler started; the next attempt is resumed only
// if this claim was.
const CauseReleased = "released by shutdown before it started"

// Release hands back a claim whose handler never started: the record waits
// for redelivery, with the attempt not counted.
func (l *Ledger) Release(ctx context.Context, c *Claim) error {
	next := c.Record
	next.State, next.LastError = StateRetrying, CauseReleased
	next.Attempts = max(next.Attempts-1, 0)
	next.LeaseUntil = time.Time{}
	return l.updateOwn(ctx, c, next)
}

// Renew extends c's lease from now. An earlier renewal of c's that landed,
// though its answer was lost, is written over.
func (l *Ledger) Renew(ctx context.Context, c *Claim) error {
	next := c.Record
	next.LeaseUntil = time.Now().UTC().Add(l.lease)
	return l.updateOwn(ctx, c, next)
}

// updateOwn writes next over c's record, as update does, and over c's own
// renewal whose answer was lost, which a renewal's caller did not see land
// (see adoptRenewal): that is still c's claim, not another holder's.
func (l *Ledger) updateOwn(ctx context.Context, c *Claim, next Record) error {
	err := l.update(ctx, c, next)
	if !errors.Is(err, ErrClaimLost) {
		return err
	}
	if entry, gerr := l.kv.Get(ctx, c.Key); gerr != nil || !adoptRenewal(c, entry) {
		return err
	}
	return l.update(ctx, c, next)
}

// Done records the job's completion. It is final while the record lives.
func (l *Ledger) Done(ctx context.Context, c *Claim, took time.Duration) error {
	return l.finish(ctx, c, StateDone, took, "")
}

// Retry records a failed attempt that will be retried.
func (l *Ledger) Retry(ctx context.Context, c *Claim, took time.Duration, cause string) error {
	return l.finish(ctx, c, StateRetrying, took, cause)
}

// Fail records that the job was dead-lettered with its last error.
func (l *Ledger) Fail(ctx context.Context, c *Claim, took time.Duration, cause string) error {
	return l.finish(ctx, c, StateFailed, took, cause)
}

func (l *Ledger) finish(ctx context.Context, c *Claim, s State, took time.Duration, cause string) error {
	next := c.Record
	next.State, next.Took, next.LastError = s, took, cause
	next.FinishedAt = time.Now().UTC()
	next.LeaseUntil = time.Time{}
	return l.updateOwn(ctx, c, next)
}

func (l *Ledger) update(ctx context.Context, c *Claim, next Record) error {
	rev, err := l.kv.Update(ctx, c.Key, next.encode(), c.Revision)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("record job %s %s: %w: %w", next.ID, next.State, ErrClaimLost, err)
	}
	if err != nil {
		return fmt.Errorf("record job %s %s: %w", next.ID, next.State, err)
	}
	c.Revision, c.Record = rev, next
	return nil
}

// FailUnclaimed records a dead-lettered job that no worker holds, such as one
// whose deliveries ran out while jobq was down; as resumed if job.Resumed
// (an attempt may have run: a lease that ended listed it), so that its
// re-drive's run is too. A done record is left alone,
// but for another job's, of an earlier JOB (see Earlier).
func (l *Ledger) FailUnclaimed(ctx context.Context, job *Job, cause string) error {
	key := Key(job.ID)
	now := time.Now().UTC()
	for range 8 {
		rec := Record{ID: job.ID, State: StateFailed, Subject: job.Subject, Seq: job.Seq, FirstAt: now, FinishedAt: now, LastError: cause, StoredAt: storedAt(job), Resumed: job.Resumed}
		entry, err := l.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if _, err = l.kv.Create(ctx, key, rec.encode()); errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
		case err != nil:
		default:
			prev, derr := decodeRecord(entry.Value())
			if derr == nil && prev.State == StateRunning && now.Before(prev.LeaseUntil) {
				// A live claim, of another copy of the job that a
				// worker claimed since the caller looked: its holder
				// records its outcome. Written over, the claim was lost
				// while its job ran, and the job ran again.
				return nil
			}
			var earlier bool
			if derr == nil {
				if earlier, err = l.Earlier(ctx, job.ID, job.EnqueuedAt, prev); err != nil {
					return fmt.Errorf("record job %s failed: %w", job.ID, err)
				}
			}
			// Another job's record, of an earlier JOB, is written over
			// afresh (see Claim).
			if derr == nil && !earlier {
				if prev.State == StateDone {
					return nil
				}
				rec.Attempts, rec.Worker, rec.FirstAt = prev.Attempts, prev.Worker, prev.FirstAt
				// A lapsed claim's attempt may have run without recording
				// an outcome, as may one that a lease listed (job.Resumed):
				// a re-drive's run is resumed (see Claim).
				rec.Resumed = job.Resumed || prev.Resumed || prev.State == StateRunning
				if cause == "" {
					rec.LastError = prev.LastError
				}
			}
			if _, err = l.kv.Update(ctx, key, rec.encode(), entry.Revision()); errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("record job %s failed: %w", job.ID, err)
		}
		return nil
	}
	return fmt.Errorf("record job %s failed: record keeps changing", job.ID)
}

// AwaitDeadLetter records that job, whose deliveries ran out with no live
// claim on it, awaits its dead letter (see AwaitingDeadLetter), with cause
// as its last error, before the caller stores that dead letter: a
// compare-and-set on the record it read, or a create where there was none.
// A worker that still holds a delivery of this copy of the job, and claims
// it, then either wins (its claim came first: AwaitDeadLetter returns
// ErrClaimed, and the job is left to it) or finds the job awaiting its
// dead letter and does not run it (see ErrAwaitingDeadLetter). Dead-lettered
// first and recorded failed after, the job was run by such a worker and was
// in DLQ as well. It returns ErrAlreadyDone and ErrDeadLettered as Claim
// does, and the job's record as Claim's Record; a record of another job, of
// an earlier JOB (see Earlier), is written over. Once the dead letter is
// stored, the caller records the job failed with Fail on the returned Claim.
func (l *Ledger) AwaitDeadLetter(ctx context.Context, job *Job, cause string) (Claim, error) {
	c := Claim{Key: Key(job.ID)}
	for range 8 {
		now := time.Now().UTC()
		rec := awaitingRecord(job, cause, now)
		entry, err := l.kv.Get(ctx, c.Key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			rev, err := l.kv.Create(ctx, c.Key, rec.encode())
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // a worker claimed it meanwhile: look again
			}
			if err != nil {
				return c, fmt.Errorf("record job %s awaiting its dead letter: %w", job.ID, err)
			}
			c.Revision, c.Record = rev, rec
			return c, nil
		case err != nil:
			return c, fmt.Errorf("record job %s awaiting its dead letter: read record: %w", job.ID, err)
		}
		prev, derr := decodeRecord(entry.Value())
		var earlier bool
		if derr == nil {
			if prev.State == StateRunning && now.Before(prev.LeaseUntil) {
				c.Record = prev
				return c, ErrClaimed
			}
			if earlier, err = l.Earlier(ctx, job.ID, job.EnqueuedAt, prev); err != nil {
				return c, fmt.Errorf("record job %s awaiting its dead letter: %w", job.ID, err)
			}
		}
		if derr == nil && !earlier {
			switch {
			case prev.State == StateDone:
				c.Record = prev
				return c, ErrAlreadyDone
			case prev.DeadLettered(job):
				c.Record = prev
				return c, ErrDeadLettered
			case prev.AwaitsDeadLetter(job):
				c.Revision, c.Record = entry.Revision(), prev
				return c, nil
			}
			// As FailUnclaimed: a lapsed claim's attempt, or one that a
			// lease listed, may have run without recording an outcome.
			rec.Attempts, rec.Worker, rec.FirstAt = prev.Attempts, prev.Worker, prev.FirstAt
			rec.Resumed = job.Resumed || prev.Resumed || prev.State == StateRunning
		}
		rev, err := l.kv.Update(ctx, c.Key, rec.encode(), entry.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // a worker claimed it meanwhile: look again
		}
		if err != nil {
			return c, fmt.Errorf("record job %s awaiting its dead letter: %w", job.ID, err)
		}
		c.Revision, c.Record = rev, rec
		return c, nil
	}
	return c, fmt.Errorf("record job %s awaiting its dead letter: its record keeps changing", job.ID)
}

// AwaitDeadLetterLeased is AwaitDeadLetter for a job without a record that
// the caller's pool holds in its lease, lease (see Leases): the record is
// created as a run on the lease creates it, through its prepared claim
// (see Prepare), so that the lease holds the job until the record decides.
// ErrClaimLost means that a record came first, which decides. Once the dead
// letter is stored, the caller records the job failed with Fail on the
// returned Claim.
func (l *Ledger) AwaitDeadLetterLeased(ctx context.Context, job *Job, lease, cause string) (Claim, error) {
	c := Claim{Key: Key(job.ID), Record: awaitingRecord(job, cause, time.Now().UTC())}
	c.Record.Lease = lease
	rev, err := l.kv.Create(ctx, c.Key, c.Record.encode())
	if errors.Is(err, jetstream.ErrKeyExists) {
		return c, fmt.Errorf("record job %s awaiting its dead letter: %w: %w", job.ID, ErrClaimLost, err)
	}
	if err != nil {
		return c, fmt.Errorf("record job %s awaiting its dead letter: %w", job.ID, err)
	}
	c.Revision = rev
	return c, nil
}

// awaitingRecord is the record that says that job awaits its dead letter,
// with cause as its last error.
func awaitingRecord(job *Job, cause string, now time.Time) Record {
	return Record{ID: job.ID, State: StateRetrying, Subject: job.Subject, Seq: job.Seq, FirstAt: now, FinishedAt: now, LastError: AwaitingDeadLetter + cause, StoredAt: storedAt(job), Resumed: job.Resumed}
}

// KeepRecord makes sure job has a record before a copy of it is published
// again, as a dead letter's re-drive is: with none (it expired, or was never
// written) it creates one, failed with cause; a record there is kept as it
// is. A copy of the job that runs meanwhile then finds a record, so it is
// claimed before it runs (see Prepare). A job that a live lease holds gets
// none: the copy running on it writes its record, and the re-driven copy
// finds the lease. leases says whether the pools on the bucket take leases
// (a bucket that cannot be read in batches has none); if they do, a failed
// read of the leases fails, since a lease could hold the job.
func (l *Ledger) KeepRecord(ctx context.Context, job *Job, cause string, leases bool) error {
	if leases {
		held, err := l.Leased(ctx, job)
		if err != nil {
			return fmt.Errorf("record job %s: cannot tell whether a pool runs it: %w", job.ID, err)
		}
		if held {
			return nil
		}
	}
	now := time.Now().UTC()
	rec := Record{ID: job.ID, State: StateFailed, Subject: job.Subject, Seq: job.Seq, FirstAt: now, FinishedAt: now, LastError: cause}
	if _, err := l.kv.Create(ctx, Key(job.ID), rec.encode()); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("record job %s: %w", job.ID, err)
	}
	return nil
}

// Get returns job id's record, ErrNotFound if there is none, or an error
// wrapping ErrCorruptRecord.
func (l *Ledger) Get(ctx context.Context, id string) (Record, error) {
	entry, err := l.kv.Get(ctx, Key(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{}, fmt.Errorf("job %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("read job %s: %w", id, err)
	}
	rec, err := decodeRecord(entry.Value())
	if err != nil {
		return Record{}, fmt.Errorf("read job %s: %w", id, err)
	}
	return rec, nil
}
