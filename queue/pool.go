package queue

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
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
//  1. claim the job in the ledger: a job with no record and in no lease
//     goes into the pool's lease, one write for a fetched batch, and its
//     first write after that creates its record (see admitBatch); any
//     other job is claimed with a compare-and-set on its record, and one
//     recorded done is acked without running;
//  2. run the handler, renewing the claim or the lease and sending
//     InProgress every AckWait/3 so the job is not redelivered while it
//     runs;
//  3. record the outcome with a compare-and-set on the claim; for a job
//     that failed for good, the record that it awaits its dead letter,
//     then its dead letter, then its failed record (see fail);
//  4. then ack (done, dead-lettered) or Nak with the retry delay.
//
// A crash anywhere leaves the job in JOB unacked, so it is redelivered; the
// ledger then tells whether it is done (ack it) or not (run it again, as a
// resumed attempt if an earlier one never recorded an outcome).
//
// The steps are pipelined so that round trips overlap: a fetcher pulls at
// most as many jobs as the pool has room for (Workers running plus Prefetch
// waiting, being claimed or completed); a claim starter reads the records
// of the fetched jobs and the leases in one batch, writes the pool's lease
// and sends the claims that are needed without waiting, at most claimAhead
// of them before a worker takes one; a
// claimer hands each confirmed claim to a worker; a worker runs the handler
// and starts the completion write; an acker acks each job once its
// completion is confirmed. Every job the pool holds gets heartbeats from one
// loop. The fetcher is in fetch.go and pull.go, the claim starter and the
// claimer in claims.go and lease.go, the heartbeats in heartbeats.go; the
// workers and the acker are here.
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
	lease   *lease
	// leasing: the server takes lease writes (see data's Leases); with
	// one too old, every job is claimed first.
	leasing bool
	// leasingErr: NewPool could not tell whether to lease; Start and Next
	// ask again, and fail if they cannot tell either.
	leasingErr error

	// stream tells the jobs that may be of an earlier JOB, deleted since
	// they were fetched, which get no ack, Nak or Term (see errEarlierJOB).
	stream *jobStream

	running     atomic.Bool
	stopping    atomic.Bool   // Stop began: no handler starts any more
	halt        chan struct{} // closed when Stop begins, for the jobs waiting on the ledger
	handling    atomic.Int64  // handlers running now, for InFlight
	fetchCancel context.CancelFunc
	workCancel  context.CancelFunc
	fetchDone   chan struct{}
	finished    chan struct{}
	beatCancel  context.CancelFunc // ends the heartbeat loop's ledger calls
	beatsDone   chan struct{}      // closed when the heartbeat loop ended
	sweeping    sync.WaitGroup
	sweepSettle time.Duration  // between the sweep's two looks (see sweep)
	sweepChunk  int            // jobs looked at twice at a time (see sweep)
	recording   sync.WaitGroup // keepRecording, which the acker waits for
	held        held           // jobs in keepRecording, and the room they take
	life        sync.Mutex     // Start's last steps, and Stop's first
	stopOnce    sync.Once
	stopped     chan struct{} // closed when Stop's shutdown is done
	stopErr     error         // its outcome, set before stopped closes
	cut         chan struct{} // closed when a Stop's ctx ended first
	cutOnce     sync.Once
	acks        *ackOrder // the acks of fetched jobs, in order
}

// handlerCtx is a context for handlers and its cancel func.
type handlerCtx struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// inflight is one job on its way through the pool.
type inflight struct {
	msg     jetstream.Msg
	job     *data.Job // &jobv for a fetched job
	jobv    data.Job  // in the same allocation, as jm is
	jm      jobMsg    // msg, for a fetched job
	size    int64     // payload bytes, counted in Pool.bytes
	pending *data.PendingClaim
	claim   data.Claim
	write   *data.PendingWrite
	start   time.Time // its handler's start
	handled bool      // its handler returned (see worker)
	took    time.Duration
	hctx    handlerCtx // the worker's handler context
	// unclaimed: the job had no record and runs on the pool's lease, with
	// a prepared claim that its first write turns into its record (see
	// admitBatch).
	unclaimed bool
	// leaseTok names its entry in the pool's lease (see leased.tok); set
	// with unclaimed.
	leaseTok uint64
	// ran: its handler started.
	ran bool
	// superseded: its prepared claim's first write found another record,
	// which decides from there on.
	superseded bool
	// roomBack: its handler succeeded and it gave its room in the pool
	// back; it waits only for its record and its ack (see runAll).
	roomBack bool
	// recording: its handler succeeded and its done record is on its way
	// (guarded by mu). The heartbeat loop sends its InProgress still, but
	// neither renews nor gives up its claim or lease: the claim is its
	// worker's alone, and there is no handler to stop.
	recording bool
	// renewedTo is the end of the claim's last renewal sent, which may
	// have landed though its answer was lost: the stored claim may end
	// then, later than claim says (see unrecorded).
	renewedTo time.Time
	// sendErr: its handler succeeded and its done record could not be
	// sent, or, without the ledger, its ack (for jobq next, which reports
	// it).
	sendErr error
	// ack is its state in the pool's ackOrder, ackPlace its place there,
	// ackAt when it began to wait there, done (guarded by the ackOrder's
	// lock).
	ack      uint8
	ackPlace uint64
	ackAt    time.Time

	// renewing: the heartbeat loop's renewal of its claim is under way,
	// holding mu. Set only by the loop, which so neither waits for mu
	// meanwhile nor starts another renewal.
	renewing atomic.Bool

	// Guarded by mu: the heartbeat loop renews the claim until the worker
	// takes it back to record the outcome.
	mu       sync.Mutex
	lastBeat time.Time
	closed   bool                    // no more heartbeats
	lost     bool                    // the claim was taken over
	cancel   context.CancelCauseFunc // cancels the running handler
}

