package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
)

// sweep moves jobs whose deliveries ran out from JOB to DLQ.
//
// In a work-queue stream such a job is never delivered again and never
// removed: the server drops it from WORKER's pending set and sends one
// MAX_DELIVERIES advisory, which is lost while jobq is down. The advisory
// handler moves the one job it names. sweep finds the rest: when WORKER has
// no job pending, every job still stored at or below its delivered sequence
// has been delivered and is not pending, so its deliveries ran out. With
// jobs pending, those at or below WORKER's ack floor are not (every job
// pending is above it), so sweep goes that far. It runs at start and every
// AckWait.
//
// A job acked a moment ago is still stored for a while: the server ends it
// pending and moves the floor before JOB removes it, microseconds later on
// one server, and on a cluster once the removal was agreed on. Without the
// ledger, or run by a client outside jobq, no record tells it done. So sweep
// looks twice, p.sweepSettle apart, and moves only the jobs found both
// times.
func (p *Pool) sweep(ctx context.Context) (int, error) {
	moved, full := 0, 0
	defer func() {
		if full > 0 {
			p.log.Error().Int("jobs", full).Msg("exhausted jobs left in " + StreamJob + ": " + StreamDLQ + " is full; re-drive dead letters (jobq dlq retry) or clear them (jobq dlq purge), or raise --max-store")
		}
	}()
	// In chunks of at most p.sweepChunk jobs, each looked at twice.
	for from := uint64(1); ; {
		// Each job found by the first look, by sequence, with when it
		// was stored, which tells it from another at its sequence, of a
		// JOB made anew.
		first := map[uint64]time.Time{}
		var upTo uint64
		err := p.sweepable(ctx, from, func(m *jetstream.RawStreamMsg) error {
			if len(first) == p.sweepChunk {
				return errEnough
			}
			first[m.Sequence], upTo = m.Time, m.Sequence
			return nil
		})
		more := errors.Is(err, errEnough)
		if len(first) == 0 || err != nil && !more {
			return moved, err
		}
		p.log.Debug().Int("jobs", len(first)).Stringer("again_in", p.sweepSettle).Msg("sweep found jobs whose deliveries may have run out: looking again")
		t := time.NewTimer(p.sweepSettle)
		select {
		case <-ctx.Done():
			t.Stop()
			return moved, ctx.Err()
		case <-p.halt: // Stop began: the next sweep, here or in another pool, looks again
			t.Stop()
			return moved, nil
		case <-t.C:
		}
		err = p.sweepable(ctx, from, func(m *jetstream.RawStreamMsg) error {
			if m.Sequence > upTo {
				return errEnough
			}
			if stored, ok := first[m.Sequence]; !ok || !stored.Equal(m.Time) {
				return nil // new since the first look
			}
			ok, err := p.sweepOne(ctx, m)
			switch {
			case errors.Is(err, errTooLargeForDLQ):
				// It stays where it is, named in the log every sweep;
				// the jobs after it are still moved.
				p.log.Error().Err(err).Msg("exhausted job left in " + StreamJob)
			case isFull(err):
				// So does a job whose dead letter DLQ has no room for:
				// the jobs after it may fit, or need no room (done, or
				// dead-lettered already).
				full++
			case err != nil:
				return err
			case ok:
				moved++
			}
			return nil
		})
		if errors.Is(err, errEnough) {
			err = nil
		}
		if err != nil || !more {
			return moved, err
		}
		from = upTo + 1
	}
}

// sweepSettle is how long a job found by the sweep must stay stored to be
// taken for one whose deliveries ran out: far longer than a cluster takes
// to remove a job acked (see sweep).
const sweepSettle = 2 * time.Second

// sweepChunk bounds the jobs a sweep holds in memory between its two looks:
// it goes on with the next ones after.
const sweepChunk = 10000

