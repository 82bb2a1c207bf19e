package queue

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// opTimeout bounds one ledger write or ack after a handler returned. These
// run on a context that shutdown does not cancel, so finished work is
// recorded even while jobq stops.
const opTimeout = 10 * time.Second

// Pool runs jobs from WORKER through a handler, Workers at a time, keeping
// the exactly-once protocol for each:
//
//  1. claim the job in the ledger (a create, or a compare-and-set over an
//     expired claim); a job recorded done is acked without running. A first
//     attempt with no record and no possible copy runs on a prepared claim
//     instead, which its first write creates (see startClaims);
//  2. run the handler, renewing the claim and sending InProgress every
//     AckWait/3 so the job is not redelivered while it runs;
//  3. record the outcome with a compare-and-set on the claim;
//  4. then ack (done, dead-lettered) or Nak with the retry delay.
//
// A crash anywhere leaves the job in JOB unacked, so it is redelivered; the
// ledger then tells whether it is done (ack it) or not (run it again, as a
// resumed attempt if an earlier one never recorded an outcome).
//
// The steps are pipelined so that round trips overlap: a fetcher pulls at
// most as many jobs as the pool has room for (Workers running plus Prefetch
// waiting, being claimed or completed); a claim starter reads the records
// of the fetched jobs in one batch and sends the claims that are needed
// without waiting, at most claimAhead of them before a worker takes one; a
// claimer hands each confirmed claim to a worker; a worker runs the handler
// and starts the completion write; an acker acks each job once its
// completion is confirmed. Every job the pool holds gets heartbeats from one
// loop.
type Pool struct {
	obj     *Objects
	cfg     Config
	ledger  *data.Ledger
	handler handlers.Handler
	log     zerolog.Logger

	tokens chan struct{} // one per job the pool has room for
	bytes  atomic.Int64  // payload bytes of the jobs the pool holds
	// maxBatch and maxPullBytes are WORKER's limits on one pull, if it has
	// any (MaxRequestBatch, MaxRequestMaxBytes): a pull over them fails.
	// So would one that waits longer than MaxRequestExpires, which bounds
	// fetchWait, the pull's wait (cfg.FetchWait otherwise). Used by fetch
	// only; see keepPullLimits.
	maxBatch     int
	maxPullBytes int64
	fetchWait    time.Duration
	// bigAt: a pull came back early and empty, as when the next job does
	// not fit the byte room, while the pool held bigAt bytes; the next pull
	// waits for fewer. -1: none. Used by fetch only.
	bigAt   int64
	fetched chan *inflight // fetched, not yet claimed
	ahead   chan struct{}  // one per claim that may be made before a worker starts it
	claims  chan *inflight // claim on its way
	work    chan *inflight // claimed, waiting for a worker
	dones   chan *inflight // handler done, completion on its way
	beats   *heartbeats
	fresh   freshness
	// readsOff: no batched ledger reads before then, after one failed.
	// Used by startClaims only.
	readsOff time.Time

	running     atomic.Bool
	handling    atomic.Int64 // handlers running now, for InFlight
	fetchCancel context.CancelFunc
	workCancel  context.CancelFunc
	fetchDone   chan struct{}
	finished    chan struct{}
	sweeping    sync.WaitGroup
	holding     sync.WaitGroup // held re-driven jobs (see hold)
	held        atomic.Int64   // how many
	heldBytes   atomic.Int64   // their payload bytes
	heldWake    chan struct{}  // a job became held (see fetch)
	heldMu      sync.Mutex
	heldKeys    map[string]int // their ledger keys
	stopOnce    sync.Once
}

// handlerCtx is a context for handlers and its cancel func.
type handlerCtx struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// inflight is one job on its way through the pool.
type inflight struct {
	msg     jetstream.Msg
	job     *data.Job
	size    int64 // payload bytes, counted in Pool.bytes
	pending *data.PendingClaim
	claim   data.Claim
	write   *data.PendingWrite
	took    time.Duration
	hctx    handlerCtx // the worker's handler context
	// unclaimed: the job had no record and runs on a prepared claim that
	// its first write creates (see startClaims).
	unclaimed bool
	// held: a re-driven job with no record, kept for AckWait before its
	// claim (see hold).
	held bool

	// Guarded by mu: the heartbeat loop renews the claim until the worker
	// takes it back to record the outcome.
	mu       sync.Mutex
	lastBeat time.Time
	closed   bool                    // no more heartbeats
	lost     bool                    // the claim was taken over
	cancel   context.CancelCauseFunc // cancels the running handler
}