// lose marks its claim, or its place in the pool's lease, lost for cause,
// which wraps data.ErrClaimLost: no more heartbeats, and its handler is
// cancelled if it started; if not, it does not start (see runOne). it.mu
// is held.
func (it *inflight) lose(cause error) {
	if it.closed {
		return
	}
	it.closed, it.lost = true, true
	if it.cancel != nil {
		it.cancel(cause)
	}
}

// jobStreamCreated looks up when JOB was created, for the ledger to tell
// an earlier JOB's jobs' records (see data.Ledger.SetJobStreamCreated).
func jobStreamCreated(js jetstream.JetStream) func(context.Context) (time.Time, error) {
	return func(ctx context.Context) (time.Time, error) {
		s, err := js.Stream(ctx, StreamJob)
		if err != nil {
			return time.Time{}, err
		}
		return s.CachedInfo().Created, nil
	}
}

// unsent logs a job's ack or Nak that was not sent, for a job that may be
// of a JOB deleted since (see errEarlierJOB), and reports whether err says
// so; other errors it leaves to its caller.
func unsent(err error, log *zerolog.Logger) bool {
	if !errors.Is(err, errEarlierJOB) {
		return false
	}
	log.Warn().Err(err).Msg("ack not sent: unless JOB was made anew, the job is delivered again after the ack wait")
	return true
}

// NewPool returns a pool that runs jobs from obj's WORKER through h.
func NewPool(obj *Objects, h handlers.Handler, log zerolog.Logger) *Pool {
	cfg := obj.Config
	capacity := cfg.Workers + cfg.Prefetch
	// The ledger's async writes get a JetStream context of their own whose
	// futures time out, so waiting for one never hangs.
	p := &Pool{
		obj:     obj,
		cfg:     cfg,
		ledger:  data.NewLedger(obj.Ledger, cfg.lease(), obj.JS),
		handler: h,
		log:     log.With().Str("component", "worker").Logger(),
		tokens:  make(chan struct{}, capacity),
		fetched: make(chan *inflight, capacity),
		ahead:   make(chan struct{}, claimAhead(cfg.Workers)),
		claims:  make(chan *inflight, capacity),
		work:    make(chan *inflight, capacity),
		// Jobs waiting for their record hold no room (see giveRoomBack):
		// with those in dones, the acker's and the workers' own, the jobs
		// delivered and not acked stay within twice the room, WORKER's
		// MaxAckPending.
		dones:       make(chan *inflight, max(cfg.Prefetch-1, 1)),
		beats:       &heartbeats{jobs: map[*inflight]struct{}{}},
		lease:       newLease(),
		bigAt:       -1,
		fetchWait:   cfg.FetchWait,
		sweepSettle: sweepSettle,
		sweepChunk:  sweepChunk,
	}
	if !cfg.NoLedger {
		p.leasing, p.leasingErr = takesLeases(obj)
	}
	if info := obj.Worker.CachedInfo(); info != nil {
		p.keepPullLimits(info.Config)
	}
	p.acks = newAckOrder(p.sendAck, ackHold)
	p.ledger.SetJobStreamCreated(jobStreamCreated(obj.JS))
	p.stream = newJobStream(obj, false)
	p.lease.max = leaseBytes(obj.JS.Conn().MaxPayload())
	return p
}

// Start starts the workers and the fetcher. It returns at once; Stop ends
// them.
func (p *Pool) Start(ctx context.Context) error {
	if p.stopping.Load() { // Stop was called
		return errPoolStopped
	}
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("worker pool already started")
	}
	if err := p.settleProtocol(ctx); err != nil {
		p.running.Store(false)
		return err
	}
	sub, seqs, err := p.watchExhausted()
	if err != nil {
		p.running.Store(false)
		return err
	}
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	watched, err := p.stream.watch(watchCtx)
	if err != nil {
		stopWatch()
		p.running.Store(false)
		sub.Unsubscribe()
		return err
	}
	// From here on nothing waits: a Stop meanwhile, which waits for the
	// lock, finds the pool started, or Start finds it called.
	p.life.Lock()
	defer p.life.Unlock()
	if p.stopping.Load() {
		p.running.Store(false)
		sub.Unsubscribe()
		stopWatch()
		<-watched
		return errPoolStopped
	}
	fetchCtx, fetchCancel := context.WithCancel(ctx)
	workCtx, workCancel := context.WithCancel(context.WithoutCancel(ctx))
	p.fetchCancel, p.workCancel = fetchCancel, workCancel
	p.fetchDone, p.finished, p.halt = make(chan struct{}), make(chan struct{}), make(chan struct{})
	p.stopped, p.cut = make(chan struct{}), make(chan struct{})
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
		// The jobs fetched before Stop are still admitted: those on their
		// last delivery run (see keepAtStop).
		p.startClaims(workCtx)
	}()
	go func() {
		defer close(p.work)
		p.claimAll(workCtx)
	}()
	var workers sync.WaitGroup
	for range p.cfg.Workers {
		workers.Add(1)
		go p.worker(workCtx, &workers)
	}
	go func() {
		workers.Wait()
		close(p.dones)
	}()
	go func() {
		defer close(p.finished)
		defer func() { // no job is acked after the acker's
			stopWatch()
			<-watched
		}()
		p.ackAll(workCtx)
	}()
	beatCtx, beatCancel := context.WithCancel(context.WithoutCancel(ctx))
	p.beatCancel, p.beatsDone = beatCancel, make(chan struct{})
	go func() {
		defer close(p.beatsDone)
		p.beats.loop(workCtx, beatCtx, p, p.finished)
	}()
	p.sweeping.Add(1)
	go func() {
		defer p.sweeping.Done()
		defer sub.Unsubscribe()
		p.sweeper(fetchCtx, workCtx, seqs)
	}()
	p.log.Info().Int("workers", p.cfg.Workers).Int("prefetch", p.cfg.Prefetch).Int64("prefetch_bytes", p.cfg.PrefetchBytes).Str("consumer", ConsumerWorker).Bool("ledger", !p.cfg.NoLedger).Msg("workers started")
	return nil
}

