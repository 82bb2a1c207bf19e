package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/jobq/jobq/data"
)

// lease is the pool's lease in the ledger (see data's Leases): the jobs it
// runs without a record of their own, written once per fetched batch and
// renewed by the heartbeat loop, not once per job.
type lease struct {
	owner string

	// mu serialises the lease's writes and guards the rest.
	mu    sync.Mutex
	jobs  map[string]*leased // by key: in the stored lease, or going in
	size  int                // about the bytes jobs take in the record (see fit)
	last  uint64             // the sequence of this pool's last lease write
	seen  uint64             // the highest check sequence a write rested on (see add)
	until time.Time          // when the stored lease ends
	sent  time.Time          // when the last lease written ends, if stored (see letGo)
	wrote time.Time          // when it was last written
	dirty bool               // jobs dropped since the last write
	// closed: the pool stopped and deleted the lease, which no renewal
	// writes again.
	closed bool
	// gen counts the jobs dropped from the lease; dropped holds when each
	// key was, for the checks made before (see sortBatch).
	gen     uint64
	dropped map[string]uint64
	toks    uint64 // the last leased.tok given
	max     int    // the most bytes jobs take in the record (see fit)
}

// leased is one job in the pool's lease.
type leased struct {
	seq uint64
	// tok names the delivery that the entry was leased for (its
	// inflight's leaseTok): a redelivery of the same message has the same
	// seq, and its entry is not the first delivery's to touch.
	tok uint64
	// finishing: its handler returned; its outcome is on its way to the
	// ledger, or, if the job failed for good, to DLQ first.
	finishing bool
	// orphan: its handler ran and its outcome could not be recorded. It
	// stays in the lease, marked as an orphan, until a record for it is
	// stored (see dropRecorded), so that the next attempt, here or in
	// another pool, is leased as a resumed one; or, if no record comes,
	// for as long as a record would have said so (ProcessedTTL from
	// orphanedAt). An orphan holds nothing back.
	orphan     bool
	orphanedAt time.Time
}

func newLease() *lease {
	return &lease{owner: nuid.Next(), jobs: map[string]*leased{}, dropped: map[string]uint64{}, max: maxLeaseBytes}
}

// admitBatch decides how each job fetched together runs (see data's Leases
// for the rules):
//
//   - a job that a live lease holds, this pool's or another's, is released
//     until that lease ends, or acked if it is a second copy of the leased
//     job;
//   - a job with a record is claimed first;
//   - the rest go into the pool's lease, in one write, and run on prepared
//     claims that their outcome's write turns into records; as resumed
//     attempts if a lease that ended, or an orphan, lists them, since an
//     earlier attempt may have run.
//
// c holds the batch and the ledger check made for it, which may be older
// than the pool's last lease write (see checkBatches). It returns the jobs
// that run on the lease, those to claim first, and those to check again:
// one that left the pool's lease after the check, whose record the check
// may not show, and those the lease has no room for. A failed read or
// write is retried until ctx ends; the jobs wait, with heartbeats, and
// then go back to JOB.
func (p *Pool) admitBatch(ctx context.Context, c checked) (leased, claimFirst, later []*inflight) {
	backoff := 50 * time.Millisecond
	batch, snap, err, gen := c.batch, c.snap, c.err, c.gen
	halt := p.halt
	for {
		n := len(batch)
		if batch = p.handBackAtStop(batch); len(batch) == 0 {
			return nil, claimFirst, later
		}
		if err == nil && len(batch) != n {
			// The check tells each job by its place in the batch as
			// checked (snap.Found, Holder): those that run still are
			// checked again on their own.
			gen = p.lease.generation()
			snap, err = p.check(ctx, batch)
		}
		if err == nil {
			var first, again []*inflight
			batch, first, again = p.sortBatch(snap, gen, batch)
			claimFirst, later = append(claimFirst, first...), append(later, again...)
			batch, again = p.lease.fit(batch)
			later = append(later, again...)
			if len(batch) == 0 {
				return nil, claimFirst, later
			}
			opCtx, cancel := context.WithTimeout(ctx, opTimeout)
			err = p.lease.add(opCtx, p, batch, snap.LeaseSeq, gen)
			cancel()
			if err == nil {
				batch, first, again = p.recheckTakenOver(ctx, batch)
				claimFirst, later = append(claimFirst, first...), append(later, again...)
				for _, it := range batch {
					it.mu.Lock() // the heartbeat loop may look at it already
					it.claim, it.unclaimed = p.ledger.Prepare(it.job, p.cfg.WorkerName, p.lease.owner), true
					it.mu.Unlock()
				}
				return batch, claimFirst, later
			}
		}
		if !errors.Is(err, data.ErrLeaseRaced) { // else another pool's write came first: check again
			p.log.Warn().Err(err).Int("jobs", len(batch)).Dur("retry_in", backoff).Msg("ledger check before running jobs failed: retrying")
			select {
			case <-time.After(backoff):
				backoff = min(2*backoff, 5*time.Second)
			case <-halt: // Stop began: those that do not run still go back
				halt = nil
				continue
			case <-ctx.Done():
				for _, it := range batch {
					p.handBack(it, "shutdown before the job's ledger check")
				}
				return nil, claimFirst, later
			}
		}
		gen = p.lease.generation()
		snap, err = p.check(ctx, batch)
	}
}

