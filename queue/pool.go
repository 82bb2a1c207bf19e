package queue

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
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

// Pool runs Workers jobs at a time from WORKER through a handler, keeping the
// exactly-once protocol for each:
//
//  1. claim the job in the ledger (a create, or a compare-and-set over an
//     expired claim); a job recorded done is acked without running;
//  2. run the handler, renewing the claim and sending InProgress every
//     AckWait/3 so the job is not redelivered while it runs;
//  3. record the outcome with a compare-and-set on the claim;
//  4. then ack (done, dead-lettered) or Nak with the retry delay.
//
// A crash anywhere leaves the job in JOB unacked, so it is redelivered; the
// ledger then tells whether it is done (ack it) or not (run it again, as a
// resumed attempt if an earlier one never recorded an outcome).
type Pool struct {
	obj     *Objects
	cfg     Config
	ledger  *data.Ledger
	handler handlers.Handler
	log     zerolog.Logger

	free    chan struct{} // one token per idle worker
	jobs    chan jetstream.Msg
	running atomic.Bool

	fetchCancel context.CancelFunc
	workCancel  context.CancelFunc
	fetchDone   chan struct{}
	workers     sync.WaitGroup
	sweeping    sync.WaitGroup
	stopOnce    sync.Once
}

// NewPool returns a pool that runs jobs from obj's WORKER through h.
func NewPool(obj *Objects, h handlers.Handler, log zerolog.Logger) *Pool {
	cfg := obj.Config
	return &Pool{
		obj:     obj,
		cfg:     cfg,
		ledger:  data.NewLedger(obj.Ledger, cfg.lease()),
		handler: h,
		log:     log.With().Str("component", "worker").Logger(),
		free:    make(chan struct{}, cfg.Workers),
		jobs:    make(chan jetstream.Msg),
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
	p.fetchDone = make(chan struct{})
	for i := range p.cfg.Workers {
		p.free <- struct{}{}
		p.workers.Add(1)
		go func() {
			defer p.workers.Done()
			p.work(workCtx, p.cfg.WorkerName+"/"+strconv.Itoa(i))
		}()
	}
	go func() {
		defer close(p.fetchDone)
		defer close(p.jobs) // workers exit once the last job is handed out
		p.fetch(fetchCtx)
	}()
	p.sweeping.Add(1)
	go func() {
		defer p.sweeping.Done()
		defer sub.Unsubscribe()
		p.sweeper(fetchCtx, seqs)
	}()
	p.log.Info().Int("workers", p.cfg.Workers).Str("consumer", ConsumerWorker).Msg("workers started")
	return nil
}

// Running reports whether the pool is started and not stopping.
func (p *Pool) Running() bool { return p.running.Load() }

// Stop stops fetching, waits for running handlers until ctx ends, then
// cancels their context and waits for them to record their outcome. Jobs cut
// off this way are released for redelivery, as resumed attempts.
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
		done := make(chan struct{})
		go func() { p.workers.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			p.log.Warn().Msg("shutdown timeout reached: cancelling running jobs")
			p.workCancel()
			select {
			case <-done:
			case <-time.After(opTimeout + 5*time.Second):
				err = errors.New("handlers ignored cancellation; their jobs will be redelivered after the ack wait")
			}
		}
		p.workCancel()
		p.log.Info().Msg("workers stopped")
	})
	return err
}

// fetch pulls at most as many jobs as there are idle workers, so that no job
// waits in a client buffer while its ack wait runs.
func (p *Pool) fetch(ctx context.Context) {
	for {
		select {
		case <-p.free:
		case <-ctx.Done():
			return
		}
		n := 1
	more:
		for n < p.cfg.Workers {
			select {
			case <-p.free:
				n++
			default:
				break more
			}
		}
		got := p.fetchBatch(ctx, n)
		for range n - got {
			p.free <- struct{}{}
		}
	}
}

// fetchBatch pulls up to n jobs and hands each to a worker. It returns how
// many it handed out.
func (p *Pool) fetchBatch(ctx context.Context, n int) int {
	batch, err := p.obj.Worker.Fetch(n, jetstream.FetchMaxWait(p.cfg.FetchWait))
	if err != nil {
		p.log.Warn().Err(err).Msg("fetch jobs")
		select {
		case <-time.After(p.cfg.FetchWait):
		case <-ctx.Done():
		}
		return 0
	}
	got := 0
	// A batch that was requested is read to its end, even while stopping:
	// its jobs are delivered to us and would otherwise wait for the ack wait.
	for msg := range batch.Messages() {
		p.jobs <- msg
		got++
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.Canceled) {
		p.log.Warn().Err(err).Msg("fetch jobs")
	}
	return got
}

func (p *Pool) work(ctx context.Context, name string) {
	for msg := range p.jobs {
		p.process(ctx, name, msg)
		p.free <- struct{}{}
	}
}