// errPoolStopped: Start after Stop; a pool runs once.
var errPoolStopped = errors.New("worker pool stopped: make a new one to start again")

// Running reports whether the pool is started and not stopping.
func (p *Pool) Running() bool { return p.running.Load() }

// Stop stops fetching and starting jobs: those fetched and not started are
// handed back as they were, but for those on their last delivery, which run
// if a worker is free for them before ctx ends (see keepAtStop), and those
// waiting out a claim that may be their own (see claimed). It waits for the
// running jobs until ctx ends, then cancels their handlers and waits for
// them to record their outcome. Jobs cut off this way, and those still
// waiting then, are released for redelivery; those cut off as resumed
// attempts.
//
// Stop may be called more than once, and at once: the pool stops once, and
// each call returns its outcome. The first ctx to end, any call's, cuts
// the running jobs off.
//
// Stop waits for the pool's goroutines: a handler or an Observer that calls
// it waits for itself, until ctx ends and then the cut-off's bound, or for
// good under a ctx that never ends. From there, stop the pool in a
// goroutine of its own: go pool.Stop(ctx).
func (p *Pool) Stop(ctx context.Context) error {
	p.life.Lock()
	p.stopping.Store(true) // no handler starts any more, nor the pool
	started := p.fetchCancel != nil
	if started {
		p.stopOnce.Do(func() { go p.shutdown() })
	}
	p.life.Unlock()
	if !started {
		return nil
	}
	select {
	case <-p.stopped:
	case <-ctx.Done():
		p.cutOnce.Do(func() { close(p.cut) })
		<-p.stopped // bounded: see shutdown
	}
	return p.stopErr
}

// shutdown stops the pool for Stop, and closes stopped once it is done.
// Once cut is closed, it cancels the handlers and waits for them to record
// their outcome at most opTimeout + 5s.
func (p *Pool) shutdown() {
	defer close(p.stopped)
	p.running.Store(false) // stopping was set by Stop
	p.log.Info().Msg("stop fetching jobs")
	p.fetchCancel()
	<-p.fetchDone
	// Only now, the pull drained: a job handed back before would come
	// back into it, to be handed back again (see handBackAtStop).
	close(p.halt)
	// Once cut, Stop's outcome waits at most opTimeout + 5s more, the
	// lease's delete included.
	var limit time.Time
	cutOff := func() {
		if limit.IsZero() {
			limit = time.Now().Add(opTimeout + 5*time.Second)
			p.workCancel()
		}
	}
	// A sweep under way may finish before the cut; one that hangs on the
	// server is cut off with the handlers. The next sweep, here or in
	// another pool, does its steps again: a repeated dead letter is a
	// duplicate by its ID.
	swept := make(chan struct{})
	go func() {
		p.sweeping.Wait()
		close(swept)
	}()
	select {
	case <-swept:
	case <-p.cut:
		cutOff()
		<-swept
	}
	select {
	case <-p.finished:
	case <-p.cut:
		p.log.Warn().Msg("shutdown timeout reached: cancelling running jobs")
		cutOff()
		select {
		case <-p.finished:
		case <-time.After(time.Until(limit)):
			p.stopErr = errors.New("handlers ignored cancellation; their jobs will be redelivered after the ack wait")
			// The acks that wait for theirs go out now, before the
			// caller closes the connection.
			p.acks.close()
		}
	}
	p.workCancel()
	if p.stopErr == nil {
		// Every job is through: the heartbeat loop ends, a renewal
		// under way cut off, before the lease is deleted, so that no
		// renewal writes it again. (Jobs whose handlers ignored
		// cancellation keep their heartbeats, and the lease.)
		p.beatCancel()
		<-p.beatsDone
		p.lease.close(p, limit)
	}
	p.ledger.Close()
	p.log.Info().Msg("workers stopped")
}

// processOne takes one fetched job through every step in turn, without the
// pipeline: for jobq next. A ledger that does not let the job be checked
// or claimed within opTimeout is an error; the job is handed back.
func (p *Pool) processOne(ctx context.Context, msg jetstream.Msg) error {
	job, err := decodeJob(msg)
	if err != nil {
		p.log.Error().Err(err).Str("subject", msg.Subject()).Msg("not a jetstream job; left for redelivery")
		return nil
	}
	it := &inflight{msg: msg, job: job}
	if !p.cfg.NoLedger {
		defer p.leaveLease(it) // Next deletes the lease once it is through
	}
	// Heartbeats, as in a pool: InProgress, and the renewals of the
	// job's lease or claim, so that a long handler keeps its job.
	p.beats.add(it)
	done, beating := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(beating)
		p.beats.loop(ctx, context.WithoutCancel(ctx), p, done)
	}()
	defer func() {
		close(done)
		<-beating
	}()
	if !p.cfg.NoLedger {
		// The ledger's reads and writes are retried while they fail, up
		// to here.
		lctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		admitted := true
		if p.leasing {
			batch := []*inflight{it}
			gen := p.lease.generation()
			snap, err := p.check(lctx, batch)
			admitted = false
			p.admitAll(lctx, checked{batch: batch, snap: snap, err: err, gen: gen}, func(*inflight, bool) { admitted = true })
		}
		if admitted && !it.unclaimed {
			admitted = p.claimed(lctx, it)
		}
		switch {
		case !admitted && lctx.Err() != nil && ctx.Err() == nil:
			return fmt.Errorf("job %s: the ledger could not check or claim it within %s; it is released (see jobq status)", job.ID, opTimeout)
		case !admitted:
			return nil // acked, or handed back
		}
	}
	// A handler that ends this goroutine with runtime.Goexit fails its
	// attempt still, as in a pool (see worker); the goroutine ends.
	returned := false
	defer onGoexit(&returned, func() {
		if it.ran && !it.handled {
			p.finishRun(ctx, it, errGoexit)
		}
	})
	ran := p.runOne(ctx, it)
	returned = true
	if !ran {
		switch {
		case errors.Is(it.sendErr, errEarlierJOB):
			return fmt.Errorf("job %s ran, but was not acknowledged: %w; unless JOB was made anew, it is delivered again after the ack wait, and runs again", job.ID, it.sendErr)
		case it.sendErr != nil:
			return fmt.Errorf("job %s ran, but its done record could not be sent: %w; it is released and will run again, as a resumed attempt", job.ID, it.sendErr)
		}
		return nil
	}
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	err = p.waitRecord(opCtx, it)
	p.beats.remove(it)
	if err != nil && !errors.Is(err, data.ErrClaimLost) {
		err = p.recordAgain(opCtx, it, err)
	}
	if err != nil {
		p.unrecorded(it, err)
		if errors.Is(err, data.ErrClaimLost) {
			return nil // another holder's record decides
		}
		return fmt.Errorf("job %s ran, but its done record could not be stored within %s: %w; it is released and will run again, as a resumed attempt", job.ID, opTimeout, err)
	}
	p.cfg.Metrics.jobCompleted(job.Subject)
	p.observe(job, data.StateDone, it.took, nil)
	if err := p.ack(opCtx, msg, *p.jobLog(job)); errors.Is(err, errEarlierJOB) {
		return fmt.Errorf("job %s ran and is recorded done, but was not acknowledged: %w; unless JOB was made anew, it is delivered again after the ack wait, and acked without running", job.ID, err)
	}
	return nil
}