// NewPool returns a pool that runs jobs from obj's WORKER through h.
func NewPool(obj *Objects, h handlers.Handler, log zerolog.Logger) *Pool {
	cfg := obj.Config
	capacity := cfg.Workers + cfg.Prefetch
	// The ledger's async writes get a JetStream context of their own whose
	// futures time out, so waiting for one never hangs.
	p := &Pool{
		obj:       obj,
		cfg:       cfg,
		ledger:    data.NewLedger(obj.Ledger, cfg.lease(), obj.JS),
		handler:   h,
		log:       log.With().Str("component", "worker").Logger(),
		tokens:    make(chan struct{}, capacity),
		fetched:   make(chan *inflight, capacity),
		ahead:     make(chan struct{}, claimAhead(cfg.Workers)),
		claims:    make(chan *inflight, capacity),
		work:      make(chan *inflight, capacity),
		dones:     make(chan *inflight, capacity),
		beats:     &heartbeats{jobs: map[*inflight]struct{}{}},
		bigAt:     -1,
		heldWake:  make(chan struct{}, 1),
		fetchWait: cfg.FetchWait,
	}
	if info := obj.Worker.CachedInfo(); info != nil {
		p.keepPullLimits(info.Config)
	}
	return p
}

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

// Start starts the workers and the fetcher. It returns at once; Stop ends
// them.
func (p *Pool) Start(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("worker pool already started")
	}
	sub, seqs, err := p.watchExhausted()
	if err != nil {
		p.running.Store(false)
		return err
	}
	fetchCtx, fetchCancel := context.WithCancel(ctx)
	workCtx, workCancel := context.WithCancel(context.WithoutCancel(ctx))
	p.fetchCancel, p.workCancel = fetchCancel, workCancel
	p.fetchDone, p.finished = make(chan struct{}), make(chan struct{})
	for range cap(p.tokens) {
		p.tokens <- struct{}{}
	}
	for range cap(p.ahead) {
		p.ahead <- struct{}{}
	}

	// Each stage closes the next one's channel when it ends, so Stop
	// drains the pipeline front to back.
	go func() {
		defer close(p.fetchDone)
		defer close(p.fetched)
		p.fetch(fetchCtx)
	}()
	go func() {
		defer close(p.claims)
		p.startClaims(fetchCtx)
	}()
	go func() {
		defer close(p.work)
		p.claimAll(workCtx)
	}()
	var workers sync.WaitGroup
	for range p.cfg.Workers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			p.runAll(workCtx)
		}()
	}
	go func() {
		workers.Wait()
		close(p.dones)
	}()
	go func() {
		defer close(p.finished)
		p.ackAll(workCtx)
	}()
	go p.beats.loop(workCtx, p, p.finished)
	p.sweeping.Add(1)
	go func() {
		defer p.sweeping.Done()
		defer sub.Unsubscribe()
		p.sweeper(fetchCtx, seqs)
	}()
	p.log.Info().Int("workers", p.cfg.Workers).Int("prefetch", p.cfg.Prefetch).Int64("prefetch_bytes", p.cfg.PrefetchBytes).Str("consumer", ConsumerWorker).Bool("ledger", !p.cfg.NoLedger).Msg("workers started")
	return nil
}

// Running reports whether the pool is started and not stopping.
func (p *Pool) Running() bool { return p.running.Load() }

