package queue

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
)

// claimAhead is how many claims may be made ahead of the workers: enough to
// keep them busy while claims travel, few enough that a crash leaves few
// claimed jobs that never started (they come back as resumed attempts).
func claimAhead(workers int) int { return max(8*workers, 32) }

// checkBatch is the most fetched jobs one batched ledger read covers.
const checkBatch = 256

// startClaims takes the fetched jobs in batches, as checkBatches read the
// ledger for them, and decides how each runs (see admitBatch): most go into
// the pool's lease in one ledger write and run on prepared claims; a job
// with a record is claimed first, at most claimAhead of them before a
// worker takes one. Without leases (see takesLeases), every job is claimed
// first. Once Stop began, a fetched job is handed back unless it runs still
// (see keepAtStop). ctx ends once the pool's jobs are cut off at shutdown.
func (p *Pool) startClaims(ctx context.Context) {
	if !p.leasing {
		for it := range p.fetched {
			if len(p.handBackAtStop([]*inflight{it})) == 0 {
				continue
			}
			p.startClaim(it)
			p.claims <- it
		}
		return
	}
	checks := make(chan checked, 1)
	go p.checkBatches(ctx, checks)
	for c := range checks {
		// Drops up to this check's are seen by every check to come.
		p.lease.forget(c.gen)
		p.admitAll(ctx, c, func(it *inflight, leased bool) {
			if !leased {
				<-p.ahead
			}
			p.claims <- it
		})
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

// claimAll waits for each claim in order and hands the won ones to workers.
// ctx ends once the pool's jobs are cut off at shutdown.
func (p *Pool) claimAll(ctx context.Context) {
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

// refused reports whether a failed ledger write is the server's refusal,
// which stored nothing, rather than an answer that never came, or a claim
// found live that may be the write's own.
func refused(err error) bool {
	return !errors.Is(err, data.ErrClaimed) && errors.As(err, new(*jetstream.APIError))
}

// claimed settles a job's claim and reports whether a worker should run it.
// Jobs it does not pass on are acked or released here. A claim that the
// ledger could not settle (a timeout, a bucket that refuses writes) is
// tried again, the job held with heartbeats meanwhile, as a batch's lease
// is (see admitBatch): a ledger outage costs no delivery and dead-letters
// no job that never ran. Once ctx ends, the job is handed back. The
// ledger's calls do not end with ctx: the claim's future times out by
// itself.
func (p *Pool) claimed(ctx context.Context, it *inflight) bool {
	stop, halt := ctx.Done(), p.halt
	ctx = context.WithoutCancel(ctx)
	var claim data.Claim
	var err error
	if it.pending != nil {
		claim, err = it.pending.Wait(ctx)
	} else {
		claim, err = p.ledger.Claim(ctx, it.job, p.cfg.WorkerName)
	}
	log := *p.jobLog(it.job)
	// landed: a claim write of this job's may have been stored, though its
	// answer never came (the ledger did not refuse it), or a live claim
	// holds the job that may be this pool's own. Any such write counts,
	// not only the last: the last may fail otherwise, as a read.
	landed := err != nil && !refused(err)
	for {
		for backoff, retried := 50*time.Millisecond, false; err != nil && !errors.Is(err, data.ErrAlreadyDone) && !errors.Is(err, data.ErrDeadLettered) && !errors.Is(err, data.ErrAwaitingDeadLetter); retried = true {
			wait := backoff
			if errors.Is(err, data.ErrClaimed) {
				if !retried || claim.Record.Seq != it.job.Seq {
					break
				}
				// A claim write whose answer was lost may have landed: the live
				// claim on this very copy of the job is most likely this
				// pool's own. Wait it out, holding the job, rather than
				// release it and spend a delivery.
				wait = time.Until(claim.Record.LeaseUntil) + 100*time.Millisecond
			} else {
				backoff = min(2*backoff, 5*time.Second)
			}
			p.jobLog(it.job).Warn().Err(err).Dur("retry_in", wait).Msg("claim job: retrying")
			giveUp, timer := false, time.NewTimer(wait)
		waiting:
			for {
				select {
				case <-timer.C:
					break waiting
				case <-halt:
					// Stop began: the job goes back, unless it runs still or
					// its claim may have landed (the ledger did not refuse
					// it): a live claim of this pool's would hold the job's
					// next delivery too, spending it. That one waits its
					// claim out, as before Stop.
					halt = nil
					if !p.keepAtStop(it) && !landed {
						giveUp = true
						break waiting
					}
				case <-stop:
					giveUp = true
					break waiting
				}
			}
			timer.Stop()
			if giveUp {
				p.beats.remove(it)
				log := *p.jobLog(it.job)
				// A live claim that may be this pool's own, cut short by the
				// shutdown timeout: the job comes back once it ended, rather
				// than find it live and go back again, spending a delivery.
				var delay time.Duration
				if errors.Is(err, data.ErrClaimed) {
					delay = max(time.Until(claim.Record.LeaseUntil)+time.Second, 0)
				}
				log.Info().Dur("retry_in", delay).Msg("shutdown before the job's claim: released")
				p.nak(it.msg, delay, log)
				return false
			}
			claim, err = p.ledger.Claim(ctx, it.job, p.cfg.WorkerName)
			landed = landed || err != nil && !refused(err)
		}
		// The heartbeats renew a claim once it is due, up to half a
		// heartbeat and a tick after its job's last InProgress (see
		// beatTimes; here reckoned a heartbeat and a quarter, to spare).
		// A claim to be given up before then (sent when the job was
		// fetched and settled only now, after the jobs ahead of it, with
		// nothing to renew it meanwhile) is renewed now: once it ended,
		// another pool could take the job over.
		if err != nil || time.Now().Add(p.cfg.heartbeat()*5/4).Before(p.claimGiveUpAt(&claim)) {
			break
		}
		opCtx, cancel := context.WithTimeout(ctx, opTimeout)
		rerr := p.ledger.Renew(opCtx, &claim)
		cancel()
		if rerr == nil {
			break
		}
		if errors.Is(rerr, data.ErrClaimLost) {
			p.beats.remove(it)
			log.Warn().Err(rerr).Msg("claim taken over before the job could start: released")
			p.nak(it.msg, p.cfg.lease(), log)
			return false
		}
		// The renewal may have landed: the claim is settled again, as one
		// whose answer was lost, the job held with heartbeats meanwhile.
		log.Warn().Err(rerr).Msg("renew a claim settled late: settling it again")
		err, landed = rerr, true
	}
	if err == nil && claim.Replaced == nil && !it.job.Resumed {
		it.setClaim(claim) // the plain case: a fresh claim
		return true
	}
	opCtx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err != nil {
		// No heartbeat may follow the ack or release below: an InProgress
		// after a Nak would hold the job until the ack wait runs out.
		p.beats.remove(it)
	}
	switch {
	case errors.Is(err, data.ErrAlreadyDone):
		log.Debug().Msg("job already done: acked without running")
		p.cfg.Metrics.jobSkipped(it.job.Subject)
		p.ack(opCtx, it.msg, log)
		return false
	case errors.Is(err, data.ErrDeadLettered):
		log.Warn().Msg("job dead-lettered already, delivered again: acked without running")
		p.cfg.Metrics.jobSkipped(it.job.Subject)
		p.ack(opCtx, it.msg, log)
		return false
	case errors.Is(err, data.ErrAwaitingDeadLetter):
		p.deadLetterAwaiting(opCtx, it, claim, log)
		return false
	case errors.Is(err, data.ErrClaimed) && claim.Record.Seq != it.job.Seq && !redriven(it.job) && !p.earlierClaim(opCtx, it.job, claim.Record):
		// The same ID published again while the first copy runs: that copy
		// stays in JOB until its outcome is recorded, so this one can go.
		// A re-drive waits instead (see leasedElsewhere), and so does a
		// job whose ID only an earlier JOB's job shares.
		p.cfg.Metrics.jobSkipped(it.job.Subject)
		log := log.With().Uint64("running_seq", claim.Record.Seq).Logger()
		if p.ack(opCtx, it.msg, log) == nil { // else it says why not
			log.Warn().Msg("duplicate of a running job: acked without running")
		}
		return false
	case errors.Is(err, data.ErrClaimed):
		delay := time.Until(claim.Record.LeaseUntil) + time.Second
		log.Warn().Str("holder", claim.Record.Worker).Dur("retry_in", delay).Msg("job redelivered while its claim is live: released")
		p.nak(it.msg, delay, log)
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

// earlierClaim reports whether rec, a live claim on job's ID, is an earlier
// JOB's job's (see data.Ledger.Earlier), or may be: a job known by its
// stream sequence (seq-N) shares its ID with the jobs at that sequence of
// every JOB made anew, and is not a copy of theirs to drop.
func (p *Pool) earlierClaim(ctx context.Context, job *data.Job, rec data.Record) bool {
	earlier, err := p.ledger.Earlier(ctx, job.ID, job.EnqueuedAt, rec)
	return earlier || err != nil
}

// setClaim records the job's claim; the heartbeat loop may read it.
func (it *inflight) setClaim(c data.Claim) {
	it.mu.Lock()
	it.claim = c
	it.mu.Unlock()
}

// deadLetterAwaiting dead-letters, without running it again, a job that
// failed for good and whose dead letter DLQ had no room for then (see
// awaitDeadLetter); while DLQ is still full, it is released again.
func (p *Pool) deadLetterAwaiting(ctx context.Context, it *inflight, claim data.Claim, log zerolog.Logger) {
	cause := strings.TrimPrefix(claim.Record.LastError, data.AwaitingDeadLetter)
	job := *it.job
	job.Attempt = max(claim.Record.Attempts, 1)
	if err := p.deadLetter(ctx, &job, it.msg.Headers(), cause); err != nil {
		if !errors.Is(err, errTooLargeForDLQ) {
			delay := p.cfg.backoff(it.job.Attempt)
			log.Warn().Err(err).Dur("retry_in", delay).Msg("job awaiting its dead letter, which could not be stored yet: released")
			p.nak(it.msg, delay, log)
			return
		}
		log.Error().Err(err).Msg("dead-letter job: left in JOB for the sweep")
		return
	}
	p.deadLettered(ctx, it.msg, &job, &claim, claim.Record.Took, errors.New(cause), log)
	log.Error().Str("error", cause).Msg("job dead-lettered, once DLQ had room")
}