// release frees one job's room in the pool: its bytes, its place in the
// lease, then its token. it is nil for a message that was never admitted.
func (p *Pool) release(it *inflight) {
	if it != nil {
		p.acks.drop(it)
		p.leaveLease(it)
		if it.roomBack {
			return
		}
		p.bytes.Add(-it.size)
	}
	p.tokens <- struct{}{}
}

// giveRoomBack returns the pool room of a job whose handler succeeded: it
// no longer needs a worker or its payload, only its record and its ack,
// which may take a while when the ledger is busy. So the next jobs are
// pulled meanwhile. Those that wait for their record are bounded by dones
// (see NewPool). The pool lets go of its payload, so that PrefetchBytes
// still bounds the payloads it holds; the handler's copy of the job (see
// call) keeps its own.
func (p *Pool) giveRoomBack(it *inflight) {
	it.job.Payload = nil
	if jm, ok := it.msg.(*jobMsg); ok {
		jm.msg.Data = nil
	}
	it.roomBack = true
	p.bytes.Add(-it.size)
	p.tokens <- struct{}{}
}

// leaveLease drops a job that ran on the pool's lease from it once it is
// through: its record is stored (its own, or another holder's that took it
// over), or its handler never started. One whose handler ran and whose
// outcome could not be recorded stays a while (see leased.orphan).
func (p *Pool) leaveLease(it *inflight) {
	if !it.unclaimed {
		return
	}
	p.lease.done(data.Key(it.job.ID), it, it.orphaned())
}

// orphaned reports whether a job on the lease that leaves it stays in it
// as an orphan (see leased.orphan): its handler ran and no record of its
// outcome was stored.
func (it *inflight) orphaned() bool {
	it.mu.Lock()
	defer it.mu.Unlock()
	return it.ran && it.claim.Revision == 0 && !it.superseded
}

// jobLog returns a logger with job's fields. It is built only when a job
// has something to say: most jobs log nothing.
func (p *Pool) jobLog(job *data.Job) *zerolog.Logger {
	l := p.log.With().Str("job_id", job.ID).Str("subject", job.Subject).Uint64("seq", job.Seq).Int("attempt", job.Attempt).Logger()
	return &l
}

// errGoexit is the failure of an attempt whose handler ended its
// goroutine with runtime.Goexit, which no recover stops.
var errGoexit = errors.New("handler called runtime.Goexit (such as t.FailNow in a test): the attempt counts as failed")

// worker runs jobs (see runAll) until the work channel closes. A handler
// that calls runtime.Goexit ends the worker's goroutine, whatever recovers:
// the attempt is then failed, as if the handler had returned errGoexit, and
// another worker takes the goroutine's place, so the pool does not lose
// workers to it, to lease jobs that nothing runs.
func (p *Pool) worker(ctx context.Context, workers *sync.WaitGroup) {
	defer workers.Done()
	var cur *inflight // the job whose handler runs, if any
	returned := false
	defer onGoexit(&returned, func() {
		p.log.Error().Msg("runtime.Goexit ended a worker, which another takes the place of")
		if cur != nil {
			// In the handler, its attempt fails. Elsewhere (an
			// Observer's, say) the job's outcome may be half told: its
			// redelivery decides.
			if cur.ran && !cur.handled {
				p.finishRun(ctx, cur, errGoexit) // false: a failure
			}
			p.release(cur)
		}
		workers.Add(1) // before this goroutine's Done
		go p.worker(ctx, workers)
	})
	p.runAll(ctx, &cur)
	returned = true
}

// onGoexit, deferred, calls f if its goroutine ends by runtime.Goexit: it
// neither returned (*returned set) nor panics; a panic goes on.
func onGoexit(returned *bool, f func()) {
	if *returned {
		return
	}
	if r := recover(); r != nil {
		panic(r) // a crash, not a Goexit
	}
	f()
}

// runAll runs claimed jobs until the claimer closes the work channel;
// *cur is the job whose handler runs meanwhile.
func (p *Pool) runAll(ctx context.Context, cur **inflight) {
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
		*cur = it
		ok := p.runOne(ctx, it)
		*cur = nil
		if ok {
			p.giveRoomBack(it)
			p.dones <- it
			continue
		}
		p.release(it)
	}
}