// recheckTakenOver reads again, once they are in the pool's stored lease,
// the records of the jobs of batch taken over from a lease that ended or
// from an orphan (job.Resumed, see sortBatch). The run on that lease may
// store its outcome late (a handler that returned after its lease was
// lost, a write that landed after its answer timed out): a record created
// outside any live lease, after this pool's check. Another pool's check
// then finds the record and no live lease, and claims the job, while this
// pool's lease write, which expects only the last lease write, succeeds:
// both would run it. Read after the lease write, such a record is seen;
// one stored after it finds this lease live in every other pool's check.
// A job that has a record now leaves the lease (it has not run here) and
// is claimed first; one whose record cannot be read leaves it too, to be
// checked again.
func (p *Pool) recheckTakenOver(ctx context.Context, batch []*inflight) (run, claimFirst, later []*inflight) {
	var keys []string
	for _, it := range batch {
		if it.job.Resumed {
			keys = append(keys, data.Key(it.job.ID))
		}
	}
	if len(keys) == 0 {
		return batch, nil, nil
	}
	opCtx, cancel := context.WithTimeout(ctx, opTimeout)
	found, err := p.ledger.Recorded(opCtx, keys)
	cancel()
	run = make([]*inflight, 0, len(batch))
	i := 0
	for _, it := range batch {
		if !it.job.Resumed {
			run = append(run, it)
			continue
		}
		key := keys[i]
		i++
		switch {
		case err != nil:
			p.lease.done(key, it, false)
			later = append(later, it)
		case found[i-1]:
			p.lease.done(key, it, false)
			claimFirst = append(claimFirst, it)
		default:
			run = append(run, it)
		}
	}
	if err != nil {
		p.log.Warn().Err(err).Int("jobs", len(later)).Msg("read again the records of jobs taken over from a lease that ended: checking them again")
	}
	return run, claimFirst, later
}

// admitAll admits c's jobs, checking again those admitBatch leaves for
// later until none is left, and passes each on with pass.
func (p *Pool) admitAll(ctx context.Context, c checked, pass func(it *inflight, leased bool)) {
	for {
		leased, first, later := p.admitBatch(ctx, c)
		for _, it := range leased {
			pass(it, true)
		}
		for _, it := range first {
			pass(it, false)
		}
		if later = p.handBackAtStop(later); len(later) == 0 {
			return
		}
		select {
		case <-time.After(10 * time.Millisecond): // room in the lease, or the record settled
		case <-ctx.Done():
			for _, it := range later {
				p.handBack(it, "shutdown before the job's ledger check")
			}
			return
		}
		c.batch, c.gen = later, p.lease.generation()
		c.snap, c.err = p.check(ctx, later)
	}
}

// checked is a fetched batch and the ledger check made for it.
type checked struct {
	batch []*inflight
	snap  *data.Snapshot
	err   error
	gen   uint64 // the lease's drop count before the check
}