// sweepable calls f with each job stored from sequence from on that WORKER
// delivered and holds pending no longer, oldest first, until f fails or the
// pool stops (the next run, after a restart, goes on).
func (p *Pool) sweepable(ctx context.Context, from uint64, f func(*jetstream.RawStreamMsg) error) error {
	info, err := p.obj.Worker.Info(ctx)
	if err != nil {
		return fmt.Errorf("read consumer %s: %w", ConsumerWorker, err)
	}
	last := info.Delivered.Stream
	if info.NumAckPending > 0 {
		last = info.AckFloor.Stream
	}
	for seq := from; seq <= last && !p.stopping.Load(); {
		m, err := p.obj.Jobs.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(SubjectJobs))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", StreamJob, err)
		}
		if m.Sequence > last {
			return nil
		}
		seq = m.Sequence + 1
		if err := f(m); err != nil {
			return err
		}
	}
	return nil
}

// sweepSeq moves the job named by a MAX_DELIVERIES advisory. A job stored
// after the advisory went out is another, of a JOB made anew since, at the
// exhausted job's sequence: it is left alone.
func (p *Pool) sweepSeq(ctx context.Context, e exhausted) (bool, error) {
	m, err := p.obj.Jobs.GetMsg(ctx, e.seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", StreamJob, err)
	}
	if !e.at.IsZero() && m.Time.After(e.at) {
		return false, nil
	}
	return p.sweepOne(ctx, m)
}