// keepAtStop reports whether a job fetched before Stop, and not started,
// runs still rather than being handed back: a job on its last delivery.
// Handed back, its deliveries would run out, and the sweep would
// dead-letter it without its ever having run. It runs as long as Stop
// waits for the running jobs; the others each spend a delivery.
func (p *Pool) keepAtStop(it *inflight) bool {
	return it.job.Attempt >= p.cfg.MaxDeliver
}

// handBackAtStop hands back, once Stop began, the jobs of batch that do not
// run still (see keepAtStop), and returns the rest.
func (p *Pool) handBackAtStop(batch []*inflight) []*inflight {
	if !p.stopping.Load() || !slices.ContainsFunc(batch, func(it *inflight) bool { return !p.keepAtStop(it) }) {
		return batch
	}
	// Once the fetcher's pull is drained: handed back into it, a job would
	// come straight back, to be handed back again at the cost of another
	// delivery.
	<-p.fetchDone
	return slices.DeleteFunc(batch, func(it *inflight) bool {
		if p.keepAtStop(it) {
			return false
		}
		p.handBack(it, "shutdown before the job started")
		return true
	})
}

// runOne runs one claimed job and records a failure. It reports whether the
// job succeeded and its completion is on its way (for the acker).
func (p *Pool) runOne(ctx context.Context, it *inflight) bool {
	if ctx.Err() != nil || p.stopping.Load() && !p.keepAtStop(it) {
		// Fetched, but shutdown came before a worker: hand it back, once
		// the pull is drained (see handBackAtStop).
		if p.stopping.Load() {
			<-p.fetchDone
		}
		p.beats.remove(it)
		p.releaseUnstarted(it)
		return false
	}
	if it.hctx.ctx == nil { // jobq next: no worker loop
		var cancel context.CancelCauseFunc
		it.hctx.ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		it.hctx.cancel = cancel
	}
	// The job starts, or was lost before: both in one critical section
	// with the heartbeat loop, so that a loss either finds the handler's
	// cancel or keeps the handler from starting (see inflight.lose).
	start := time.Now()
	it.mu.Lock()
	if it.lost {
		it.mu.Unlock()
		p.beats.remove(it)
		p.jobLog(it.job).Warn().Msg("claim lost before the job started: left to the new holder")
		return false
	}
	it.ran, it.cancel = true, it.hctx.cancel
	if it.unclaimed && it.claim.Revision == 0 {
		// Prepared when it was leased: it starts now.
		it.claim.Record.StartedAt = start.UTC()
		it.claim.Record.FirstAt = it.claim.Record.StartedAt
	}
	// Its first run: the ledger counts runs, one handed back unrun (at a
	// pool's stop, say) not among them; without it, deliveries stand in.
	first := it.job.Attempt == 1
	if !p.cfg.NoLedger {
		first = it.claim.Record.Attempts == 1 && !it.claim.Record.Resumed
	}
	it.mu.Unlock()
	p.cfg.Metrics.jobStarted(it.job.Subject, first, it.job.EnqueuedAt)
	p.handling.Add(1)
	it.start = start
	herr := p.run(ctx, it)
	it.handled = true
	return p.finishRun(ctx, it, herr)
}

// finishRun takes a job whose handler returned herr on to its outcome (see
// runOne).
func (p *Pool) finishRun(ctx context.Context, it *inflight, herr error) bool {
	if it.unclaimed {
		p.lease.finishing(data.Key(it.job.ID), it)
	}
	p.handling.Add(-1)
	it.took = time.Since(it.start)
	p.cfg.Metrics.jobHandled(it.job.Subject, it.took)
	if herr == nil && !p.cfg.NoLedger {
		// Its InProgress goes on until its record is confirmed (see
		// completed), in case that takes long.
		it.mu.Lock()
		it.recording, it.cancel = true, nil
		it.mu.Unlock()
	} else {
		p.beats.remove(it) // from here the claim is this worker's alone
	}

	switch {
	case herr == nil && p.cfg.NoLedger:
		p.cfg.Metrics.jobCompleted(it.job.Subject)
		p.observe(it.job, data.StateDone, it.took, nil)
		p.acks.ack(it)
		return false
	case herr == nil:
		w, err := p.ledger.DoneAsync(&it.claim, it.took)
		if err != nil {
			p.beats.remove(it)
			it.sendErr = err
			p.recordFailed(it, err, *p.jobLog(it.job))
			return false
		}
		it.write = w
		return true
	}
	log := p.jobLog(it.job).With().Dur("took", it.took).Logger()
	switch {
	case errors.Is(herr, data.ErrClaimLost) && it.unclaimed:
		p.leaseLost(it, herr, log)
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
		p.fail(opCtx, it, claim, herr, log)
	}
	return false
}

// leaseLost handles a job whose handler the pool's lost lease cut off. A
// record that says so makes its next attempt resumed, and lets it run
// again at once; without one (the ledger takes no writes, or another
// holder's record is there), it stays in the lease a while as an orphan
// and waits out the ack wait.
func (p *Pool) leaseLost(it *inflight, cause error, log zerolog.Logger) {
	opCtx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := p.ledger.Retry(opCtx, &it.claim, it.took, data.CauseLeaseLost); err != nil {
		it.mu.Lock()
		it.superseded = errors.Is(err, data.ErrClaimLost)
		it.mu.Unlock()
		log.Warn().Err(cause).AnErr("record", err).Msg("lease lost while the job ran: left for redelivery, as a resumed attempt")
		return
	}
	log.Warn().Err(cause).Msg("lease lost while the job ran: released, as a resumed attempt")
	p.nak(it.msg, 0, log)
}

// cutOff releases a job that shutdown stopped, for another run.
func (p *Pool) cutOff(it *inflight, took time.Duration, cause error) {
	if !p.cfg.NoLedger {
		opCtx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := p.ledger.Retry(opCtx, &it.claim, took, data.CauseCutOff); err != nil {
			p.recordFailed(it, err, *p.jobLog(it.job))
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
			p.recordFailed(it, err, *p.jobLog(it.job))
			return
		}
	}
	p.jobLog(it.job).Info().Msg("job released by shutdown before it started")
	p.nak(it.msg, 0, *p.jobLog(it.job))
}