// checkBatches reads the ledger for each batch of fetched jobs, up to
// checkBatch at a time, one batch ahead of admitBatch, so that the read of
// one batch overlaps the lease write of the one before. That is safe
// because the checks are made one after the other (see lease.add).
//
// The jobs leased this way are not counted against claimAhead: bounding
// them to 16 per worker cost a sixth of the end-to-end rate in jobq bench
// (interleaved sets). So a pool that is killed leaves up to Workers +
// Prefetch leased jobs that never started; they come back as resumed
// attempts.
func (p *Pool) checkBatches(ctx context.Context, out chan<- checked) {
	defer close(out)
	for it := range p.fetched {
		batch := make([]*inflight, 1, checkBatch)
		batch[0] = it
	more:
		for len(batch) < checkBatch {
			select {
			case it, ok := <-p.fetched:
				if !ok {
					break more
				}
				batch = append(batch, it)
			default:
				break more
			}
		}
		// Once Stop began, only the jobs that run still are checked.
		if batch = p.handBackAtStop(batch); len(batch) == 0 {
			continue
		}
		gen := p.lease.generation()
		snap, err := p.check(ctx, batch)
		out <- checked{batch: batch, snap: snap, err: err, gen: gen}
	}
}

// check reads the records of batch's jobs and every lease.
func (p *Pool) check(ctx context.Context, batch []*inflight) (*data.Snapshot, error) {
	jobs := make([]*data.Job, len(batch))
	for i, it := range batch {
		jobs[i] = it.job
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return p.ledger.Check(ctx, jobs, p.lease.owner)
}

// sortBatch hands back the jobs that a live lease holds, by snap, and
// returns the jobs that go into the pool's lease, those to claim first and
// those to check again. snap leaves out the pool's own lease, which the
// pool knows better; but a job that left it after the check (gen: the
// drops before it) has a record that snap may not show, or is an orphan
// whose time ran out, so it is checked again.
func (p *Pool) sortBatch(snap *data.Snapshot, gen uint64, batch []*inflight) (take, claimFirst, later []*inflight) {
	now := time.Now()
	take = make([]*inflight, 0, len(batch))
	taking := make(map[string]uint64, len(batch))
	for i, it := range batch {
		key := data.Key(it.job.ID)
		if seq, ok := taking[key]; ok {
			p.leasedElsewhere(it, seq, now.Add(p.cfg.lease()), true)
			continue
		}
		mine, held, until := p.lease.find(key)
		orphan := held && mine.orphan
		_, _, listed := snap.Leased(key)
		holder, holding, heldElsewhere := snap.Holder(i, key, now)
		switch {
		case held && !orphan && mine.finishing && redriven(it.job):
			// Maybe the re-drive of this very run's dead letter, whose
			// run leaves the lease in a moment: look again then.
			p.leasedElsewhere(it, mine.seq, now, false)
		case held && !orphan:
			p.leasedElsewhere(it, mine.seq, until, true)
		case heldElsewhere:
			// Another pool's run cannot be told finishing: a re-drive
			// waits for the lease to end. Once that run recorded its
			// outcome, as a retry does before it is released, the record
			// decides, though the lease still lists it (see Holder).
			p.leasedElsewhere(it, holding.Seq, holder.Until, !redriven(it.job))
		case snap.Found[i]:
			claimFirst = append(claimFirst, it)
		case !held && p.lease.droppedSince(key, gen):
			later = append(later, it)
		default:
			if listed || orphan {
				// An earlier attempt may have run its handler.
				it.job.Resumed = true
			}
			taking[key] = it.job.Seq
			take = append(take, it)
		}
	}
	return take, claimFirst, later
}

// leasedElsewhere hands back a job that a lease holds until until: released
// until then, or, if mayDrop, acked if it is a second copy of the leased
// job, which stays in JOB until its outcome is recorded. A re-driven dead
// letter may not be dropped once the leased run may be over: that run may
// be the one whose dead letter it is, its lease not yet rewritten.
func (p *Pool) leasedElsewhere(it *inflight, runningSeq uint64, until time.Time, mayDrop bool) {
	p.beats.remove(it)
	log := *p.jobLog(it.job)
	if runningSeq != it.job.Seq && mayDrop {
		p.cfg.Metrics.jobSkipped(it.job.Subject)
		log := log.With().Uint64("running_seq", runningSeq).Logger()
		if p.ack(context.Background(), it.msg, log) == nil { // else it says why not
			log.Warn().Msg("duplicate of a running job: acked without running")
		}
	} else {
		delay := time.Until(until) + time.Second
		log.Warn().Dur("retry_in", delay).Msg("job redelivered while a lease holds it: released")
		p.nak(it.msg, delay, log)
	}
	p.release(it)
}

// handBack releases a fetched job that never ran, at once.
func (p *Pool) handBack(it *inflight, why string) {
	p.beats.remove(it)
	log := *p.jobLog(it.job)
	log.Info().Msg(why + ": released")
	p.nak(it.msg, 0, log)
	p.release(it)
}

// redriven reports a copy published by dlq retry, under Jobq-Job-Id.
func redriven(job *data.Job) bool {
	return job.Header != nil && nats.Header(job.Header).Get(HeaderJobID) != ""
}

// find returns a copy of key's entry in the lease, whether there is one,
// and the lease's end.
func (l *lease) find(key string) (leased, bool, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if j := l.jobs[key]; j != nil {
		return *j, true, l.until
	}
	return leased{}, false, l.until
}

// maxLeaseBytes bounds a lease record, well under nats-server's default
// max payload (1 MiB): with a large --prefetch and long job IDs, the jobs
// that do not fit wait for room (see admitAll), rather than fail every
// write. A server that takes less (jobq serve --max-payload) bounds it to
// half its max payload (see leaseBytes).
const maxLeaseBytes = 256 << 10

// leaseBytes is the most bytes a lease record's jobs take on a server
// whose max payload is maxPayload.
func leaseBytes(maxPayload int64) int {
	return int(min(maxLeaseBytes, maxPayload/2))
}

// leasedJobBytes is about what one job adds to the lease record, besides
// its key.
const leasedJobBytes = 32

// fit returns the jobs of batch that fit in the lease, in order, and the
// rest.
func (l *lease) fit(batch []*inflight) (fits, rest []*inflight) {
	l.mu.Lock()
	size := l.size
	l.mu.Unlock()
	for i, it := range batch {
		if size += len(data.Key(it.job.ID)) + leasedJobBytes; size > l.max {
			return batch[:i], batch[i:]
		}
	}
	return batch, nil
}

// add writes the lease with batch's jobs in it. checked is the last lease
// sequence of the check that found them free, gen the lease's drop count
// before that check. The write expects checked, or this pool's own last
// write if that came later, and its success means that no other pool
// wrote a lease the check did not see:
//
//   - every write of this pool expects either the last sequence of a check
//     (kept in seen, the highest) or this pool's write before it, so since
//     the last check it was based on, no other pool wrote a lease;
//   - a check older than seen may have missed a lease that a later check,
//     made by a renewal or a retry, saw: add refuses it with ErrLeaseRaced,
//     so the caller checks again.
//
// This pool's own adds, the sweep's (see leaseForDeadLetter) and
// admitBatch's, run side by side, and neither the expected sequence nor
// seen tells them apart: a job another of them put in the lease since the
// caller looked (find), or that left it after gen (its record may be
// newer than the check), is refused with ErrLeaseRaced too.
func (l *lease) add(ctx context.Context, p *Pool, batch []*inflight, checked, gen uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("the pool stopped and deleted its lease")
	}
	if checked < l.seen {
		return fmt.Errorf("%w: checked at lease write %d, before %d", data.ErrLeaseRaced, checked, l.seen)
	}
	for _, it := range batch {
		key := data.Key(it.job.ID)
		if j := l.jobs[key]; j != nil && !j.orphan || l.dropped[key] > gen {
			return fmt.Errorf("%w: job %s entered or left this pool's lease since its check", data.ErrLeaseRaced, it.job.ID)
		}
	}
	l.giveUpIfLapsed(p, errors.New("the lease was not renewed in time"))
	expect := max(checked, l.last)
	extra := make([]data.LeasedJob, len(batch))
	for i, it := range batch {
		extra[i] = data.LeasedJob{Key: data.Key(it.job.ID), Seq: it.job.Seq}
	}
	// The lease's renewal waits for this write: it may not hang past the
	// moment the lease's jobs are given up unless it is renewed. (Past
	// that moment they were given up, just above.)
	if giveUp := l.giveUpAt(p); !l.until.IsZero() && len(l.jobs) > 0 && time.Now().Before(giveUp) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, giveUp)
		defer cancel()
	}
	if err := l.writeLocked(ctx, p, expect, extra); err != nil {
		return err
	}
	for i, j := range extra {
		l.putLocked(j.Key, j.Seq)
		l.toks++
		l.jobs[j.Key].tok, batch[i].leaseTok = l.toks, l.toks
	}
	l.seen = checked
	return nil
}