// sweepOne dead-letters one exhausted job: a done record, or a failed one
// that names this very copy, means only the ack was lost, so the job is
// just removed; a live claim or lease is left to
// its holder; anything else goes to DLQ with the ledger's last error and is recorded
// failed, then removed from JOB. A job that a pool would claim (it has a
// record, or pools claim each job) is recorded awaiting its dead letter
// first (see data.Ledger.AwaitDeadLetter).
func (p *Pool) sweepOne(ctx context.Context, m *jetstream.RawStreamMsg) (bool, error) {
	job := &data.Job{
		ID: jobID(m.Header, m.Sequence), Subject: m.Subject, Seq: m.Sequence,
		Attempt: p.cfg.MaxDeliver, Payload: m.Data, Header: m.Header, EnqueuedAt: m.Time,
	}
	log := p.log.With().Str("job_id", job.ID).Str("subject", job.Subject).Uint64("seq", job.Seq).Logger()
	rec, err := p.ledger.Get(ctx, job.ID)
	noRecord := errors.Is(err, data.ErrNotFound)
	if err == nil && !(rec.State == data.StateRunning && time.Now().Before(rec.LeaseUntil)) {
		earlier, eerr := p.ledger.Earlier(ctx, job.ID, job.EnqueuedAt, rec)
		if eerr != nil {
			return false, eerr
		}
		if earlier { // another job's, of an earlier JOB
			rec, err = data.Record{}, fmt.Errorf("job %s: %w", job.ID, data.ErrNotFound)
		}
	}
	switch {
	case err == nil && rec.State == data.StateDone:
		if err := deleteMsg(ctx, p.obj.Jobs, m.Sequence); err != nil {
			return false, fmt.Errorf("remove done job %s: %w", job.ID, err)
		}
		return false, nil
	case err == nil && rec.State == data.StateRunning && time.Now().Before(rec.LeaseUntil):
		return false, nil // its holder is still running it
	case err == nil && rec.DeadLettered(job):
		// Its dead letter is stored; only its removal was lost (jobq
		// stopped before the ack). Dead-lettered again, it would be in
		// DLQ twice once DLQ's dedupe window passed, or back after its
		// dead letter was purged.
		if err := deleteMsg(ctx, p.obj.Jobs, m.Sequence); err != nil {
			return false, fmt.Errorf("remove dead-lettered job %s: %w", job.ID, err)
		}
		log.Warn().Msg("job dead-lettered already: removed from " + StreamJob)
		return false, nil
	case errors.Is(err, data.ErrNotFound):
	case err != nil && !errors.Is(err, data.ErrCorruptRecord):
		return false, err
	case neverRan(rec):
		return false, p.requeue(ctx, job, m, log)
	}
	// A pool may still hold a delivery of it, unclaimed: the server gave
	// up on it while the pool's InProgress did not reach WORKER, as when
	// WORKER's leader changed, or the pool was paused. So the record says
	// first that the job awaits its dead letter, by a compare-and-set that
	// such a pool's claim cannot pass unseen: a claim that came first
	// keeps the job (it runs, and its record decides), and one after finds
	// it awaiting its dead letter and does not run it. Dead-lettered first,
	// the job ran there as well, and was done and in DLQ. A job without a
	// record, where pools lease such jobs, goes into this pool's lease
	// before its record is created, as a job that a pool runs does (see
	// leaseForDeadLetter).
	var claim *data.Claim
	if !p.cfg.NoLedger {
		var c data.Claim
		last := strings.TrimPrefix(rec.LastError, data.AwaitingDeadLetter)
		err = errRecorded
		if noRecord && p.leasing {
			var drop func()
			c, drop, err = p.leaseForDeadLetter(ctx, job, last)
			if drop != nil {
				defer drop() // once its record is stored, or it is left
			}
		}
		if errors.Is(err, errRecorded) {
			c, err = p.ledger.AwaitDeadLetter(ctx, job, last)
		}
		switch {
		case errors.Is(err, errLeftToALease):
			log.Info().Msg("another copy of the exhausted job runs on a lease: its outcome is left to it")
			return false, nil
		case errors.Is(err, data.ErrClaimed):
			log.Warn().Str("holder", c.Record.Worker).Msg("job claimed as it was to be dead-lettered, its deliveries exhausted: left to its holder")
			return false, nil
		case errors.Is(err, data.ErrAlreadyDone), errors.Is(err, data.ErrDeadLettered):
			// Done, or dead-lettered by the holder that found it
			// awaiting its dead letter, since the look above.
			if err := deleteMsg(ctx, p.obj.Jobs, m.Sequence); err != nil {
				return false, fmt.Errorf("remove job %s, settled meanwhile: %w", job.ID, err)
			}
			return false, nil
		case err != nil:
			return false, err
		}
		claim, rec = &c, c.Record
	}
	cause := fmt.Sprintf("deliveries exhausted (max deliver %d)", p.cfg.MaxDeliver)
	if last := strings.TrimPrefix(rec.LastError, data.AwaitingDeadLetter); last != "" {
		cause += ": " + last
	}
	if rec.Attempts > 0 {
		job.Attempt = rec.Attempts
	}
	if err := p.deadLetter(ctx, job, m.Header, cause); err != nil {
		return false, err
	}
	p.cfg.Metrics.jobDeadLettered(job.Subject)
	p.observe(job, data.StateFailed, 0, errors.New(cause))
	if claim != nil {
		// A worker that found the job awaiting its dead letter stores
		// the same dead letter and records it failed as well: either
		// write does.
		if err := p.ledger.Fail(ctx, claim, 0, cause); err != nil && !errors.Is(err, data.ErrClaimLost) {
			log.Error().Err(err).Msg("record dead-lettered job")
		}
	} else if err := p.ledger.FailUnclaimed(ctx, job, cause); err != nil {
		log.Error().Err(err).Msg("record dead-lettered job")
	}
	if err := deleteMsg(ctx, p.obj.Jobs, m.Sequence); err != nil {
		return false, fmt.Errorf("remove dead-lettered job %s from %s: %w", job.ID, StreamJob, err)
	}
	log.Error().Str("error", cause).Msg("job dead-lettered: deliveries exhausted")
	return true, nil
}

