package data

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Leases. A job without a record of its own runs under its pool's lease: one
// record per pool, under the key "_claims." + the pool's owner ID, that lists
// the jobs it runs and when the lease ends. It replaces a claim per job with
// one write per fetched batch, and it does not trust the server's delivery
// count, which the server saves only every 100ms or so.
//
// The rules, which queue.Pool keeps:
//
//  1. A job without a record runs only once it is in its pool's stored
//     lease; the first write through its prepared claim (Prepare) creates
//     its record, and from then on the record decides.
//  2. A pool adds a job to its lease only after a Check that shows the job
//     without a record and in no lease, with a write that expects the last
//     lease sequence that Check saw (WriteLease): of two pools that take
//     the same job, the second write fails and its next Check finds the
//     first.
//  3. A job that a live lease holds is not run by anyone else, unless a
//     record written through its run's prepared claim, after that lease's
//     write, says that that run is over (Snapshot.Holder). One listed
//     in a lease that ended, or as an orphan (see LeasedJob), may have run:
//     it goes into the next pool's lease as a resumed attempt, by rule 2.
//     A job without a record is never claimed with a create outside a
//     lease, which another pool's check could miss; a sweep that
//     dead-letters one takes it into its own pool's lease first, and
//     creates its record through it (AwaitDeadLetterLeased).
//  4. A pool drops a job from its lease only after the job's record is
//     stored, or keeps it as an orphan when its handler ran and no record
//     could be stored; so at any moment one of them says that the job may
//     have run.
//
// LeasePrefix is the key prefix of leases. Job keys never hold a dot (see
// Key), so none is under it.
const LeasePrefix = "_claims."

// ErrLeaseRaced: another pool wrote its lease since the Check that a lease
// write expected; check again.
var ErrLeaseRaced = errors.New("another pool's lease changed meanwhile")

// Lease is a pool's lease: the jobs it runs without a record of their own.
type Lease struct {
	Owner    string      `json:"-"` // from the key
	Revision uint64      `json:"-"` // its stream sequence
	Worker   string      `json:"worker"`
	Until    time.Time   `json:"until"`
	Jobs     []LeasedJob `json:"jobs"`
}

// LeasedJob is one job in a lease: its key and stream sequence.
type LeasedJob struct {
	Key string `json:"k"`
	Seq uint64 `json:"s"`
	// Orphan: its handler ran and its outcome could not be recorded; the
	// lease keeps it only as a sign that it may have run, as a lease that
	// ended does, not as a job that runs.
	Orphan bool `json:"o,omitempty"`
}

// Snapshot is what Check read: which jobs have a record, and every lease.
type Snapshot struct {
	Found  []bool // per job checked: it has a record
	Leases []Lease
	// LeaseSeq is the last sequence of any lease write, deletes included,
	// for WriteLease to expect; 0 if there is none.
	LeaseSeq uint64
	leased   map[string][]leaseRef
	records  map[int]foundRecord // by job index, for Holder
}

// foundRecord is a job's record as Check read it, decoded only if asked.
type foundRecord struct {
	seq  uint64
	data []byte
}

func (s *Snapshot) addRecord(i int, seq string, msg *nats.Msg) {
	s.Found[i] = true
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return // Holder then takes no lease for done, which holds the job back
	}
	if s.records == nil {
		s.records = map[int]foundRecord{}
	}
	s.records[i] = foundRecord{seq: n, data: msg.Data}
}

// Holder returns the live lease that holds job i (key) running, if any,
// preferring the one ending last; a lease whose own run of the job
// recorded its outcome after the lease's write holds it no more (see
// recordedAfter). Every lease that lists the job is looked at: another
// live one may run it while a lease that ended, rewritten since, still
// lists it.
func (s *Snapshot) Holder(i int, key string, now time.Time) (*Lease, LeasedJob, bool) {
	var found *Lease
	var job LeasedJob
	for _, ref := range s.leased[key] {
		ls := &s.Leases[ref.lease]
		if ref.job.Orphan || !now.Before(ls.Until) || s.recordedAfter(i, ls) {
			continue
		}
		if found == nil || ls.Until.After(found.Until) {
			found, job = ls, ref.job
		}
	}
	return found, job, found != nil
}

// recordedAfter reports whether job i's record was written through the
// prepared claim of its run on ls, after ls's write: that run is over (its
// outcome is recorded), and for ls the record decides (rule 1), though ls,
// not yet rewritten, still lists the job. Any other record, such as one a
// dead letter's re-drive wrote (see KeepRecord), leaves ls holding the job.
func (s *Snapshot) recordedAfter(i int, ls *Lease) bool {
	r, ok := s.records[i]
	if !ok || r.seq <= ls.Revision {
		return false
	}
	var rec struct {
		Lease string `json:"lease"`
	}
	return json.Unmarshal(r.data, &rec) == nil && rec.Lease == ls.Owner
}

type leaseRef struct {
	lease int // index in Leases
	job   LeasedJob
}

