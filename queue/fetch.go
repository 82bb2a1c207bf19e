package queue

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// keepPullLimits makes the fetcher's pulls keep to WORKER's limits on one
// pull, if it has any: a pull over them fails. Used by fetch only, once
// started.
func (p *Pool) keepPullLimits(c jetstream.ConsumerConfig) {
	p.maxBatch, p.maxPullBytes = c.MaxRequestBatch, int64(c.MaxRequestMaxBytes)
	p.fetchWait = p.cfg.FetchWait
	if c.MaxRequestExpires > 0 && c.MaxRequestExpires < p.fetchWait {
		p.fetchWait = c.MaxRequestExpires
	}
}

// fetch pulls at most as many jobs as the pool has room for, and at most
// as many payload bytes (PrefetchBytes), so that no job waits long in a
// buffer while its ack wait runs and large payloads do not fill memory.
func (p *Pool) fetch(ctx context.Context) {
	for ctx.Err() == nil { // a pool with room would pull on after Stop otherwise
		n, ok := p.takeRoom(ctx)
		if !ok {
			return
		}
		// Jobs held for their records take their room back first.
		if n -= p.held.charge(n); n == 0 {
			continue
		}
		want, budget, alone := p.pullSize(n)
		if want == 0 {
			p.giveBack(n) // no byte room after all
			continue
		}
		p.bigAt = -1
		busy, start := p.bytes.Load(), time.Now()
		got, err := p.fetchBatch(ctx, want, budget)
		p.giveBack(n - got)
		if got > 0 || time.Since(start) >= p.fetchWait/2 {
			continue
		}
		// The pull ended early with no job. Without an error, the server
		// ended it because the next job does not fit the byte budget: the
		// next pull waits for room, or takes the job alone. Otherwise, as
		// when even alone it does not fit WORKER's limit, wait before the
		// next pull rather than spin.
		switch {
		case err == nil && budget > 0 && !alone:
			p.bigAt = busy
			continue
		case err == nil && budget > 0:
			p.log.Warn().Int64("max_request_max_bytes", p.maxPullBytes).Msg("the next job is larger than WORKER's limit on one pull; raise it with nats consumer edit")
		case err != nil:
			// WORKER's limits may have changed since the pool started, or
			// WORKER may be gone.
			opCtx, cancel := context.WithTimeout(ctx, opTimeout)
			info, ierr := p.obj.Worker.Info(opCtx)
			switch {
			case ierr == nil:
				p.keepPullLimits(info.Config)
			case errors.Is(ierr, jetstream.ErrConsumerNotFound):
				p.makeWorkerAnew(opCtx)
			}
			cancel()
		}
		select {
		case <-time.After(p.fetchWait):
		case <-ctx.Done():
		}
	}
}

// takeRoom waits until the pool has room for a pull (see shortOfRoom) and
// takes it: it returns how many tokens it took, or false once ctx ends.
func (p *Pool) takeRoom(ctx context.Context) (int, bool) {
	select {
	case <-p.tokens:
	case <-ctx.Done():
		return 0, false
	}
	n := 1
	for p.shortOfRoom(n) {
		select {
		case <-p.tokens:
			n++
		case <-ctx.Done():
			p.giveBack(n)
			return 0, false
		}
	}
	for n < cap(p.tokens) {
		select {
		case <-p.tokens:
			n++
		default:
			return n, true
		}
	}
	return n, true
}

// shortOfRoom reports whether the fetcher, holding n tokens, waits for more
// room before it pulls.
//
// While the pool holds enough jobs to keep its workers busy, it waits for
// room for a quarter of itself, so that pulls are few and large. Waiting
// for half left the workers short: a pull's round trip, and the ledger
// check and lease write of its jobs, took longer than the jobs held
// lasted, and a pool of 520 had about 120 tokens unused at any moment
// (end to end, 6-7% slower in interleaved rounds of BenchmarkEndToEnd).
//
// While the jobs it holds leave no byte room, or no more than when the last
// pull found the next job too big for it (bigAt), it waits for one to
// finish: every job gives back its bytes before its token.
func (p *Pool) shortOfRoom(n int) bool {
	busyJobs := cap(p.tokens) - n - len(p.tokens)
	if n < cap(p.tokens)/4 && busyJobs > 2*p.cfg.Workers {
		return true
	}
	busy := p.bytes.Load()
	return n < cap(p.tokens) && busy > 0 && (p.byteRoom() <= 0 || p.bigAt >= 0 && busy >= p.bigAt)
}

