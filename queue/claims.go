package queue

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobq/jobq/data"
)

// claimAhead is how many claims may be made ahead of the workers: enough to
// keep them busy while claims travel, few enough that a crash leaves few
// claimed jobs that never started (they come back as resumed attempts).
func claimAhead(workers int) int { return max(8*workers, 32) }

// checkBatch is the most fetched jobs one batched ledger read covers.
const checkBatch = 256

// startClaims passes fetched jobs on to be claimed, in order, at most
// claimAhead of them before a worker takes one. With Config.PreparedClaims
// it takes the jobs that are waiting, reads their ledger records in one
// batch, and lets each job that has none and cannot have a second copy in
// JOB (see markUnclaimed and freshness) run on a prepared claim instead,
// which its completion write creates.
func (p *Pool) startClaims(ctx context.Context) {
	defer p.holding.Wait() // they send to claims, which closes on return
	batch := make([]*inflight, 0, checkBatch)
	for it := range p.fetched {
		batch = append(batch[:0], it)
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
		if p.cfg.PreparedClaims {
			p.markUnclaimed(batch)
		}
		for _, it := range batch {
			switch {
			case it.held:
				p.holding.Add(1)
				go p.hold(ctx, it, data.Key(it.job.ID))
				continue
			case !it.unclaimed:
				p.startClaim(it)
			}
			p.claims <- it
		}
	}
}

// startClaim sends it.job's claim, at most claimAhead of them before a worker
// takes one.
func (p *Pool) startClaim(it *inflight) {
	<-p.ahead
	var err error
	if it.pending, err = p.ledger.ClaimAsync(it.job, p.cfg.WorkerName); err != nil {
		p.jobLog(it.job).Warn().Err(err).Msg("start claim: retrying synchronously")
	}
}

// hold keeps a re-driven job that has no record for AckWait, with
// heartbeats, before it is claimed: by then a copy running unclaimed under
// its ID has written its claim, which this one's claim then finds, and a
// copy fetched meanwhile is claimed before it runs (see markUnclaimed). A
// shutdown hands it back first.
func (p *Pool) hold(ctx context.Context, it *inflight, key string) {
	defer p.holding.Done()
	defer p.heldKey(key, -1)
	// Counted as held until it goes on, before it can run or give back
	// its room.
	unhold := func() {
		p.held.Add(-1)
		p.heldBytes.Add(-it.size)
	}
	p.jobLog(it.job).Info().Dur("for", p.cfg.AckWait).Msg("re-driven job has no ledger record: held so that a running copy can claim it first")
	t := time.NewTimer(p.cfg.AckWait)
	defer t.Stop()
	select {
	case <-t.C:
		unhold()
		p.startClaim(it)
		p.claims <- it
	case <-ctx.Done():
		unhold()
		p.beats.remove(it)
		p.nak(it.msg, 0, *p.jobLog(it.job))
		p.release(it)
	}
}

// markUnclaimed reads the ledger records of batch's first attempts in one
// request and marks those that have none to run on a prepared claim.
//
// A re-driven job (Jobq-Job-Id) is a copy under an ID that a job without a
// record may be running under unclaimed, so one that finds no record is
// held back for AckWait: by then a running copy has written its claim.
func (p *Pool) markUnclaimed(batch []*inflight) {
	var its []*inflight
	var jobs []*data.Job
	now := time.Now()
	for _, it := range batch {
		if it.job.Attempt == 1 && (redriven(it.job) || p.fresh.allows(p, now)) {
			its, jobs = append(its, it), append(jobs, it.job)
		}
	}
	if len(jobs) == 0 || now.Before(p.readsOff) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	found, err := p.ledger.Recorded(ctx, jobs)
	if err != nil {
		// A server without batched reads, say: claim every job for a while.
		p.readsOff = time.Now().Add(time.Minute)
		p.log.Warn().Err(err).Msg("batched ledger read failed: claiming every job for a minute")
		return
	}
	for i, it := range its {
		switch {
		case found[i]:
		case redriven(it.job):
			it.held = true
			p.held.Add(1) // until hold ends
			p.heldBytes.Add(it.size)
			select { // the fetcher may wait for room that this makes
			case p.heldWake <- struct{}{}:
			default:
			}
			p.heldKey(data.Key(it.job.ID), 1)
		case p.held.Load() > 0 && p.isHeld(data.Key(it.job.ID)):
			// A copy of a held job: claimed, so that the held one finds it.
		default:
			c := p.ledger.Prepare(it.job, p.cfg.WorkerName)
			it.mu.Lock() // the heartbeat loop may look at it already
			it.claim, it.unclaimed = c, true
			it.mu.Unlock()
		}
	}
}

// heldKey counts a held job under key up (d 1) or down (d -1).
func (p *Pool) heldKey(key string, d int) {
	p.heldMu.Lock()
	defer p.heldMu.Unlock()
	if p.heldKeys == nil {
		p.heldKeys = map[string]int{}
	}
	if p.heldKeys[key] += d; p.heldKeys[key] <= 0 {
		delete(p.heldKeys, key)
	}
}

// isHeld reports whether a job under key is held.
func (p *Pool) isHeld(key string) bool {
	p.heldMu.Lock()
	defer p.heldMu.Unlock()
	return p.heldKeys[key] > 0
}

