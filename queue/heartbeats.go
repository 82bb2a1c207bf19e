package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jobq/jobq/data"
)

// heartbeats keeps the leases of claimed and running jobs: every AckWait/3
// each gets InProgress, which resets the server's ack wait, and a renewal of
// its ledger claim. A lost claim cancels the job's handler. One loop serves
// all jobs, so a job costs no goroutine of its own.
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

func (h *heartbeats) loop(ctx context.Context, p *Pool, done <-chan struct{}) {
	every := p.cfg.heartbeat()
	t := time.NewTicker(max(every/4, 10*time.Millisecond))
	defer t.Stop()
	var due []*inflight
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
		// Every due job's InProgress goes out before any claim renewal, so a
		// slow ledger write delays no job's keep-alive to the server.
		for _, it := range due {
			p.keepAlive(it)
		}
		for _, it := range due {
			p.renew(ctx, it)
		}
	}
}

// keepAlive resets the server's ack wait for it.
func (p *Pool) keepAlive(it *inflight) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.closed {
		return
	}
	it.lastBeat = time.Now()
	if err := it.msg.InProgress(); err != nil {
		p.jobLog(it.job).Warn().Err(err).Msg("heartbeat to server")
	}
}

// renew extends it's claim, or writes it if it is a prepared one.
func (p *Pool) renew(ctx context.Context, it *inflight) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.closed {
		return
	}
	lazy := it.unclaimed && it.claim.Revision == 0
	if p.cfg.NoLedger || it.claim.Revision == 0 && !lazy {
		return // no claim to renew (yet)
	}
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	// A prepared claim is written now: from here another copy of the job
	// finds it. One that cannot be written ends the attempt, as a lost one
	// does, since a copy would not see it.
	err := p.ledger.Renew(opCtx, &it.claim)
	if lazy && err != nil && !errors.Is(err, data.ErrClaimLost) {
		err = fmt.Errorf("%w: %w", data.ErrClaimLost, err)
	}
	if errors.Is(err, data.ErrClaimLost) {
		it.closed, it.lost = true, true
		if it.cancel != nil {
			it.cancel(err)
		}
		return
	}
	if err != nil {
		p.jobLog(it.job).Warn().Err(err).Msg("renew claim")
	}
}