// ackAll acks each job once its completion is confirmed. A completion the
// ledger refused, or did not answer, is retried while the job is held (see
// keepRecording). ctx ends once the pool's jobs are cut off at shutdown;
// the writes do not end with it: each write's future times out by itself.
func (p *Pool) ackAll(ctx context.Context) {
	defer p.acks.close() // once every job is through
	defer p.recording.Wait()
	waitCtx := context.WithoutCancel(ctx)
	for it := range p.dones {
		err := p.waitRecord(waitCtx, it)
		if err != nil && !errors.Is(err, data.ErrClaimLost) && ctx.Err() == nil {
			p.recording.Go(func() { p.keepRecording(ctx, it, err) })
			continue
		}
		p.completed(it, err)
	}
}

// completed acks a job whose completion is stored (err is nil), or leaves
// it to be redelivered.
func (p *Pool) completed(it *inflight, err error) {
	p.beats.remove(it) // no heartbeat may follow the ack or release
	defer p.release(it)
	if err != nil {
		it.mu.Lock()
		it.superseded = errors.Is(err, data.ErrClaimLost)
		it.mu.Unlock()
		p.unrecorded(it, err)
		return
	}
	p.cfg.Metrics.jobCompleted(it.job.Subject)
	p.observe(it.job, data.StateDone, it.took, nil)
	p.acks.ack(it)
}

// sendAck acks a job whose handler succeeded, and whose completion is
// stored if the pool has a ledger (see ackOrder).
func (p *Pool) sendAck(it *inflight) {
	switch err := it.msg.Ack(); {
	case err == nil:
	case unsent(err, p.jobLog(it.job)):
		it.sendErr = err // for jobq next, which reports it
	case p.cfg.NoLedger:
		p.jobLog(it.job).Warn().Err(err).Msg("ack job: it will run again")
	default:
		// A lost ack is harmless: the redelivery finds the job done.
		p.jobLog(it.job).Warn().Err(err).Msg("ack job: it will be redelivered and skipped")
	}
}

// waitRecord waits for the answer to a job's done record. One that found
// another record is looked at again: that may be the claim's own renewal,
// whose answer was lost (see PendingWrite.Recheck). Any other error means
// that the ledger refused the write or did not answer.
func (p *Pool) waitRecord(ctx context.Context, it *inflight) error {
	err := it.write.WaitOnce(ctx)
	if !errors.Is(err, data.ErrClaimLost) {
		return err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	return it.write.Recheck(rctx, err)
}

// keepRecording holds a job whose handler succeeded and whose record the
// ledger refused or did not answer (a full store, a bucket leader moving),
// until the record is stored (see recordAgain), then acks it. Released
// instead, as before, the job would run again once per delivery, and after
// its last one be dead-lettered though it succeeded. It gives up, leaving
// the job for redelivery, once the pool's jobs are cut off at shutdown
// (ctx), or if another holder's record replaced the claim.
//
// A held job counts against the pool's room again (see held): so a pool
// whose ledger refuses records stops fetching once its room is held, rather
// than run more jobs it cannot record.
func (p *Pool) keepRecording(ctx context.Context, it *inflight, err error) {
	p.beats.remove(it) // recordAgain sends its heartbeats
	p.held.add()
	if err = p.recordAgain(ctx, it, err); err == nil {
		p.jobLog(it.job).Info().Msg("job done recorded after retries")
	}
	p.held.done(p.tokens)
	p.completed(it, err)
}

// held counts the jobs held for their records (see keepRecording), which
// gave their room back when their handlers succeeded (see giveRoomBack),
// and takes room back for them: the fetcher hands in the tokens it takes
// while some are owed (see charge). Tokens so kept out are returned as
// held jobs end.
type held struct {
	mu      sync.Mutex
	owed    int // held jobs no token was kept out for yet
	charged int // tokens kept out for held jobs
}

func (h *held) add() {
	h.mu.Lock()
	h.owed++
	h.mu.Unlock()
}

// done ends one held job: it returns a token kept out for it to tokens.
func (h *held) done(tokens chan<- struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.owed > 0 {
		h.owed--
		return
	}
	h.charged--
	tokens <- struct{}{} // has room: the token was taken from it
}

// charge keeps up to n of the fetcher's tokens out for the held jobs that
// owe them, and returns how many it kept.
func (h *held) charge(n int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := min(n, h.owed)
	h.owed -= k
	h.charged += k
	return k
}

// recordAgain writes the record of a job whose handler succeeded once
// more, after its write failed with err, and again with a growing pause,
// until the record is stored, another holder's record replaced the claim
// (data.ErrClaimLost), or ctx ends; it returns the last write's error.
// Meanwhile the job gets its heartbeats, as a running job does: InProgress,
// so that it is not redelivered, and the renewal of its claim, if it has
// one, so that a copy of it is not claimed elsewhere.
func (p *Pool) recordAgain(ctx context.Context, it *inflight, err error) error {
	log := p.jobLog(it.job).With().Dur("took", it.took).Logger()
	// InProgress as often as the heartbeat loop sends it (see beatTimes),
	// and each write bounded so that none comes later than twice that
	// after the one before.
	_, beat := beatTimes(p.cfg.heartbeat())
	opWait := min(opTimeout, beat/2)
	nextBeat := time.Now() // the heartbeat loop let go of it just now
	backoff := 50 * time.Millisecond
	retryAt := time.Now().Add(backoff)
	for failures, logged := 1, 0; ; {
		if now := time.Now(); !now.Before(nextBeat) {
			nextBeat = now.Add(beat)
			if err := it.msg.InProgress(); err != nil && !errors.Is(err, errEarlierJOB) {
				log.Warn().Err(err).Msg("heartbeat to server")
			}
			if !it.unclaimed && it.claim.Revision != 0 {
				opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opWait)
				it.renewedTo = time.Now().Add(p.cfg.lease())
				_ = p.ledger.Renew(opCtx, &it.claim) // if refused, the next write tells
				cancel()
			}
		}
		if !time.Now().Before(retryAt) {
			opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opWait)
			err = it.write.Again(opCtx)
			cancel()
			if err == nil || errors.Is(err, data.ErrClaimLost) {
				return err
			}
			backoff = min(2*backoff, 5*time.Second)
			retryAt = time.Now().Add(backoff)
			failures++
		}
		if failures != logged && failures&(failures-1) == 0 { // the 1st, 2nd, 4th, 8th... failure
			logged = failures
			log.Warn().Err(err).Int("failures", failures).Dur("retry_in", time.Until(retryAt)).Msg("record job done: retrying, the job held meanwhile")
		}
		select {
		case <-time.After(max(min(time.Until(nextBeat), time.Until(retryAt)), 0)):
		case <-ctx.Done():
			return err
		}
	}
}