// pullSize is what the next pull, with n tokens, asks for: up to want jobs
// of up to budget bytes in all (0: any size), alone if it takes one job
// whatever its size. want is 0 if there is no byte room.
func (p *Pool) pullSize(n int) (want int, budget int64, alone bool) {
	want, budget = n, p.byteRoom()
	switch {
	case p.bytes.Load() == 0 && (budget <= 0 || p.bigAt >= 0):
		// A pool that holds no payload takes the next job whatever its
		// size, alone.
		want, budget, alone = 1, 0, true
	case budget <= 0:
		return 0, 0, false
	}
	if p.maxBatch > 0 {
		want = min(want, p.maxBatch)
	}
	if p.maxPullBytes > 0 && (budget <= 0 || budget > p.maxPullBytes) {
		budget = p.maxPullBytes
	}
	return want, budget, alone
}

// giveBack returns n tokens the fetcher took and did not use.
func (p *Pool) giveBack(n int) {
	for range n {
		p.tokens <- struct{}{}
	}
}

// byteRoom is how many more payload bytes the pool may hold.
func (p *Pool) byteRoom() int64 { return p.cfg.PrefetchBytes - p.bytes.Load() }

// admit starts a fetched job's claim and queues it: one of a pull sent
// while the pool knew of JOB of (see jobStream).
func (p *Pool) admit(m *nats.Msg, of int64) {
	it := new(inflight)
	it.jm.init(m)
	it.jm.stream, it.jm.of = p.stream, of
	it.msg = &it.jm
	if err := decodeJobInto(&it.jobv, it.msg); err != nil {
		p.log.Error().Err(err).Str("subject", m.Subject).Msg("not a jetstream job; left for redelivery")
		p.release(nil)
		return
	}
	it.job, it.size = &it.jobv, int64(len(it.jobv.Payload))
	p.bytes.Add(it.size)
	p.acks.add(it)
	if p.cfg.Replicas > 1 {
		// The first InProgress now, not with the heartbeats an ack
		// wait/3 from now: until one is agreed on, a replicated WORKER's
		// followers keep the time the job was stored in JOB for the time
		// of its delivery (nats-server 2.15), and a leader elected
		// meanwhile delivers a job that waited there longer than the ack
		// wait again at once, a delivery spent while this pool holds it.
		// Sent before the heartbeats know of it, which then go on.
		if err := it.msg.InProgress(); err != nil && !errors.Is(err, errEarlierJOB) {
			p.jobLog(it.job).Warn().Err(err).Msg("heartbeat to server")
		}
	}
	p.beats.add(it) // InProgress while it waits, so it is not redelivered
	if p.cfg.NoLedger {
		p.work <- it
		return
	}
	p.fetched <- it
}

// makeWorkerAnew creates WORKER again, as Provision does, once someone
// deleted it (nats consumer rm JOB WORKER): pulls would find nothing
// otherwise, for good. The pool's consumer handles name WORKER, so they
// reach the new one. It delivers every stored job from the start, those
// this pool holds among them: the ledger and the leases keep each to one
// run, as for any redelivery.
func (p *Pool) makeWorkerAnew(ctx context.Context) {
	_, change, err := ensureConsumer(ctx, p.obj.JS, p.cfg, p.log)
	switch {
	case err == nil && change == "":
		// Another pool made it first, with its own settings or jobq's.
		p.log.Warn().Msg("consumer " + ConsumerWorker + " was deleted: another pool created it again")
	case errors.Is(err, ErrConflict):
		p.log.Error().Err(conflictAfter(err, nil)).Msg("consumer " + ConsumerWorker + " was deleted and another client made it again, as jobq cannot use it: no job is fetched until it is put right")
	case err != nil && ctx.Err() != nil:
		// Stop cut it off: the next start provisions it.
		p.log.Warn().Msg("consumer " + ConsumerWorker + " was deleted, and the pool stopped before it was made again; jobq makes it at its next start")
	case err != nil:
		p.log.Error().Err(err).Msg("consumer " + ConsumerWorker + " is gone and could not be created again; restart jobq")
	case strings.HasSuffix(change, wasUpdated):
		p.log.Warn().Msg("consumer " + ConsumerWorker + " was deleted and another client made it again: its settings were put back to jobq's")
	default:
		p.log.Warn().Msg("consumer " + ConsumerWorker + " was deleted: created it again")
	}
}
