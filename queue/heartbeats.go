package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobq/jobq/data"
)

// heartbeats keeps the leases of claimed and running jobs: each gets
// InProgress, which resets the server's ack wait, and a renewal of its
// ledger claim, every half heartbeat (AckWait/6; see beatTimes); the
// pool's lease, for the jobs that run on it, is renewed every heartbeat.
// A lost claim or lease cancels the job's handler. One loop serves all
// jobs, so a job costs no goroutine of its own.
//
// A lease lasts AckWait less a heartbeat, and the pool writes it with each
// batch it leases; the server redelivers a held job an ack wait after its
// last InProgress. So a job's InProgress goes out well within a heartbeat
// of the one before: the ack wait for it ends after any lease the pool
// wrote meanwhile, by more than the second to which a restart of the
// server rounds the time of an InProgress. A job redelivered after its
// pool died then finds that lease ended, and is taken over. With
// InProgress every heartbeat, the ack wait ran out before the lease just
// written ended: the job was released until the lease ended, a delivery
// spent.
type heartbeats struct {
	mu   sync.Mutex
	jobs map[*inflight]struct{}
}

func (h *heartbeats) add(it *inflight) {
	it.lastBeat = time.Now()
	h.mu.Lock()
	h.jobs[it] = struct{}{}
	h.mu.Unlock()
}

// remove stops it.job's heartbeats and returns once no renewal is under way, so
// the caller owns its claim.
func (h *heartbeats) remove(it *inflight) {
	h.mu.Lock()
	delete(h.jobs, it)
	h.mu.Unlock()
	it.mu.Lock()
	it.closed = true
	it.mu.Unlock()
}

// loop sends the heartbeats until done is closed. Claims are renewed within
// ctx; the lease is renewed, and other pools' ended leases collected,
// within ledgerCtx, which outlives ctx at shutdown (the jobs cut off then
// still record their outcomes on the lease) and ends once they did.
func (h *heartbeats) loop(ctx, ledgerCtx context.Context, p *Pool, done <-chan struct{}) {
	tick, every := beatTimes(p.cfg.heartbeat())
	t := time.NewTicker(tick)
	defer t.Stop()
	var due []*inflight
	collected := time.Now()
	// Collecting ended leases reads and writes the ledger, bounded only
	// by opTimeout each: it runs beside the loop, which must go on
	// sending heartbeats and giving up what was not renewed in time.
	var collecting sync.WaitGroup
	defer collecting.Wait()
	var busy atomic.Bool
	// The lease's renewal runs beside the loop too: it waits for a new
	// batch's lease write, and a lease that lists no job any more is
	// written with opTimeout, both past the moment a claim of a job's own
	// is to be given up. Whatever jobs the lease holds when a renewal
	// begins stay there until it ends (add waits for it), and it gives
	// them up itself if it could not renew the lease in time.
	var leaseRenewing sync.WaitGroup
	defer leaseRenewing.Wait()
	var renewingLease atomic.Bool
	var renewals sync.WaitGroup
	defer renewals.Wait()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		now := time.Now()
		due = due[:0]
		h.mu.Lock()
		for it := range h.jobs {
			if now.Sub(it.lastBeat) >= every {
				due = append(due, it)
			}
		}
		h.mu.Unlock()
		// Every due job's InProgress goes out before any ledger write, so
		// a slow write delays none.
		for _, it := range due {
			p.keepAlive(it)
		}
		if p.leasing && renewingLease.CompareAndSwap(false, true) {
			leaseRenewing.Go(func() {
				defer renewingLease.Store(false)
				p.lease.renew(ledgerCtx, p)
			})
		}
		// The claims are renewed side by side, and beside the loop, each
		// bounded by when it is given up, which gives it up if it failed
		// by then: a hanging renewal holds up no other claim's renewal or
		// give-up, nor any job's InProgress but its own, since a claim
		// settled late may be given up later after its renewal begins
		// than one renewed on the beat (see claimGiveUpAt). A job whose
		// renewal is under way is left to it (see inflight.renewing).
		for _, it := range due {
			if it.renewing.CompareAndSwap(false, true) {
				renewals.Go(func() {
					defer it.renewing.Store(false)
					p.renew(ctx, it)
				})
			}
		}
		if !p.cfg.NoLedger {
			h.loseLapsedClaims(p, time.Now())
		}
		if p.leasing && now.Sub(collected) >= p.cfg.lease() && busy.CompareAndSwap(false, true) {
			collected = now
			collecting.Go(func() {
				defer busy.Store(false)
				p.lease.collect(ledgerCtx, p)
			})
		}
	}
}

// restartSlack is what a job's InProgress keeps clear of the end of its
// pool's lease (see heartbeats): the second to which a restart of the
// server rounds its time, and a quarter more.
const restartSlack = 1250 * time.Millisecond