// redriven reports a job published again from DLQ under its original ID.
func redriven(job *data.Job) bool { return nats.Header(job.Header).Get(HeaderJobID) != "" }

// freshness tells whether a job without a record may run on a prepared
// claim: only while JOB cannot hold two copies of one job ID. JOB's dedupe
// window drops a copy published within the window, so two copies exist
// only if one is older than the window; while JOB's oldest message is
// younger than the window less AckWait (a margin for clocks and for the lazy
// claim below), none is. A copy published later finds the running one's
// record: the heartbeat writes the prepared claim after AckWait/3 at the
// latest, and a job that cannot write it is cancelled. A redelivery
// (attempt > 1) and a re-driven dead letter are always claimed first.
// JOB's oldest message is read at most once a second; an older reading
// only makes the check stricter, since JOB's oldest message never gets
// older. While JOB holds a job stored before Provision lengthened the
// window (MetaDedupeRaisedAt), copies may be closer than the window, so
// every job is claimed. A window changed in place outside jobq leaves no
// such note, so the check keeps to the shortest of Config.DedupeWindow
// (which Provision set) and every window seen since.
//
// Used by startClaims only.
type freshness struct {
	checked time.Time     // when JOB was last looked at
	oldest  time.Time     // JOB's oldest message then, or checked if empty
	limit   time.Duration // JOB's dedupe window less AckWait; 0: claim all
	window  time.Duration // the shortest dedupe window seen (see allows)
}

func (f *freshness) allows(p *Pool, now time.Time) bool {
	if now.Sub(f.checked) >= time.Second {
		f.checked, f.oldest, f.limit = now, now, 0
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		info, err := p.obj.Jobs.Info(ctx)
		if err != nil {
			p.log.Warn().Err(err).Msg("read JOB's oldest job: claiming every job for a second")
			return false
		}
		if info.State.Msgs > 0 {
			f.oldest = info.State.FirstTime
		}
		// A window lengthened outside jobq (nats stream edit) is not
		// trusted: jobs stored before were deduplicated over the shorter
		// one. Provision set p.cfg.DedupeWindow; the shortest window seen
		// since holds for the rest of the run.
		if f.window == 0 || info.Config.Duplicates < f.window {
			f.window = min(info.Config.Duplicates, p.cfg.DedupeWindow)
		}
		f.limit = f.window - p.cfg.AckWait
		// Jobs stored before the window was lengthened were deduplicated
		// over the shorter one: two copies may be closer than the window.
		if raised, err := time.Parse(time.RFC3339Nano, info.Config.Metadata[MetaDedupeRaisedAt]); err == nil && !f.oldest.After(raised) {
			f.limit = 0
		}
	}
	return now.Sub(f.oldest) < f.limit
}

// claimAll waits for each claim in order and hands the won ones to workers.
func (p *Pool) claimAll(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for it := range p.claims {
		if it.unclaimed || p.claimed(ctx, it) {
			p.work <- it
			continue
		}
		p.beats.remove(it)
		p.ahead <- struct{}{}
		p.release(it)
	}
}

// claimed settles a job's claim and reports whether a worker should run it.
// Jobs it does not pass on are acked or released here. ctx has no deadline:
// the claim's future times out by itself.
func (p *Pool) claimed(ctx context.Context, it *inflight) bool {
	var claim data.Claim
	var err error
	if it.pending != nil {
		claim, err = it.pending.Wait(ctx)
	} else {
		claim, err = p.ledger.Claim(ctx, it.job, p.cfg.WorkerName)
	}
	if err == nil && claim.Replaced == nil && !it.job.Resumed {
		it.setClaim(claim) // the plain case: a fresh claim
		return true
	}
	log := *p.jobLog(it.job)
	opCtx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	switch {
	case errors.Is(err, data.ErrAlreadyDone):
		log.Debug().Msg("job already done: acked without running")
		p.cfg.Metrics.jobSkipped(it.job.Subject)
		p.ack(opCtx, it.msg, log)
		return false
	case errors.Is(err, data.ErrClaimed) && claim.Record.Seq != it.job.Seq:
		// The same ID published again while the first copy runs: that copy
		// stays in JOB until its outcome is recorded, so this one can go.
		log.Warn().Uint64("running_seq", claim.Record.Seq).Msg("duplicate of a running job: acked without running")
		p.cfg.Metrics.jobSkipped(it.job.Subject)
		p.ack(opCtx, it.msg, log)
		return false
	case errors.Is(err, data.ErrClaimed):
		delay := time.Until(claim.Record.LeaseUntil) + time.Second
		log.Warn().Str("holder", claim.Record.Worker).Dur("retry_in", delay).Msg("job redelivered while its claim is live: released")
		p.nak(it.msg, delay, log)
		return false
	case err != nil:
		p.fail(opCtx, it.msg, it.job, nil, 0, err, log)
		return false
	}
	if claim.Replaced != nil {
		log.Warn().Err(claim.Replaced).Msg("unreadable ledger record replaced by a new claim")
	}
	if it.job.Resumed {
		log.Warn().Msg("resuming a job whose earlier attempt never recorded an outcome")
	}
	it.setClaim(claim)
	return true
}

// setClaim records the job's claim; the heartbeat loop may read it.
func (it *inflight) setClaim(c data.Claim) {
	it.mu.Lock()
	it.claim = c
	it.mu.Unlock()
}