// fail handles a failed attempt: retry with backoff, or dead-letter when the
// error is permanent or this was the last delivery.
func (p *Pool) fail(ctx context.Context, it *inflight, claim *data.Claim, cause error, log zerolog.Logger) {
	msg, job, took := it.msg, it.job, it.took
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
				p.recordFailed(it, err, log)
				return
			}
		}
		ev(log.Warn()).Dur("retry_in", delay).Msg("job failed: will retry")
		p.cfg.Metrics.jobRetried(job.Subject)
		p.observe(job, data.StateRetrying, took, cause)
		p.nak(msg, delay, log)
		return
	}
	if claim != nil {
		// The job failed for good. Its record says so first, awaiting its
		// dead letter (data.AwaitingDeadLetter): a compare-and-set on its
		// claim, or, for a job on the pool's lease, the write through its
		// prepared claim that creates its record. So only the job's holder
		// stores its dead letter: a claim that lapsed while the handler
		// ran, which another worker took over, is refused here, and that
		// worker's run decides. Dead-lettered and acked first, the job was
		// both done (or running) there and in DLQ. From here a redelivery
		// is dead-lettered without running (see deadLetterAwaiting), were
		// the process to die before the job is acked.
		if err := p.ledger.Retry(ctx, claim, took, data.AwaitingDeadLetter+cause.Error()); err != nil {
			if errors.Is(err, data.ErrClaimLost) {
				it.mu.Lock()
				it.superseded = true
				it.mu.Unlock()
			}
			p.recordFailed(it, err, log.With().AnErr("cause", cause).Logger())
			return
		}
	}
	if err := p.deadLetter(ctx, job, msg.Headers(), cause.Error()); err != nil {
		// Whatever kept its dead letter out (a full DLQ, a publish that
		// timed out), the job failed for good: it awaits its dead letter
		// without running again, as its record says. (Left unrecorded,
		// it was delivered again after the ack wait and ran again, and,
		// after its last delivery, the sweep dead-lettered it with an
		// earlier attempt's error.) One too large for DLQ waits so too,
		// each delivery, until the sweep leaves it in JOB, logged.
		if claim != nil && !errors.Is(err, errTooLargeForDLQ) {
			p.awaitDeadLetter(it, cause, err, log)
			return
		}
		log.Error().Err(err).AnErr("cause", cause).Msg("dead-letter job: left in JOB for the sweep")
		return
	}
	p.deadLettered(ctx, msg, job, claim, took, cause, log)
	ev(log.Error()).Msg("job dead-lettered")
}

// deadLettered settles a job whose dead letter is stored: counted, told to
// the Observer, recorded failed, and acked.
func (p *Pool) deadLettered(ctx context.Context, msg jetstream.Msg, job *data.Job, claim *data.Claim, took time.Duration, cause error, log zerolog.Logger) {
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
}

// awaitDeadLetter releases a job that failed for good and whose dead letter
// DLQ had no room for (refused). Its record says so already (see fail): it
// is dead-lettered on a later delivery without running again (see
// deadLetterAwaiting), or by the sweep.
func (p *Pool) awaitDeadLetter(it *inflight, cause, refused error, log zerolog.Logger) {
	delay := p.cfg.backoff(it.job.Attempt)
	why := "job failed for good, and DLQ has no room for its dead letter: released, to be dead-lettered without running again"
	if !isFull(refused) {
		why = "job failed for good, and its dead letter could not be stored: released, to be dead-lettered without running again"
	}
	log.Error().Err(refused).AnErr("cause", cause).Dur("retry_in", delay).Msg(why)
	p.nak(it.msg, delay, log)
}

// recordFailed handles a ledger write that failed after the handler ran. The
// job stays unacked: its redelivery decides again from the ledger.
//
// It is released, but not before its claim, or its place in the pool's
// lease, ends: the ledger holds the job by them, and a redelivery while it
// does would be handed back and spend a delivery; after its last one, the
// job would be dead-lettered having run fewer times than it may, or, if it
// succeeded, at all. A place in the lease holds nothing back once the
// stored lease marks it an orphan's, but the pool writes that only with
// its next renewal, or never, if it stops (and another pool, or the next
// one after a restart, takes the redelivery).
//
// A job on the lease leaves it here (an orphan, if its handler ran), in
// the same step that reads when its place ends: a lease write between the
// two (a renewal, or another batch's) would list it running until later
// than the release waits for, and, the pool stopping meanwhile, never be
// written again.
func (p *Pool) recordFailed(it *inflight, err error, log zerolog.Logger) {
	held := it.claimHeldUntil()
	if it.unclaimed {
		held = p.lease.letGo(data.Key(it.job.ID), it, it.orphaned())
	}
	p.releaseUnrecorded(it, err, held, log)
}