func (s *Snapshot) addLease(owner, seq string, skip bool, msg *nats.Msg) error {
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return fmt.Errorf("lease %s: bad sequence %q", owner, seq)
	}
	s.LeaseSeq = max(s.LeaseSeq, n)
	if skip || msg.Header.Get(kvOperation) != "" {
		return nil // left out, or deleted
	}
	ls := Lease{Owner: owner, Revision: n}
	if err := json.Unmarshal(msg.Data, &ls); err != nil {
		// Unreadable leases would hide jobs that may be running: the pool
		// claims nothing new until someone looks.
		return fmt.Errorf("lease %s%s: %w: %w (no pool takes new jobs while it is there; if no jobq worker wrote it, delete the key)", LeasePrefix, owner, ErrCorruptRecord, err)
	}
	if s.leased == nil {
		s.leased = map[string][]leaseRef{}
	}
	for _, j := range ls.Jobs {
		s.leased[j.Key] = append(s.leased[j.Key], leaseRef{lease: len(s.Leases), job: j})
	}
	s.Leases = append(s.Leases, ls)
	return nil
}

// Leased returns the lease that lists key and its entry there, preferring
// one that holds the job running, and of those the one ending last.
func (s *Snapshot) Leased(key string) (*Lease, LeasedJob, bool) {
	var found *Lease
	var job LeasedJob
	for _, ref := range s.leased[key] {
		ls := &s.Leases[ref.lease]
		better := found == nil || job.Orphan && !ref.job.Orphan ||
			job.Orphan == ref.job.Orphan && ls.Until.After(found.Until)
		if better {
			found, job = ls, ref.job
		}
	}
	return found, job, found != nil
}

// Holds reports whether a lease holds key running at now: listed, not as
// an orphan, in a lease that has not ended.
func (s *Snapshot) Holds(key string, now time.Time) bool {
	ls, job, ok := s.Leased(key)
	return ok && !job.Orphan && now.Before(ls.Until)
}

// kvOperation is the header of a key/value delete or purge marker.
const kvOperation = "KV-Operation"

// WriteLease stores owner's lease if the last lease write is still the one
// at sequence expect (Snapshot.LeaseSeq, or this pool's last write), and
// returns its sequence. ErrLeaseRaced means another write came first.
func (l *Ledger) WriteLease(ctx context.Context, owner string, ls Lease, expect uint64) (uint64, error) {
	if l.js == nil {
		return 0, errors.New("write lease: no connection")
	}
	b, err := json.Marshal(ls)
	if err != nil {
		return 0, err
	}
	msg := nats.NewMsg(l.prefix + LeasePrefix + owner)
	msg.Data = b
	ack, err := l.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequenceForSubject(expect, l.prefix+LeasePrefix+">"))
	if isWrongLastSeq(err) {
		return 0, fmt.Errorf("write lease: %w: %w", ErrLeaseRaced, err)
	}
	if err != nil {
		return 0, fmt.Errorf("write lease: %w", err)
	}
	return ack.Sequence, nil
}

// DeleteLease removes owner's lease, as a pool does that stops with no job
// left in it, or one that finds a lease that ended whose jobs all have
// records now (which win over it). revision > 0 deletes it only if it is
// still that write.
func (l *Ledger) DeleteLease(ctx context.Context, owner string, revision uint64) error {
	var opts []jetstream.KVDeleteOpt
	if revision > 0 {
		opts = append(opts, jetstream.LastRevision(revision))
	}
	if err := l.kv.Delete(ctx, LeasePrefix+owner, opts...); err != nil {
		return fmt.Errorf("delete lease %s: %w", owner, err)
	}
	return nil
}

// Leased reports whether a live lease, of any pool, holds job running.
func (l *Ledger) Leased(ctx context.Context, job *Job) (bool, error) {
	held, _, err := l.LeaseOf(ctx, job)
	return held, err
}

// LeaseOf reports whether a live lease, of any pool, holds job running, and
// whether any lease lists it, one that ended or as an orphan too: an
// attempt on it may have run.
func (l *Ledger) LeaseOf(ctx context.Context, job *Job) (held, listed bool, err error) {
	s, err := l.Check(ctx, []*Job{job}, "")
	if err != nil {
		return false, false, err
	}
	key := Key(job.ID)
	_, _, listed = s.Leased(key)
	return s.Holds(key, time.Now()), listed, nil
}

// ReadLeases reads every lease key by key, through the bucket's API rather
// than a batched direct get: on a bucket without direct gets its leader
// answers. A lease that cannot be read is an error, as in Check.
func (l *Ledger) ReadLeases(ctx context.Context) ([]Lease, error) {
	lister, err := l.kv.ListKeysFiltered(ctx, LeasePrefix+">")
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	defer func() {
		lister.Stop()
		go func() {
			for range lister.Keys() { // its goroutine ends once they are taken
			}
		}()
	}()
	var leases []Lease
	for key := range lister.Keys() {
		entry, err := l.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("read lease %s: %w", key, err)
		}
		ls := Lease{Owner: key[len(LeasePrefix):], Revision: entry.Revision()}
		if err := json.Unmarshal(entry.Value(), &ls); err != nil {
			return nil, fmt.Errorf("lease %s: %w: %w (it could hide a running job; if no jobq worker wrote it, delete the key)", key, ErrCorruptRecord, err)
		}
		leases = append(leases, ls)
	}
	return leases, ctx.Err()
}