// writeLocked stores the lease: its jobs, extra, and a new end. l.mu is
// held.
func (l *lease) writeLocked(ctx context.Context, p *Pool, expect uint64, extra []data.LeasedJob) error {
	now := time.Now()
	ls := data.Lease{Worker: p.cfg.WorkerName, Until: now.Add(p.cfg.lease()).UTC(), Jobs: make([]data.LeasedJob, 0, len(l.jobs)+len(extra))}
	for key, j := range l.jobs {
		ls.Jobs = append(ls.Jobs, data.LeasedJob{Key: key, Seq: j.seq, Orphan: j.orphan})
	}
	ls.Jobs = append(ls.Jobs, extra...)
	l.sent = ls.Until
	seq, err := p.ledger.WriteLease(ctx, l.owner, ls, expect)
	if err != nil {
		return err
	}
	l.last, l.until, l.wrote, l.dirty = seq, ls.Until, now, false
	return nil
}

// done drops the job of delivery it from the lease once its record is
// stored, or keeps it as an orphan if its handler ran and no record could
// be stored. An entry of another copy or delivery of the job, leased
// since, is left.
func (l *lease) done(key string, it *inflight, orphan bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.doneLocked(key, it, orphan)
}

// mine reports whether j is the entry of delivery it, not a copy's or
// another delivery's leased since (a redelivery of the same message has
// the same seq).
func (j *leased) mine(it *inflight) bool {
	return j != nil && j.seq == it.job.Seq && j.tok == it.leaseTok
}