var (
	// errLeftToALease: a live lease holds the job, of another copy of it,
	// or of a delivery that a pool holds still.
	errLeftToALease = errors.New("a live lease holds the job")
	// errRecorded: the job has a record, which decides (see data's
	// Leases, rule 1).
	errRecorded = errors.New("the job has a record")
)

// leaseForDeadLetter takes job, whose deliveries ran out and which has no
// record, into the pool's lease, as the pool takes a job it runs (see
// data's Leases, rule 2), and then records through the lease's prepared
// claim that the job awaits its dead letter, with cause. A copy of the job
// that a pool leased first keeps it (errLeftToALease); a pool that takes a
// copy after finds the job in this lease, as a copy of a running one, or
// claims it through its record, which then decides. (A failed record
// created outside a lease, after a look at the leases, refused the outcome
// of a copy leased in between, which then ran again.)
// errRecorded: a record came first, which decides. The caller records
// the job failed through the claim once its dead letter is stored, and
// calls drop, which takes the job out of the lease, whatever the outcome.
func (p *Pool) leaseForDeadLetter(ctx context.Context, job *data.Job, cause string) (c data.Claim, drop func(), err error) {
	key := data.Key(job.ID)
	it := &inflight{job: job}
	for range 8 {
		gen := p.lease.generation()
		opCtx, cancel := context.WithTimeout(ctx, opTimeout)
		snap, err := p.ledger.Check(opCtx, []*data.Job{job}, p.lease.owner)
		cancel()
		if err != nil {
			return c, nil, err
		}
		mine, held, _ := p.lease.find(key)
		_, _, listed := snap.Leased(key)
		_, _, heldElsewhere := snap.Holder(0, key, time.Now())
		switch {
		case held && !mine.orphan || heldElsewhere:
			return c, nil, errLeftToALease
		case snap.Found[0]:
			return c, nil, errRecorded
		case !held && p.lease.droppedSince(key, gen):
			continue // it left this pool's lease: its record may be newer than the check
		}
		job.Resumed = listed || held // an attempt on a lease that ended, or an orphan's, may have run
		opCtx, cancel = context.WithTimeout(ctx, opTimeout)
		err = p.lease.add(opCtx, p, []*inflight{it}, snap.LeaseSeq, gen)
		cancel()
		if errors.Is(err, data.ErrLeaseRaced) {
			continue // another pool's lease write came first: check again
		}
		if err != nil {
			return c, nil, err
		}
		// Its outcome is on its way, as a run's whose handler returned:
		// a re-drive of its dead letter, fetched here before the drop,
		// waits rather than go as a copy of a running job (see sortBatch).
		p.lease.finishing(key, it)
		c, err = p.ledger.AwaitDeadLetterLeased(ctx, job, p.lease.owner, cause)
		if errors.Is(err, data.ErrClaimLost) {
			err = errRecorded
		}
		// An orphan it took the place of stays one unless a record is
		// stored (rule 4): it may have run.
		keep := held && mine.orphan && err != nil && !errors.Is(err, errRecorded)
		return c, func() { p.lease.done(key, it, keep) }, err
	}
	return c, nil, fmt.Errorf("dead-letter job %s: the leases keep changing; the next sweep tries again", job.ID)
}

// neverRan reports whether rec is of a job that never ran: released by a
// shutdown before it started (see Pool.releaseUnstarted), on every delivery
// it had, with no earlier attempt that may have run.
func neverRan(rec data.Record) bool {
	return rec.State == data.StateRetrying && rec.LastError == data.CauseReleased && rec.Attempts == 0 && !rec.Resumed
}