// Stop stops fetching, waits for jobs in flight until ctx ends, then
// cancels their handlers and waits for them to record their outcome. Jobs
// cut off this way are released for redelivery, as resumed attempts.
func (p *Pool) Stop(ctx context.Context) error {
	if p.fetchCancel == nil {
		return nil
	}
	var err error
	p.stopOnce.Do(func() {
		p.running.Store(false)
		p.log.Info().Msg("stop fetching jobs")
		p.fetchCancel()
		<-p.fetchDone
		p.sweeping.Wait()
		select {
		case <-p.finished:
		case <-ctx.Done():
			p.log.Warn().Msg("shutdown timeout reached: cancelling running jobs")
			p.workCancel()
			select {
			case <-p.finished:
			case <-time.After(opTimeout + 5*time.Second):
				err = errors.New("handlers ignored cancellation; their jobs will be redelivered after the ack wait")
			}
		}
		p.workCancel()
		p.ledger.Close()
		p.log.Info().Msg("workers stopped")
	})
	return err
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
		want, budget, alone := p.pullSize(n)
		if want == 0 {
			p.giveBack(n) // a hold ended since takeRoom: no byte room after all
			continue
		}
		p.bigAt = -1
		busy, start := p.busyBytes(), time.Now()
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
			// WORKER's limits may have changed since the pool started.
			opCtx, cancel := context.WithTimeout(ctx, opTimeout)
			if info, ierr := p.obj.Worker.Info(opCtx); ierr == nil {
				p.keepPullLimits(info.Config)
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
		case <-p.heldWake:
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
// room for half of itself, so that pulls are few and large. Held jobs (see
// hold) keep no worker busy.
//
// While the jobs it holds leave no byte room, or no more than when the last
// pull found the next job too big for it (bigAt), it waits for one to
// finish: every job gives back its bytes before its token. A job that
// becomes held makes room too, without a token: it sends heldWake.
func (p *Pool) shortOfRoom(n int) bool {
	busyJobs := cap(p.tokens) - n - len(p.tokens) - int(p.held.Load())
	if n < cap(p.tokens)/2 && busyJobs > 2*p.cfg.Workers {
		return true
	}
	busy := p.busyBytes()
	return n < cap(p.tokens) && busy > 0 && (p.byteRoom() <= 0 || p.bigAt >= 0 && busy >= p.bigAt)
}

// pullSize is what the next pull, with n tokens, asks for: up to want jobs
// of up to budget bytes in all (0: any size), alone if it takes one job
// whatever its size. want is 0 if there is no byte room.
func (p *Pool) pullSize(n int) (want int, budget int64, alone bool) {
	want, budget = n, p.byteRoom()
	switch {
	case p.busyBytes() == 0 && (budget <= 0 || p.bigAt >= 0):
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

// busyBytes is the payload the pool holds, but for held jobs (see hold):
// they keep no worker busy and may not hold up fresh jobs, so they have
// an allowance of PrefetchBytes of their own. Held jobs beyond it count,
// so the pool holds at most twice PrefetchBytes, besides one job larger
// than that taken alone (see pullSize).
func (p *Pool) busyBytes() int64 {
	return p.bytes.Load() - min(p.heldBytes.Load(), p.cfg.PrefetchBytes)
}

// byteRoom is how many more payload bytes the pool may hold.
func (p *Pool) byteRoom() int64 { return p.cfg.PrefetchBytes - p.busyBytes() }

// admit starts a fetched job's claim and queues it.
func (p *Pool) admit(msg jetstream.Msg) {
	job, err := decodeJob(msg)
	if err != nil {
		p.log.Error().Err(err).Str("subject", msg.Subject()).Msg("not a jetstream job; left for redelivery")
		p.release(nil)
		return
	}
	it := &inflight{msg: msg, job: job, size: int64(len(job.Payload))}
	p.bytes.Add(it.size)
	p.beats.add(it) // InProgress while it waits, so it is not redelivered
	if p.cfg.NoLedger {
		p.work <- it
		return
	}
	p.fetched <- it
}

// claimAhead is how many claims may be made ahead of the workers: enough to
// keep them busy while claims travel, few enough that a crash leaves few
// claimed jobs that never started (they come back as resumed attempts).
func claimAhead(workers int) int { return max(8*workers, 32) }

// checkBatch is the most fetched jobs one batched ledger read covers.
const checkBatch = 256

// startClaims passes fetched jobs on to be claimed, in order. It takes the
// jobs that are waiting, reads their ledger records in one batch, and lets
// each job that has none and cannot have a second copy in JOB (see
// markUnclaimed and freshness) run on a prepared claim, which its completion write
// creates: one ledger write per job on the happy path. Every other job is
// claimed before it runs, at most claimAhead of them before a worker takes
// one.
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
		p.markUnclaimed(batch)
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

// processOne takes one fetched job through every step in turn, without the
// pipeline: for jobq next.
func (p *Pool) processOne(ctx context.Context, msg jetstream.Msg) {
	job, err := decodeJob(msg)
	if err != nil {
		p.log.Error().Err(err).Str("subject", msg.Subject()).Msg("not a jetstream job; left for redelivery")
		return
	}
	it := &inflight{msg: msg, job: job}
	if !p.cfg.NoLedger && !p.claimed(ctx, it) {
		return
	}
	if !p.runOne(ctx, it) {
		return
	}
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	if err := it.write.Wait(opCtx); err != nil {
		p.recordFailed(msg, job, err, *p.jobLog(job))
		return
	}
	p.cfg.Metrics.jobCompleted(job.Subject)
	p.observe(job, data.StateDone, it.took, nil)
	p.ack(opCtx, msg, *p.jobLog(job))
}

// release frees one job's room in the pool: its bytes, then its token.
// it is nil for a message that was never admitted.
func (p *Pool) release(it *inflight) {
	if it != nil {
		p.bytes.Add(-it.size)
	}
	p.tokens <- struct{}{}
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

// jobLog returns a logger with job's fields. It is built only when a job
// has something to say: most jobs log nothing.
func (p *Pool) jobLog(job *data.Job) *zerolog.Logger {
	l := p.log.With().Str("job_id", job.ID).Str("subject", job.Subject).Uint64("seq", job.Seq).Int("attempt", job.Attempt).Logger()
	return &l
}

// runAll runs claimed jobs until the claimer closes the work channel.
func (p *Pool) runAll(ctx context.Context) {
	// A worker's handler context lives across jobs: a new one only after a
	// lost claim cancelled it, so a job costs no context of its own.
	var h handlerCtx
	defer func() {
		if h.cancel != nil {
			h.cancel(nil)
		}
	}()
	for it := range p.work {
		if h.ctx == nil || h.ctx.Err() != nil && ctx.Err() == nil {
			if h.cancel != nil {
				h.cancel(nil)
			}
			h.ctx, h.cancel = context.WithCancelCause(ctx)
		}
		it.hctx = h
		if !p.cfg.NoLedger && !it.unclaimed {
			p.ahead <- struct{}{}
		}
		if p.runOne(ctx, it) {
			p.dones <- it
			continue
		}
		p.release(it)
	}
}

// runOne runs one claimed job and records a failure. It reports whether the
// job succeeded and its completion is on its way (for the acker).
func (p *Pool) runOne(ctx context.Context, it *inflight) bool {
	if ctx.Err() != nil {
		// Claimed, but shutdown came before a worker: hand it back.
		p.beats.remove(it)
		p.releaseUnstarted(it)
		return false
	}
	it.mu.Lock()
	lost := it.lost
	it.mu.Unlock()
	if lost {
		p.beats.remove(it)
		p.jobLog(it.job).Warn().Msg("claim lost before the job started: left to the new holder")
		return false
	}
	p.cfg.Metrics.jobStarted(it.job.Subject, it.job.Attempt, it.job.EnqueuedAt)
	start := time.Now()
	p.handling.Add(1)
	herr := p.run(ctx, it)
	p.handling.Add(-1)
	it.took = time.Since(start)
	p.cfg.Metrics.jobHandled(it.job.Subject, it.took)
	p.beats.remove(it) // from here the claim is this worker's alone

	switch {
	case herr == nil && p.cfg.NoLedger:
		p.cfg.Metrics.jobCompleted(it.job.Subject)
		p.observe(it.job, data.StateDone, it.took, nil)
		if err := it.msg.Ack(); err != nil {
			p.jobLog(it.job).Warn().Err(err).Msg("ack job: it will run again")
		}
		return false
	case herr == nil:
		w, err := p.ledger.DoneAsync(&it.claim, it.took)
		if err != nil {
			p.recordFailed(it.msg, it.job, err, *p.jobLog(it.job))
			return false
		}
		it.write = w
		return true
	}
	log := p.jobLog(it.job).With().Dur("took", it.took).Logger()
	switch {
	case errors.Is(herr, data.ErrClaimLost):
		log.Warn().Err(herr).Msg("claim lost while running: outcome left to the new holder")
	case ctx.Err() != nil && !handlers.IsPermanent(herr):
		p.cutOff(it, it.took, herr)
	default:
		var claim *data.Claim
		if !p.cfg.NoLedger {
			claim = &it.claim
		}
		opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		defer cancel()
		p.fail(opCtx, it.msg, it.job, claim, it.took, herr, log)
	}
	return false
}

// cutOff releases a job that shutdown stopped, for another run.
func (p *Pool) cutOff(it *inflight, took time.Duration, cause error) {
	if !p.cfg.NoLedger {
		opCtx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := p.ledger.Retry(opCtx, &it.claim, took, data.CauseCutOff); err != nil {
			p.recordFailed(it.msg, it.job, err, *p.jobLog(it.job))
			return
		}
	}
	p.jobLog(it.job).Warn().Err(cause).Msg("job cut off by shutdown: released")
	p.nak(it.msg, 0, *p.jobLog(it.job))
}

// releaseUnstarted hands back a claimed job whose handler never started:
// its next attempt is not counted as resumed on its account.
func (p *Pool) releaseUnstarted(it *inflight) {
	if !p.cfg.NoLedger {
		opCtx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := p.ledger.Release(opCtx, &it.claim); err != nil {
			p.recordFailed(it.msg, it.job, err, *p.jobLog(it.job))
			return
		}
	}
	p.jobLog(it.job).Info().Msg("job released by shutdown before it started")
	p.nak(it.msg, 0, *p.jobLog(it.job))
}

// ackAll acks each job once its completion is confirmed. ctx has no
// deadline: each write's future times out by itself.
func (p *Pool) ackAll(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for it := range p.dones {
		if err := it.write.Wait(ctx); err != nil {
			p.recordFailed(it.msg, it.job, err, p.jobLog(it.job).With().Dur("took", it.took).Logger())
			p.release(it)
			continue
		}
		p.cfg.Metrics.jobCompleted(it.job.Subject)
		p.observe(it.job, data.StateDone, it.took, nil)
		if err := it.msg.Ack(); err != nil {
			// A lost ack is harmless: the redelivery finds the job done.
			p.jobLog(it.job).Warn().Err(err).Msg("ack job: it will be redelivered and skipped")
		}
		p.release(it)
	}
}

// fail handles a failed attempt: retry with backoff, or dead-letter when the
// error is permanent or this was the last delivery.
func (p *Pool) fail(ctx context.Context, msg jetstream.Msg, job *data.Job, claim *data.Claim, took time.Duration, cause error, log zerolog.Logger) {
	ev := func(e *zerolog.Event) *zerolog.Event {
		var pe *panicError
		if errors.As(cause, &pe) {
			e = e.Bytes("stack", pe.stack)
		}
		return e.Err(cause)
	}
	if !handlers.IsPermanent(cause) && job.Attempt < p.cfg.MaxDeliver {
		delay := p.cfg.backoff(job.Attempt)
		if claim != nil {
			if err := p.ledger.Retry(ctx, claim, took, cause.Error()); err != nil {
				p.recordFailed(msg, job, err, log)
				return
			}
		}
		ev(log.Warn()).Dur("retry_in", delay).Msg("job failed: will retry")
		p.cfg.Metrics.jobRetried(job.Subject)
		p.observe(job, data.StateRetrying, took, cause)
		p.nak(msg, delay, log)
		return
	}
	if err := p.deadLetter(ctx, msg, job, cause); err != nil {
		log.Error().Err(err).AnErr("cause", cause).Msg("dead-letter job: left in JOB for the sweep")
		return
	}
	p.cfg.Metrics.jobDeadLettered(job.Subject)
	p.observe(job, data.StateFailed, took, cause)
	var err error
	switch {
	case claim != nil:
		err = p.ledger.Fail(ctx, claim, took, cause.Error())
	case !p.cfg.NoLedger:
		err = p.ledger.FailUnclaimed(ctx, job, cause.Error())
	}
	if err != nil {
		// The dead letter is stored; the ledger only explains it.
		log.Error().Err(err).Msg("record dead-lettered job")
	}
	p.ack(ctx, msg, log)
	ev(log.Error()).Msg("job dead-lettered")
}

// recordFailed handles a ledger write that failed after the handler ran. The
// job stays unacked: its redelivery decides again from the ledger.
func (p *Pool) recordFailed(msg jetstream.Msg, job *data.Job, err error, log zerolog.Logger) {
	if errors.Is(err, data.ErrClaimLost) {
		log.Warn().Err(err).Msg("claim lost before the outcome was recorded: outcome left to the new holder")
		return
	}
	log.Error().Err(err).Msg("record job outcome: job will be redelivered")
	p.nak(msg, p.cfg.backoff(job.Attempt), log)
}

// run calls the handler with a timeout and panic recovery. The heartbeat
// loop cancels it if the claim is lost.
func (p *Pool) run(ctx context.Context, it *inflight) error {
	hctx := it.hctx.ctx
	if hctx == nil { // jobq next: no worker loop
		var cancel context.CancelCauseFunc
		hctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		it.hctx.cancel = cancel
	}
	it.mu.Lock()
	it.cancel = it.hctx.cancel
	it.mu.Unlock()
	base := hctx
	if p.cfg.JobTimeout > 0 {
		var c context.CancelFunc
		hctx, c = context.WithTimeoutCause(hctx, p.cfg.JobTimeout, fmt.Errorf("job timeout %s reached", p.cfg.JobTimeout))
		defer c()
	}
	err := p.call(hctx, it.job)
	if cause := context.Cause(base); errors.Is(cause, data.ErrClaimLost) {
		return cause
	}
	if err != nil && hctx.Err() != nil && ctx.Err() == nil {
		// The job timeout ended the attempt.
		err = fmt.Errorf("%w: %w", context.Cause(hctx), err)
	}
	return err
}

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
		for _, it := range due {
			p.beat(ctx, it)
		}
	}
}

func (p *Pool) beat(ctx context.Context, it *inflight) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.closed {
		return
	}
	it.lastBeat = time.Now()
	if err := it.msg.InProgress(); err != nil {
		p.jobLog(it.job).Warn().Err(err).Msg("heartbeat to server")
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

// call runs the handler, turning a panic into an error with its stack.
func (p *Pool) call(ctx context.Context, job *data.Job) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &panicError{value: r, stack: debug.Stack()}
		}
	}()
	return p.handler.Process(ctx, job)
}

type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("handler panic: %v", e.value) }