func (l *lease) doneLocked(key string, it *inflight, orphan bool) {
	j := l.jobs[key]
	if !j.mine(it) {
		return
	}
	if orphan {
		if !j.orphan {
			j.orphan, j.orphanedAt = true, time.Now()
		}
		return
	}
	l.dropLocked(key)
}

// letGo is done for a job released without a record, and returns when the
// stored lease that lists it running may end, read in the same step: every
// write after lists it as an orphan, or not at all. A write whose answer
// was lost may have stored a later end than the last one answered. Zero if
// the lease does not list the job.
func (l *lease) letGo(key string, it *inflight, orphan bool) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	j := l.jobs[key]
	if !j.mine(it) {
		return time.Time{}
	}
	held := l.until
	if l.sent.After(held) {
		held = l.sent
	}
	l.doneLocked(key, it, orphan)
	return held
}

// finishing marks the entry of delivery it as finishing (see leased).
func (l *lease) finishing(key string, it *inflight) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if j := l.jobs[key]; j.mine(it) {
		j.finishing = true
	}
}

// putLocked puts key's job, stored at seq, in the lease. l.mu is held.
func (l *lease) putLocked(key string, seq uint64) {
	if l.jobs[key] == nil {
		l.size += len(key) + leasedJobBytes
	}
	l.jobs[key] = &leased{seq: seq}
}

func (l *lease) dropLocked(key string) {
	if _, ok := l.jobs[key]; ok {
		delete(l.jobs, key)
		l.size -= len(key) + leasedJobBytes
		l.dirty = true
		l.gen++
		l.dropped[key] = l.gen
	}
}

// generation is the count of drops so far, taken before a check.
func (l *lease) generation() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gen
}

// droppedSince reports whether key left the lease after gen drops.
func (l *lease) droppedSince(key string, gen uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped[key] > gen
}

// forget forgets the drops up to gen: checks are made in order, and those
// to come start from gen or later.
func (l *lease) forget(gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, g := range l.dropped {
		if g <= gen {
			delete(l.dropped, key)
		}
	}
}