// process runs the exactly-once protocol for one delivered job.
func (p *Pool) process(ctx context.Context, worker string, msg jetstream.Msg) {
	job, err := decodeJob(msg)
	if err != nil {
		p.log.Error().Err(err).Str("subject", msg.Subject()).Msg("not a jetstream job; left for redelivery")
		return
	}
	log := p.log.With().Str("job_id", job.ID).Str("subject", job.Subject).Uint64("seq", job.Seq).Int("attempt", job.Attempt).Logger()
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	claim, err := p.ledger.Claim(opCtx, job, worker)
	cancel()
	switch {
	case errors.Is(err, data.ErrAlreadyDone):
		log.Debug().Msg("job already done: acked without running")
		p.ack(ctx, msg, log)
		return
	case errors.Is(err, data.ErrClaimed) && claim.Record.Seq != job.Seq:
		// The same ID published again while the first copy runs: that copy
		// stays in JOB until its outcome is recorded, so this one can go.
		log.Warn().Uint64("running_seq", claim.Record.Seq).Msg("duplicate of a running job: acked without running")
		p.ack(ctx, msg, log)
		return
	case errors.Is(err, data.ErrClaimed):
		delay := time.Until(claim.Record.LeaseUntil) + time.Second
		log.Warn().Str("holder", claim.Record.Worker).Dur("retry_in", delay).Msg("job redelivered while its claim is live: released")
		p.nak(msg, delay, log)
		return
	case err != nil:
		p.fail(ctx, msg, job, nil, 0, err, log)
		return
	}
	if claim.Replaced != nil {
		log.Warn().Err(claim.Replaced).Msg("unreadable ledger record replaced by a new claim")
	}
	if job.Resumed {
		log.Warn().Msg("resuming a job whose earlier attempt never recorded an outcome")
	}

	start := time.Now()
	herr := p.run(ctx, job, msg, &claim, log)
	took := time.Since(start)
	log = log.With().Dur("took", took).Logger()
	opCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()

	switch {
	case herr == nil:
		if err := p.ledger.Done(opCtx, &claim, took); err != nil {
			p.recordFailed(msg, job, err, log)
			return
		}
		p.ack(opCtx, msg, log)
		log.Debug().Msg("job done")
	case errors.Is(herr, data.ErrClaimLost):
		log.Warn().Err(herr).Msg("claim lost while running: outcome left to the new holder")
	case ctx.Err() != nil && !handlers.IsPermanent(herr):
		// Shutdown cut the attempt off: release it for another run.
		if err := p.ledger.Retry(opCtx, &claim, took, data.CauseCutOff); err != nil {
			p.recordFailed(msg, job, err, log)
			return
		}
		log.Warn().Err(herr).Msg("job cut off by shutdown: released")
		p.nak(msg, 0, log)
	default:
		p.fail(opCtx, msg, job, &claim, took, herr, log)
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
		p.nak(msg, delay, log)
		return
	}
	if err := p.deadLetter(ctx, msg, job, cause); err != nil {
		log.Error().Err(err).AnErr("cause", cause).Msg("dead-letter job: left in JOB for the sweep")
		return
	}
	var err error
	if claim != nil {
		err = p.ledger.Fail(ctx, claim, took, cause.Error())
	} else {
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

// run calls the handler with heartbeats, a timeout and panic recovery.
func (p *Pool) run(ctx context.Context, job *data.Job, msg jetstream.Msg, claim *data.Claim, log zerolog.Logger) error {
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if p.cfg.JobTimeout > 0 {
		var c context.CancelFunc
		hctx, c = context.WithTimeoutCause(hctx, p.cfg.JobTimeout, fmt.Errorf("job timeout %s reached", p.cfg.JobTimeout))
		defer c()
	}
	stop := make(chan struct{})
	beats := make(chan struct{})
	go func() {
		defer close(beats)
		p.heartbeat(ctx, msg, claim, stop, func(err error) { cancel(err) }, log)
	}()
	err := p.call(hctx, job)
	close(stop)
	<-beats
	if cause := context.Cause(hctx); errors.Is(cause, data.ErrClaimLost) {
		return cause
	}
	if err != nil && hctx.Err() != nil && ctx.Err() == nil {
		// The job timeout ended the attempt.
		err = fmt.Errorf("%w: %w", context.Cause(hctx), err)
	}
	return err
}

// heartbeat keeps a running job's lease: InProgress resets the server's ack
// wait, Renew the ledger claim. Losing the claim cancels the handler. It
// owns claim until stop is closed.
func (p *Pool) heartbeat(ctx context.Context, msg jetstream.Msg, claim *data.Claim, stop <-chan struct{}, lost func(error), log zerolog.Logger) {
	t := time.NewTicker(p.cfg.heartbeat())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if err := msg.InProgress(); err != nil {
			log.Warn().Err(err).Msg("heartbeat to server")
		}
		opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		err := p.ledger.Renew(opCtx, claim)
		cancel()
		if errors.Is(err, data.ErrClaimLost) {
			lost(err)
			return
		}
		if err != nil {
			log.Warn().Err(err).Msg("renew claim")
		}
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