// beatTimes returns how often the heartbeat loop looks (tick: a quarter
// of a heartbeat, at most 250ms) and how long after a job's last
// InProgress its next is due (every): half a heartbeat, or less, but no
// less than tick, so that InProgress come at most a heartbeat less
// restartSlack apart (every + tick), where the ack wait allows (6s or
// more; for 60s, 10s apart).
func beatTimes(heartbeat time.Duration) (tick, every time.Duration) {
	tick = max(min(heartbeat/4, 250*time.Millisecond), 10*time.Millisecond)
	every = max(tick, min(heartbeat/2, heartbeat-tick-restartSlack))
	return tick, every
}

// loseLeased cancels the handlers of the jobs that run on the pool's lease.
// A job on a claim of its own holds its lock while its renewal waits for
// the ledger (up to its own give-up time): the jobs are given up as their
// locks are free, the leased ones, which no renewal holds for long, without
// waiting for it, and the heartbeats' lock is not held meanwhile.
// A job never leased (leaseTok, set under the lease's lock, which the
// caller holds) is not waited for: it is not given up here, and waiting
// for its renewal held the lease's lock that long.
func (h *heartbeats) loseLeased(cause error) {
	h.mu.Lock()
	its := make([]*inflight, 0, len(h.jobs))
	for it := range h.jobs {
		its = append(its, it)
	}
	h.mu.Unlock()
	lose := func(it *inflight) {
		if it.unclaimed && !it.recording {
			it.lose(cause)
		}
		it.mu.Unlock()
	}
	for {
		busy := its[:0]
		for _, it := range its {
			if !it.mu.TryLock() {
				if it.leaseTok != 0 {
					busy = append(busy, it)
				}
				continue
			}
			lose(it)
		}
		if its = busy; len(its) == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// loseLapsedClaims cancels the handlers of the jobs on claims of their own
// that were not renewed in time (see claimGiveUpAt), so that they stop
// before another pool may take the job over. A renewal that fails with an
// error other than a lost claim, such as a timeout, leaves the claim to
// run out.
func (h *heartbeats) loseLapsedClaims(p *Pool, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for it := range h.jobs {
		if it.renewing.Load() {
			continue // the renewal gives the claim up if it fails in time
		}
		it.mu.Lock()
		if !it.recording && !it.unclaimed && it.claim.Revision > 0 && !now.Before(p.claimGiveUpAt(&it.claim)) {
			it.lose(claimLapsed(&it.claim, nil))
		}
		it.mu.Unlock()
	}
}

// claimGiveUpAt is when a job gives up its claim unless it is renewed: a
// sixth of the ack wait before the claim ends, as the pool's lease does
// (see lease.giveUpAt).
func (p *Pool) claimGiveUpAt(c *data.Claim) time.Time {
	return c.Record.LeaseUntil.Add(-p.cfg.heartbeat() / 2)
}

// claimLapsed is why a job gave up its claim; cause is the failed renewal,
// if any.
func claimLapsed(c *data.Claim, cause error) error {
	err := fmt.Errorf("%w: the job's claim could not be renewed before its end (%s)", data.ErrClaimLost, c.Record.LeaseUntil.Format(time.RFC3339))
	if cause != nil {
		err = fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// keepAlive resets the server's ack wait for it. A job whose claim's
// renewal is under way, which holds its lock, gets its InProgress once the
// renewal is over (it stays due).
func (p *Pool) keepAlive(it *inflight) {
	if it.renewing.Load() {
		return
	}
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.closed {
		return
	}
	it.lastBeat = time.Now()
	if err := it.msg.InProgress(); err != nil && !errors.Is(err, errEarlierJOB) {
		p.jobLog(it.job).Warn().Err(err).Msg("heartbeat to server")
	}
}

// renew extends it's claim. A job on the pool's lease has none of its own.
// A renewal that fails, or takes too long, when the claim is to be given
// up (see loseLapsedClaims) gives it up at once.
func (p *Pool) renew(ctx context.Context, it *inflight) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.closed || it.recording || p.cfg.NoLedger || it.claim.Revision == 0 {
		return // no claim to renew (yet, or any more)
	}
	giveUp := p.claimGiveUpAt(&it.claim)
	deadline := time.Now().Add(opTimeout)
	if giveUp.Before(deadline) {
		deadline = giveUp
	}
	opCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	it.renewedTo = time.Now().Add(p.cfg.lease())
	err := p.ledger.Renew(opCtx, &it.claim)
	switch {
	case errors.Is(err, data.ErrClaimLost):
		it.lose(err)
	case err != nil && !time.Now().Before(giveUp):
		it.lose(claimLapsed(&it.claim, err))
	case err != nil:
		p.jobLog(it.job).Warn().Err(err).Msg("renew claim")
	}
}