// renew rewrites the lease with a new end, once per heartbeat while it
// holds jobs, and once more after it dropped its last ones. A lease whose
// renewals fail until its end is near cancels its jobs' handlers, since
// another pool may take them over once it ends.
func (l *lease) renew(ctx context.Context, p *Pool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || len(l.jobs) == 0 && !l.dirty || time.Since(l.wrote) < p.cfg.heartbeat() {
		return
	}
	// The jobs are cancelled a sixth of the ack wait before the lease ends
	// unless it is renewed by then, however long the writes take.
	// Once that moment passed (the lease lapsed), its jobs are given up
	// first, and the lease is written again as add would: with a deadline
	// that passed, no renewal could ever write it, nor drop its orphans.
	deadline := time.Now().Add(opTimeout)
	if !l.until.IsZero() && len(l.jobs) > 0 {
		if giveUp := l.giveUpAt(p); time.Now().Before(giveUp) {
			deadline = giveUp
		} else {
			l.giveUpIfLapsed(p, errors.New("the lease was not renewed in time"))
		}
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	l.dropRecorded(ctx, p)
	expect := l.last
	err := data.ErrLeaseRaced
	for range 3 {
		opCtx, cancel := context.WithTimeout(ctx, opTimeout)
		err = l.writeLocked(opCtx, p, expect, nil)
		cancel()
		if !errors.Is(err, data.ErrLeaseRaced) {
			break
		}
		var snap *data.Snapshot
		opCtx, cancel = context.WithTimeout(ctx, opTimeout)
		snap, err = p.ledger.Check(opCtx, nil, l.owner)
		cancel()
		if err != nil {
			break
		}
		expect = snap.LeaseSeq
		l.seen = max(l.seen, expect) // the next write may not rest on an older check
		err = data.ErrLeaseRaced
	}
	if err == nil || errors.Is(ctx.Err(), context.Canceled) { // cancelled: the pool stopped, its jobs all through
		return
	}
	p.log.Warn().Err(err).Time("lease_until", l.until).Msg("renew the pool's lease")
	l.giveUpIfLapsed(p, err)
}

// dropRecorded drops the orphans whose jobs have a record now: run again
// and recorded here or in another pool, or dead-lettered. An orphan whose
// job got no record in ProcessedTTL goes too, as the record would have by
// then: so a job that never comes back does not keep the lease forever.
// l.mu is held.
func (l *lease) dropRecorded(ctx context.Context, p *Pool) {
	var keys []string
	for key, j := range l.jobs {
		switch {
		case !j.orphan:
		case time.Since(j.orphanedAt) >= p.cfg.ProcessedTTL:
			p.log.Info().Str("job_key", key).Msg("an orphan's job got no record in the ledger's TTL: dropped from the pool's lease")
			l.dropLocked(key)
		default:
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return
	}
	found, err := p.ledger.Recorded(ctx, keys)
	if err != nil {
		return // the next renewal looks again
	}
	for i, key := range keys {
		if found[i] {
			l.dropLocked(key)
		}
	}
}

// giveUpAt is when the pool gives its leased jobs up unless the lease is
// renewed: a sixth of the ack wait before the lease ends, so that their
// handlers stop before another pool may take them over.
func (l *lease) giveUpAt(p *Pool) time.Time { return l.until.Add(-p.cfg.heartbeat() / 2) }

// giveUpIfLapsed cancels the handlers of the leased jobs once the lease
// was not renewed in time, whatever write comes next. l.mu is held.
func (l *lease) giveUpIfLapsed(p *Pool, cause error) {
	if len(l.jobs) > 0 && !l.until.IsZero() && !time.Now().Before(l.giveUpAt(p)) {
		p.beats.loseLeased(fmt.Errorf("%w: the pool's lease could not be renewed before its end: %w", data.ErrClaimLost, cause))
	}
}

// collect deletes the leases of other pools that ended a lease period ago
// and whose jobs all have records now, which win over them: what a pool
// that crashed leaves behind, once its jobs ran again. A lease that ended
// ProcessedTTL ago goes whatever its jobs have, as their records would
// have by then: so leases do not pile up (see the limit in Ledger.Check).
func (l *lease) collect(ctx context.Context, p *Pool) {
	opCtx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	snap, err := p.ledger.Check(opCtx, nil, l.owner)
	if err != nil {
		return
	}
	for i := range snap.Leases {
		ls := &snap.Leases[i]
		if ls.Owner == l.owner || time.Since(ls.Until) < p.cfg.lease() {
			continue
		}
		if time.Since(ls.Until) < p.cfg.ProcessedTTL {
			if settled, err := p.ledger.Settled(opCtx, ls); err != nil || !settled {
				continue
			}
		}
		if err := p.ledger.DeleteLease(opCtx, ls.Owner, ls.Revision); err != nil {
			p.log.Debug().Err(err).Str("owner", ls.Owner).Msg("delete a lease that ended")
		}
	}
}

// close deletes the lease of a pool that stops with no job left in it,
// waiting for the delete until limit, if set, or opTimeout. A lease not
// deleted runs out.
func (l *lease) close(p *Pool, limit time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A write whose answer never came (its context cut off by Ctrl-C in
	// jobq next, say) may have landed: sent is set, last is not. Left
	// there, it would list its jobs running until it ends, though they
	// were handed back.
	if l.last == 0 && l.sent.IsZero() || len(l.jobs) > 0 {
		return
	}
	// With the connection down, or once Stop's ctx ended, the delete
	// waits no more: it would wait in the reconnect buffer, and hold the
	// stop past its time. The lease ends on its own.
	if !p.obj.JS.Conn().IsConnected() {
		p.log.Warn().Msg("delete the pool's lease: no connection to the server; it stays until it ends")
		return
	}
	deadline := time.Now().Add(opTimeout)
	if !limit.IsZero() && limit.Before(deadline) {
		deadline = limit
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	go func() {
		select {
		case <-p.cut:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := p.ledger.DeleteLease(ctx, l.owner, 0); err != nil {
		p.log.Warn().Err(err).Msg("delete the pool's lease: it stays until it ends")
		return
	}
	l.closed = true
}

// noLiveLeases refuses a pool that claims its jobs (see takesLeases) while
// another pool's lease holds jobs: a copy of such a job (a re-drive, or a
// republish after the dedupe window) has no record, so its claim would be
// taken and it would run beside the leased run. Pools on one bucket must
// all lease or all claim; they differ when direct gets on the bucket were
// turned off while leasing pools ran. Those cannot lease new jobs any more
// (their batched reads fail), so once their leased jobs end this passes.
func (p *Pool) noLiveLeases(ctx context.Context) error {
	leases, err := p.ledger.ReadLeases(ctx)
	if err != nil {
		return fmt.Errorf("read the leases of other pools: %w", err)
	}
	now := time.Now()
	for _, ls := range leases {
		if ls.Owner == p.lease.owner || !ls.Until.After(now) {
			continue
		}
		for _, j := range ls.Jobs {
			if !j.Orphan {
				return fmt.Errorf("the pool of %s leases jobs on bucket %s until %s, while this one would claim each job, since the bucket answers no direct gets; pools on one bucket must all lease or all claim: restart the pools that lease, or start this one once their leases ended",
					ls.Worker, BucketProcessed, ls.Until.Format(time.RFC3339))
			}
		}
	}
	return nil
}

// takesLeases reports whether leases work with obj: its server answers
// batched reads and checks a write's expected sequence over a subject
// filter (Nats-Expected-Last-Subject-Sequence-Subject), as nats-server 2.11
// and later do, and its bucket allows direct gets. Every pool on a bucket
// must agree, so a bucket that cannot be read now is an error, not a guess:
// a pool that claimed beside leasing ones could run a copy of a leased job,
// and one that leased on a bucket without direct gets would run nothing.
func takesLeases(obj *Objects) (bool, error) {
	var major, minor int
	if _, err := fmt.Sscanf(obj.JS.Conn().ConnectedServerVersion(), "%d.%d", &major, &minor); err != nil || major < 2 || major == 2 && minor < 11 {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	s, err := obj.JS.Stream(ctx, "KV_"+BucketProcessed)
	if err != nil {
		return false, fmt.Errorf("read bucket %s, to tell whether its pools lease jobs: %w", BucketProcessed, err)
	}
	return s.CachedInfo().Config.AllowDirect, nil
}

// settleProtocol settles, before p runs a job, whether it leases its jobs
// or claims each one, if NewPool could not tell (see takesLeases); a pool
// that claims checks that no other pool leases jobs (see noLiveLeases).
func (p *Pool) settleProtocol(ctx context.Context) error {
	if p.leasingErr != nil {
		leasing, err := takesLeases(p.obj)
		if err != nil {
			return err
		}
		p.leasing, p.leasingErr = leasing, nil
	}
	if p.leasing || p.cfg.NoLedger {
		return nil
	}
	opCtx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	return p.noLiveLeases(opCtx)
}