func (p *Pool) ack(ctx context.Context, msg jetstream.Msg, log zerolog.Logger) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	if err := msg.DoubleAck(actx); err != nil {
		// The outcome is recorded: a redelivery is acked without running.
		log.Error().Err(err).Msg("ack job: it will be redelivered and skipped")
	}
}

func (p *Pool) nak(msg jetstream.Msg, delay time.Duration, log zerolog.Logger) {
	var err error
	if delay > 0 {
		err = msg.NakWithDelay(delay)
	} else {
		err = msg.Nak()
	}
	if err != nil {
		log.Warn().Err(err).Msg("release job: it will be redelivered after the ack wait")
	}
}

// decodeJob builds the handler's view of a delivered message.
func decodeJob(msg jetstream.Msg) (*data.Job, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return nil, fmt.Errorf("read job metadata: %w", err)
	}
	h := msg.Headers()
	return &data.Job{
		ID:         jobID(h, meta.Sequence.Stream),
		Subject:    msg.Subject(),
		Seq:        meta.Sequence.Stream,
		Attempt:    int(meta.NumDelivered),
		Payload:    msg.Data(),
		Header:     h,
		EnqueuedAt: meta.Timestamp,
	}, nil
}

// jobID is a message's job ID: Jobq-Job-Id (set on re-driven dead letters),
// else Nats-Msg-Id, else its stream sequence.
func jobID(h nats.Header, seq uint64) string {
	if id := h.Get(HeaderJobID); id != "" {
		return id
	}
	if id := h.Get(nats.MsgIdHdr); id != "" {
		return id
	}
	return data.SeqID(seq)
}