// requeue stores a copy of the exhausted job m, which never ran (its
// deliveries went to stops that handed it back), at the end of JOB under
// its own job ID, then removes m. Dead-lettered, it would be said to have
// failed. The copy's Nats-Msg-Id comes from m's sequence and stored time,
// so that one stored again after a crash is a duplicate.
func (p *Pool) requeue(ctx context.Context, job *data.Job, m *jetstream.RawStreamMsg, log zerolog.Logger) error {
	c := jobCopy(m.Subject, m.Data, jobHeaders(m.Header), job.ID, retryIDPrefix+"requeue-"+strconv.FormatUint(m.Sequence, 10)+"-"+strconv.FormatInt(m.Time.UnixNano(), 10))
	ack, err := p.obj.JS.PublishMsg(ctx, c)
	if err == nil && ack.Stream != StreamJob {
		err = fmt.Errorf("stored in stream %s", ack.Stream)
	}
	if err != nil {
		return fmt.Errorf("enqueue job %s again, whose deliveries went to stops before it ever ran: %w", job.ID, err)
	}
	if err := deleteMsg(ctx, p.obj.Jobs, m.Sequence); err != nil {
		return fmt.Errorf("remove job %s, enqueued again at %d, from %s: %w", job.ID, ack.Sequence, StreamJob, err)
	}
	log.Warn().Uint64("new_seq", ack.Sequence).Msg("job's deliveries went to stops before it ever ran: enqueued again")
	return nil
}

// exhausted is a MAX_DELIVERIES advisory's job: its sequence in JOB, and
// when the advisory was sent (the server's time; zero if it did not say).
type exhausted struct {
	seq uint64
	at  time.Time
}

// watchExhausted subscribes to WORKER's MAX_DELIVERIES advisories. It is
// called before the first fetch, so no advisory is missed while jobq runs.
func (p *Pool) watchExhausted() (*nats.Subscription, chan exhausted, error) {
	seqs := make(chan exhausted, 1024)
	sub, err := p.obj.JS.Conn().Subscribe(AdvisoryMaxDeliveries, func(m *nats.Msg) {
		var adv struct {
			StreamSeq uint64    `json:"stream_seq"`
			Time      time.Time `json:"timestamp"`
		}
		if err := json.Unmarshal(m.Data, &adv); err != nil || adv.StreamSeq == 0 {
			p.log.Warn().Err(err).Msg("unreadable max deliveries advisory")
			return
		}
		select {
		case seqs <- exhausted{seq: adv.StreamSeq, at: adv.Time}:
		default: // full: the periodic sweep finds it
		}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("subscribe to %s: %w", AdvisoryMaxDeliveries, err)
	}
	return sub, seqs, nil
}

// sweeper moves the job of every advisory, and runs sweep at start and every
// AckWait, until ctx ends. Each step runs to its end, or a minute, unless
// stepCtx ends first.
func (p *Pool) sweeper(ctx, stepCtx context.Context, seqs <-chan exhausted) {
	t := time.NewTicker(p.cfg.AckWait)
	defer t.Stop()
	run := func(f func(context.Context) (int, error)) {
		opCtx, cancel := context.WithTimeout(stepCtx, time.Minute)
		defer cancel()
		n, err := f(opCtx)
		if err != nil {
			p.log.Error().Err(err).Msg("move exhausted jobs to the dead-letter stream")
		}
		if n > 0 {
			p.log.Warn().Int("jobs", n).Msg("exhausted jobs dead-lettered")
		}
	}
	run(p.sweep)
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-seqs:
			run(func(ctx context.Context) (int, error) {
				ok, err := p.sweepSeq(ctx, e)
				if ok {
					return 1, err
				}
				return 0, err
			})
		case <-t.C:
			run(func(ctx context.Context) (int, error) {
				// A deleted DLQ is made anew here too, not only at a
				// dead letter: /readyz says 503 while it is gone.
				p.makeDLQAnew(ctx)
				return p.sweep(ctx)
			})
		}
	}
}

// deleteMsg removes seq from s; a message already gone is not an error.
func deleteMsg(ctx context.Context, s jetstream.Stream, seq uint64) error {
	err := s.DeleteMsg(ctx, seq)
	if err == nil {
		return nil
	}
	if _, gerr := s.GetMsg(ctx, seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
		return nil
	}
	return err
}