// unrecorded releases a job whose handler succeeded and whose done record
// could not be stored (see recordFailed).
func (p *Pool) unrecorded(it *inflight, err error) {
	p.recordFailed(it, err, p.jobLog(it.job).With().Dur("took", it.took).Logger())
}

// releaseUnrecorded releases a job whose outcome could not be recorded
// after its backoff, and not before held (see recordFailed). A job whose
// claim was lost is left to the new holder.
func (p *Pool) releaseUnrecorded(it *inflight, err error, held time.Time, log zerolog.Logger) {
	if errors.Is(err, data.ErrClaimLost) {
		log.Warn().Err(err).Msg("claim lost before the outcome was recorded: outcome left to the new holder")
		return
	}
	delay := max(p.cfg.backoff(it.job.Attempt), time.Until(held)+time.Second)
	log.Error().Err(err).Dur("retry_in", delay).Msg("record job outcome: job will be redelivered")
	p.nak(it.msg, delay, log)
}

// claimHeldUntil is when the job's claim ends as stored: its last renewal
// sent may have landed though its answer was lost. Its heartbeats are
// over (see heartbeats.remove).
func (it *inflight) claimHeldUntil() time.Time {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.renewedTo.After(it.claim.Record.LeaseUntil) {
		return it.renewedTo
	}
	return it.claim.Record.LeaseUntil
}

// run calls the handler with a timeout and panic recovery. The heartbeat
// loop cancels it if the claim is lost.
func (p *Pool) run(ctx context.Context, it *inflight) error {
	hctx := it.hctx.ctx
	base := hctx
	if p.cfg.JobTimeout > 0 {
		var c context.CancelFunc
		hctx, c = context.WithTimeoutCause(hctx, p.cfg.JobTimeout, fmt.Errorf("job timeout %s reached", p.cfg.JobTimeout))
		defer c()
	}
	err := p.call(hctx, it.job)
	// A lost claim or lease is the attempt's outcome only if the handler
	// failed: one that returned nil succeeded, however late, and its done
	// record is a compare-and-set on its claim (on no record, for a job on
	// the lease), which fails if another holder took the job over. Taken
	// for cut off, the job ran again.
	if cause := context.Cause(base); err != nil && errors.Is(cause, data.ErrClaimLost) {
		return cause
	}
	if err != nil && hctx.Err() != nil && ctx.Err() == nil {
		// The job timeout ended the attempt.
		err = fmt.Errorf("%w: %w", context.Cause(hctx), err)
	}
	return err
}

// call runs the handler, turning a panic into an error with its stack.
func (p *Pool) call(ctx context.Context, job *data.Job) (err error) {
	defer func() {
		if r := recover(); r != nil {
			// Its text is built here, cut as a returned error's is: fmt
			// catches a panic in the value's own String method.
			msg := CutUTF8(fmt.Sprintf("handler panic: %v", r), maxCauseLen)
			err = &panicError{msg: msg, stack: debug.Stack()}
		}
	}()
	// The handler gets a copy of its own, which it may keep after it
	// returns: the pool lets go of its payload then (see giveRoomBack).
	own := *job
	if err := p.handler.Process(ctx, &own); err != nil {
		// Its text is read, and it is matched as the pool will match it,
		// here, where a panic is caught: the Error method of a typed nil
		// (var e *MyErr; return e) panics, and would take the process
		// down on the worker's goroutine.
		_, _ = handlers.IsPermanent(err), errors.Is(err, data.ErrClaimLost)
		_ = errors.As(err, new(*panicError))
		return &handlerError{msg: CutUTF8(err.Error(), maxCauseLen), err: err}
	}
	return nil
}

// maxCauseLen bounds the text of a handler's error that the pool keeps, in
// the job's record (its dead letter's header takes less, maxErrorHeader)
// and its logs: a record over the server's payload limit would never be
// stored, and the job's outcome never recorded.
const maxCauseLen = 4 << 10

// handlerError is a handler's error as the pool keeps it: its text read
// once (see call), at most maxCauseLen bytes. The error itself, for an
// Observer, is what it wraps.
type handlerError struct {
	msg string
	err error
}

func (e *handlerError) Error() string { return e.msg }
func (e *handlerError) Unwrap() error { return e.err }

type panicError struct {
	msg   string // "handler panic: " and the value, at most maxCauseLen
	stack []byte
}

func (e *panicError) Error() string { return e.msg }

// ack acks a job whose outcome is recorded, and returns the error of an ack
// that failed, after logging it.
func (p *Pool) ack(ctx context.Context, msg jetstream.Msg, log zerolog.Logger) error {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	err := msg.DoubleAck(actx)
	if err != nil && !unsent(err, &log) {
		// The outcome is recorded: a redelivery is acked without running.
		log.Error().Err(err).Msg("ack job: it will be redelivered and skipped")
	}
	return err
}

func (p *Pool) nak(msg jetstream.Msg, delay time.Duration, log zerolog.Logger) {
	var err error
	if delay > 0 {
		err = msg.NakWithDelay(delay)
	} else {
		err = msg.Nak()
	}
	if err != nil && !unsent(err, &log) {
		log.Warn().Err(err).Msg("release job: it will be redelivered after the ack wait")
	}
}

// decodeJob builds the handler's view of a delivered message.
func decodeJob(msg jetstream.Msg) (*data.Job, error) {
	job := new(data.Job)
	if err := decodeJobInto(job, msg); err != nil {
		return nil, err
	}
	return job, nil
}

// decodeJobInto is decodeJob into job.
func decodeJobInto(job *data.Job, msg jetstream.Msg) error {
	meta, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("read job metadata: %w", err)
	}
	h := msg.Headers()
	*job = data.Job{
		ID:         jobID(h, meta.Sequence.Stream),
		Subject:    msg.Subject(),
		Seq:        meta.Sequence.Stream,
		Attempt:    int(meta.NumDelivered),
		Payload:    msg.Data(),
		Header:     h,
		EnqueuedAt: meta.Timestamp,
	}
	return nil
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
