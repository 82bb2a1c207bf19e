package queue

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// BenchConfig configures Bench.
type BenchConfig struct {
	// Jobs per phase. Defaults to 20000.
	Jobs int
	// Payload is the payload size in bytes, at least BenchMinPayload.
	// Defaults to 128.
	Payload int
	// Workers for jobq's pool. Defaults to 8.
	Workers int
	// Prefetch for jobq's pool. Defaults to DefaultPrefetch.
	Prefetch int
	// Dir holds one fresh store per mode. Required.
	Dir string
	// Connect starts a server storing in dir and returns a function that
	// opens a connection to it and one that stops the server. The producer
	// and the workers each get a connection of their own, as separate
	// clients would. Required.
	Connect func(ctx context.Context, dir string) (dial func() (*nats.Conn, error), stop func(), err error)
	// Progress, if set, is called as each phase advances.
	Progress func(mode, phase string, done, total int)
	Log      zerolog.Logger
}

// BenchMinPayload is the smallest payload Bench sends: each job carries the
// time it was sent and its number.
const BenchMinPayload = 12

// BenchResult holds one mode's figures.
type BenchResult struct {
	EnqueueSyncPerS  float64 `json:"enqueue_sync_per_s"`
	EnqueueAsyncPerS float64 `json:"enqueue_async_per_s"`
	ProcessPerS      float64 `json:"process_per_s"`
	E2EPerS          float64 `json:"e2e_per_s"`
	// Latency is enqueue to handler start at a steady 1000 jobs/s, well
	// below what any mode sustains.
	LatencyP50Ms float64 `json:"latency_p50_ms"`
	LatencyP99Ms float64 `json:"latency_p99_ms"`
	LatencyMaxMs float64 `json:"latency_max_ms"`
	// Saturated latency is the same in the end-to-end phase, where the
	// producer outruns the workers and jobs queue up.
	SaturatedP50Ms float64 `json:"saturated_latency_p50_ms"`
	SaturatedP99Ms float64 `json:"saturated_latency_p99_ms"`
	PeakRSSMB      float64 `json:"peak_rss_mb"`
	// ProcessCPUUs and E2ECPUUs are the CPU time the whole process spent
	// per job in the process and end-to-end phases, in microseconds: the
	// clients, the pool and the embedded server, user and system. On a
	// shared machine they move less than the jobs per second do. Zero
	// where the system does not tell.
	ProcessCPUUs float64 `json:"process_cpu_us_per_job"`
	E2ECPUUs     float64 `json:"e2e_cpu_us_per_job"`
	// ProcessFaults and E2EFaults are the minor page faults (those that
	// read nothing from disk) the process took per job in the same
	// phases: mostly memory touched for the first time, as the heap and
	// the server's block caches grow. Where a fault is dear, as on some
	// virtual machines, they are a share of the CPU time. Zero where the
	// system does not tell.
	ProcessFaults float64 `json:"process_faults_per_job"`
	E2EFaults     float64 `json:"e2e_faults_per_job"`
	// Lost and Duplicates count jobs not handled, or handled more than
	// once, over the process and end-to-end phases.
	Lost       int `json:"lost"`
	Duplicates int `json:"duplicates"`
	// LongestPauseS is the longest time, in seconds, in which no job was
	// handled while some were still to come, over every phase. A run of
	// 20,000 jobs takes well under a second per phase; a pause of
	// benchStall or more is a stall.
	LongestPauseS float64 `json:"longest_pause_s"`
}

// benchStall is the pause that makes a run a stalled one (see
// BenchResult.LongestPauseS). nats.go's Consume, which the baseline uses,
// now and then stops delivering until its heartbeat check gives up 30s
// later (nats-io/nats.go#1622): Bench measures the baseline again then,
// rather than report ratios against a stall.
const benchStall = 5 * time.Second

// benchBaselineTries is how often Bench measures a stalled baseline.
const benchBaselineTries = 3

// BenchRatio is each jobq figure divided by the baseline's.
type BenchRatio struct {
	LedgerProcess   float64 `json:"ledger_process"`
	LedgerE2E       float64 `json:"ledger_e2e"`
	NoLedgerProcess float64 `json:"no_ledger_process"`
	NoLedgerE2E     float64 `json:"no_ledger_e2e"`
}

// BenchReport is the outcome of Bench.
type BenchReport struct {
	Jobs     int         `json:"jobs"`
	Payload  int         `json:"payload"`
	Workers  int         `json:"workers"`
	Prefetch int         `json:"prefetch"`
	Baseline BenchResult `json:"baseline"`
	Ledger   BenchResult `json:"ledger"`
	NoLedger BenchResult `json:"no_ledger"`
	Ratio    BenchRatio  `json:"ratio"`
	// BaselineStalls counts the baseline measurements that stalled and
	// were measured again (see benchStall).
	BaselineStalls int `json:"baseline_stalls,omitempty"`
	// Runs holds each run's own report when BenchMedian made this one
	// from more than one.
	Runs []BenchReport `json:"runs,omitempty"`
}

// BenchMedian reduces several runs' reports to one: every figure and every
// ratio is the median over the runs, each ratio taken within its own run
// against that run's baseline; lost and duplicated jobs add up. The runs
// are kept in Runs.
func BenchMedian(runs []BenchReport) BenchReport {
	if len(runs) == 0 {
		return BenchReport{}
	}
	out := runs[0]
	out.Runs = nil
	if len(runs) == 1 {
		return out
	}
	out.Runs = runs
	fields := out.figures()
	vals := make([]float64, len(runs))
	for i, f := range fields {
		for j := range runs {
			vals[j] = *runs[j].figures()[i]
		}
		*f = median(vals)
	}
	for i, m := range out.modes() {
		m.Lost, m.Duplicates, m.LongestPauseS = 0, 0, 0
		for j := range runs {
			m.Lost += runs[j].modes()[i].Lost
			m.Duplicates += runs[j].modes()[i].Duplicates
			m.LongestPauseS = max(m.LongestPauseS, runs[j].modes()[i].LongestPauseS)
		}
	}
	out.BaselineStalls = 0
	for _, r := range runs {
		out.BaselineStalls += r.BaselineStalls
	}
	return out
}

// modes lists r's three modes.
func (r *BenchReport) modes() []*BenchResult {
	return []*BenchResult{&r.Baseline, &r.Ledger, &r.NoLedger}
}

// figures lists every measured figure of r, modes and ratios.
func (r *BenchReport) figures() []*float64 {
	var fs []*float64
	for _, m := range r.modes() {
		fs = append(fs, &m.EnqueueSyncPerS, &m.EnqueueAsyncPerS, &m.ProcessPerS, &m.E2EPerS,
			&m.LatencyP50Ms, &m.LatencyP99Ms, &m.LatencyMaxMs, &m.SaturatedP50Ms, &m.SaturatedP99Ms, &m.PeakRSSMB,
			&m.ProcessCPUUs, &m.E2ECPUUs, &m.ProcessFaults, &m.E2EFaults)
	}
	return append(fs, &r.Ratio.LedgerProcess, &r.Ratio.LedgerE2E, &r.Ratio.NoLedgerProcess, &r.Ratio.NoLedgerE2E)
}

// median of vs, which it sorts: the middle value, or the mean of the two
// middle ones.
func median(vs []float64) float64 {
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

// ErrBenchLoss is returned by Bench when a mode lost or duplicated jobs.
var ErrBenchLoss = errors.New("jobs lost or duplicated")

// Bench measures, in one run on fresh stores: a raw JetStream pull/ack loop
// (the baseline), jobq with its ledger, and jobq with the ledger off. Every
// mode publishes with Nats-Msg-Id to the same JOB/WORKER configuration.
func Bench(ctx context.Context, cfg BenchConfig) (BenchReport, error) {
	cfg.Jobs = cmpOr(cfg.Jobs, 20000)
	cfg.Payload = max(cmpOr(cfg.Payload, 128), BenchMinPayload)
	cfg.Workers = cmpOr(cfg.Workers, 8)
	cfg.Prefetch = cmpOr(cfg.Prefetch, DefaultPrefetch)
	rep := BenchReport{Jobs: cfg.Jobs, Payload: cfg.Payload, Workers: cfg.Workers, Prefetch: cfg.Prefetch}
	modes := []struct {
		name string
		out  *BenchResult
	}{{"baseline", &rep.Baseline}, {"ledger", &rep.Ledger}, {"no_ledger", &rep.NoLedger}}
	// A short baseline run first, discarded: the first mode in a fresh
	// process runs on a cold runtime (heap, pools, goroutine stacks) and
	// measured 10-20% slower than the same mode run later, which would
	// flatter every ratio.
	warm := cfg
	warm.Jobs = min(cfg.Jobs, 5000)
	warm.Dir = filepath.Join(cfg.Dir, "warm-up")
	warm.Progress = nil
	if cfg.Progress != nil {
		warm.Progress = func(_, phase string, done, total int) { cfg.Progress("warm-up", phase, done, total) }
	}
	if _, err := benchMode(ctx, warm, "baseline"); err != nil {
		return rep, fmt.Errorf("bench warm-up: %w", err)
	}
	if err := os.RemoveAll(warm.Dir); err != nil {
		return rep, err
	}
	var loss []string
	for _, m := range modes {
		r, err := benchMode(ctx, cfg, m.name)
		for m.name == "baseline" && err == nil && r.Stalled() && rep.BaselineStalls < benchBaselineTries-1 {
			rep.BaselineStalls++
			cfg.Log.Warn().Float64("pause_s", r.LongestPauseS).Msg("the baseline stalled in nats.go's Consume: measured again")
			r, err = benchMode(ctx, cfg, m.name)
		}
		if err != nil {
			return rep, fmt.Errorf("bench %s: %w", m.name, err)
		}
		*m.out = r
		if r.Lost > 0 || r.Duplicates > 0 {
			loss = append(loss, fmt.Sprintf("%s lost %d and duplicated %d", m.name, r.Lost, r.Duplicates))
		}
	}
	rep.Ratio = BenchRatio{
		LedgerProcess:   ratio(rep.Ledger.ProcessPerS, rep.Baseline.ProcessPerS),
		LedgerE2E:       ratio(rep.Ledger.E2EPerS, rep.Baseline.E2EPerS),
		NoLedgerProcess: ratio(rep.NoLedger.ProcessPerS, rep.Baseline.ProcessPerS),
		NoLedgerE2E:     ratio(rep.NoLedger.E2EPerS, rep.Baseline.E2EPerS),
	}
	if len(loss) > 0 {
		return rep, fmt.Errorf("%w: %s", ErrBenchLoss, strings.Join(loss, "; "))
	}
	return rep, nil
}

// ratio is a over b; 0 if b is.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Ratios is f's figure of the ledger and of the no-ledger mode over the
// baseline's. Over several runs it is, as Ratio is, the median of each run's
// own ratio, not a ratio of figures from different runs.
func (r BenchReport) Ratios(f func(BenchResult) float64) (ledger, noLedger float64) {
	runs := r.Runs
	if len(runs) == 0 {
		runs = []BenchReport{r}
	}
	ls, ns := make([]float64, len(runs)), make([]float64, len(runs))
	for i, run := range runs {
		ls[i], ns[i] = ratio(f(run.Ledger), f(run.Baseline)), ratio(f(run.NoLedger), f(run.Baseline))
	}
	return median(ls), median(ns)
}

func cmpOr(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// benchTarget is what a mode plugs into the shared phases.
type benchTarget struct {
	publish      func(ctx context.Context, subject, id string, payload []byte) error
	publishAsync func(subject, id string, payload []byte) (jetstream.PubAckFuture, error)
	// startWorkers starts handling jobs with h and returns a stop func.
	startWorkers func(h func(payload []byte)) (func(), error)
	// close ends the target's producer (nil: nothing to end).
	close func()
}

func benchMode(ctx context.Context, cfg BenchConfig, mode string) (res BenchResult, err error) {
	var closers []func()
	debug.FreeOSMemory()
	rss := startRSSSampler()
	defer func() { res.PeakRSSMB = rss() }()

	// A fresh store, for a baseline measured again too.
	dir := filepath.Join(cfg.Dir, mode)
	if err := os.RemoveAll(dir); err != nil {
		return res, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return res, err
	}
	dial, stop, err := cfg.Connect(ctx, dir)
	if err != nil {
		return res, err
	}
	defer stop()
	conn := func() (jetstream.JetStream, error) {
		nc, err := dial()
		if err != nil {
			return nil, err
		}
		closers = append(closers, nc.Close)
		return jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(512))
	}
	// The connections close after the workers stop, before the server.
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	js, err := conn()
	if err != nil {
		return res, err
	}
	qcfg := Config{Workers: cfg.Workers, Prefetch: cfg.Prefetch, NoLedger: mode == "no_ledger", MaxPayload: max(cfg.Payload, DefaultMaxPayload)}
	obj, err := Provision(ctx, js, qcfg, cfg.Log)
	if err != nil {
		return res, err
	}
	wjs, err := conn()
	if err != nil {
		return res, err
	}
	wobj, err := obj.Bind(ctx, wjs)
	if err != nil {
		return res, err
	}
	t := benchTarget{}
	if mode == "baseline" {
		t = baselineTarget(js, wobj)
	} else {
		t = jobqTarget(js, wobj, cfg.Log)
	}
	if t.close != nil {
		defer t.close()
	}
	progress := func(phase string, done int) {
		if cfg.Progress != nil {
			cfg.Progress(mode, phase, done, cfg.Jobs)
		}
	}
	payload := func(i int) []byte {
		b := make([]byte, cfg.Payload)
		binary.BigEndian.PutUint64(b, uint64(time.Now().UnixNano()))
		binary.BigEndian.PutUint32(b[8:], uint32(i))
		return b
	}

	// Enqueue, one at a time.
	start := time.Now()
	for i := range cfg.Jobs {
		if err := t.publish(ctx, "job.bench", "s-"+strconv.Itoa(i), payload(i)); err != nil {
			return res, err
		}
		if i%500 == 0 {
			progress("enqueue", i)
		}
	}
	res.EnqueueSyncPerS = rate(cfg.Jobs, time.Since(start))
	if err := obj.Jobs.Purge(ctx); err != nil {
		return res, err
	}

	// Enqueue, async: this fills the queue for the process phase.
	start = time.Now()
	if err := publishAll(ctx, t, cfg.Jobs, "p-", payload, func(i int) { progress("enqueue async", i) }); err != nil {
		return res, err
	}
	res.EnqueueAsyncPerS = rate(cfg.Jobs, time.Since(start))

	// Process the pre-filled queue. The same workers then run the end-to-end
	// phase: a stopped pull consumer can leave pull requests on the server
	// that would swallow the next phase's first jobs until their ack wait.
	var current atomic.Pointer[benchCounts]
	counts := newBenchCounts(cfg.Jobs, false)
	current.Store(counts)
	start = time.Now()
	cpu := startCPU()
	stopWorkers, err := t.startWorkers(func(p []byte) { current.Load().handle(p) })
	if err != nil {
		return res, err
	}
	defer stopWorkers()
	err = waitHandled(ctx, obj, counts, func(n int) { progress("process", n) }, nil)
	res.ProcessPerS = rate(cfg.Jobs, time.Since(start))
	res.ProcessCPUUs, res.ProcessFaults = cpu.perJob(cfg.Jobs)
	res.LongestPauseS = counts.watch.longest.Seconds()
	lost, dup := counts.verify()
	res.Lost, res.Duplicates = lost, dup
	if err != nil {
		return res, err
	}

	// End to end: producer and workers together.
	counts = newBenchCounts(cfg.Jobs, true)
	current.Store(counts)
	start = time.Now()
	cpu = startCPU()
	// The producer runs beside the wait, which sees any stall from the
	// start; a wait that fails stops it and waits for it.
	pubCtx, stopPublishing := context.WithCancel(ctx)
	defer stopPublishing()
	published := make(chan error, 1)
	go func(out chan<- error) {
		defer close(out)
		out <- publishAll(pubCtx, t, cfg.Jobs, "e-", payload, nil)
	}(published)
	err = waitHandled(ctx, obj, counts, func(n int) { progress("end to end", n) }, published)
	if err != nil {
		stopPublishing()
		<-published // its error, or closed once waitHandled took it
	}
	res.E2EPerS = rate(cfg.Jobs, time.Since(start))
	res.E2ECPUUs, res.E2EFaults = cpu.perJob(cfg.Jobs)
	res.LongestPauseS = max(res.LongestPauseS, counts.watch.longest.Seconds())
	lost, dup = counts.verify()
	res.Lost += lost
	res.Duplicates += dup
	res.SaturatedP50Ms, res.SaturatedP99Ms, _ = counts.latencies()
	if err != nil {
		return res, err
	}

	// Latency at a steady rate: 1000 jobs/s for up to 2 seconds.
	n := min(cfg.Jobs, 2000)
	counts = newBenchCounts(n, true)
	current.Store(counts)
	steady := make(chan error, 1)
	go func(out chan<- error) {
		defer close(out)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		futures := make([]jetstream.PubAckFuture, 0, n)
		for i := range n {
			select {
			case <-tick.C:
			case <-pubCtx.Done():
				out <- pubCtx.Err()
				return
			}
			// The acks are awaited once all are sent, so that the end of
			// publishing means every job is stored (see waitHandled).
			f, err := t.publishAsync("job.bench", "l-"+strconv.Itoa(i), payload(i))
			if err != nil {
				out <- err
				return
			}
			futures = append(futures, f)
		}
		out <- awaitAcks(pubCtx, futures)
	}(steady)
	err = waitHandled(ctx, obj, counts, func(done int) {
		if cfg.Progress != nil {
			cfg.Progress(mode, "latency", done, n)
		}
	}, steady)
	if err != nil {
		stopPublishing()
		<-steady
	}
	res.LongestPauseS = max(res.LongestPauseS, counts.watch.longest.Seconds())
	lost, dup = counts.verify()
	res.Lost += lost
	res.Duplicates += dup
	res.LatencyP50Ms, res.LatencyP99Ms, res.LatencyMaxMs = counts.latencies()
	return res, err
}

func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// cpuMark is the process's CPU time and page faults at a phase's start.
type cpuMark struct {
	at     time.Duration
	faults int64
	ok     bool
}

func startCPU() cpuMark {
	at, faults, ok := processUsage()
	return cpuMark{at: at, faults: faults, ok: ok}
}

// perJob is the CPU time spent since m per job, in microseconds, and the
// page faults taken since m per job; 0 if the system does not tell.
func (m cpuMark) perJob(n int) (cpuUs, faults float64) {
	now, f, ok := processUsage()
	if !m.ok || !ok || n <= 0 {
		return 0, 0
	}
	return float64(now-m.at) / float64(time.Microsecond) / float64(n), float64(f-m.faults) / float64(n)
}

func publishAll(ctx context.Context, t benchTarget, n int, prefix string, payload func(int) []byte, progress func(int)) error {
	// The window stays under the connection's limit of outstanding async
	// publishes (512), which would otherwise stall when acks are slow, as
	// with --sync always.
	futures := make([]jetstream.PubAckFuture, 0, 256)
	flush := func() error {
		if err := awaitAcks(ctx, futures); err != nil {
			return err
		}
		futures = futures[:0]
		return nil
	}
	for i := range n {
		f, err := t.publishAsync("job.bench", prefix+strconv.Itoa(i), payload(i))
		if err != nil {
			return err
		}
		futures = append(futures, f)
		if len(futures) == cap(futures) {
			if err := flush(); err != nil {
				return err
			}
			if progress != nil {
				progress(i)
			}
		}
	}
	return flush()
}

// awaitAcks waits for each of futures' acks.
func awaitAcks(ctx context.Context, futures []jetstream.PubAckFuture) error {
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-time.After(30 * time.Second):
			return errors.New("publish ack timeout")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// waitHandled waits until every job was handled and JOB is empty (acked),
// and until publishing, if given, ends with every job stored; a publishing
// error, or ctx's end, ends the wait. So does a loss: once publishing ended,
// JOB is looked at every second that not every job was handled, and if it is
// empty no job is left to come; c.verify then counts the missing as lost.
// It keeps in c.watch the longest time without progress: without a job
// handled, or, once all were, without one acked.
func waitHandled(ctx context.Context, obj *Objects, c *benchCounts, progress func(int), publishing <-chan error) error {
	deadline := time.Now().Add(5 * time.Minute)
	looked := time.Now()
	for {
		select {
		case err := <-publishing:
			if err != nil {
				return err
			}
			publishing = nil
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		n := int(c.handled.Load())
		progress(n)
		if n < c.n {
			c.watch.see(progressMark{handled: n}, time.Now())
			if publishing == nil && time.Since(looked) >= time.Second {
				looked = time.Now()
				info, err := obj.Jobs.Info(ctx)
				if err != nil {
					return err
				}
				// A job is counted handled before it is acked, and so
				// before JOB lets it go: counted again after the look.
				if info.State.Msgs == 0 && int(c.handled.Load()) < c.n {
					return nil
				}
			}
		} else {
			info, err := obj.Jobs.Info(ctx)
			if err != nil {
				return err
			}
			if info.State.Msgs == 0 && publishing == nil {
				return nil
			}
			c.watch.see(progressMark{handled: n, stored: info.State.Msgs}, time.Now())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("handled %d of %d jobs in 5m", n, c.n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type benchCounts struct {
	n       int
	handled atomic.Int64
	watch   pauseWatch // waitHandled's longest wait without progress
	seen    []atomic.Uint32
	// latency[i] is job i's time from enqueue to its first handling, if
	// timed. Each job has its own slot, so that recording it takes no lock
	// that the workers would contend on.
	latency []atomic.Int64
}

// progressMark is how far a phase got: jobs handled, and jobs still stored
// once all were handled (their acks on the way).
type progressMark struct {
	handled int
	stored  uint64
}

// pauseWatch finds the longest time in which a phase made no progress.
type pauseWatch struct {
	seen    bool
	last    progressMark
	lastAt  time.Time
	longest time.Duration
}

// see takes how far the phase got at now.
func (w *pauseWatch) see(m progressMark, now time.Time) {
	if !w.seen || m != w.last {
		w.seen, w.last, w.lastAt = true, m, now
		return
	}
	w.longest = max(w.longest, now.Sub(w.lastAt))
}

// Stalled reports whether r's mode stalled (see benchStall).
func (r BenchResult) Stalled() bool { return r.LongestPauseS >= benchStall.Seconds() }

func newBenchCounts(n int, timed bool) *benchCounts {
	c := &benchCounts{n: n, seen: make([]atomic.Uint32, n)}
	if timed {
		c.latency = make([]atomic.Int64, n)
	}
	return c
}

func (c *benchCounts) handle(payload []byte) {
	if len(payload) < 12 {
		return
	}
	i := binary.BigEndian.Uint32(payload[8:])
	if int(i) >= c.n || c.seen[i].Add(1) > 1 {
		return
	}
	if c.latency != nil {
		c.latency[i].Store(int64(time.Since(time.Unix(0, int64(binary.BigEndian.Uint64(payload))))))
	}
	c.handled.Add(1)
}

func (c *benchCounts) verify() (lost, dup int) {
	for i := range c.seen {
		switch n := c.seen[i].Load(); {
		case n == 0:
			lost++
		case n > 1:
			dup++
		}
	}
	return lost, dup
}

// latencies reports the percentiles of the handled jobs' latencies.
func (c *benchCounts) latencies() (p50, p99, maxMs float64) {
	ds := make([]time.Duration, 0, len(c.latency))
	for i := range c.latency {
		if c.seen[i].Load() > 0 {
			ds = append(ds, time.Duration(c.latency[i].Load()))
		}
	}
	if len(ds) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ds)
	at := func(q float64) float64 { // nearest rank
		i := int(math.Ceil(q*float64(len(ds)))) - 1
		return float64(ds[max(i, 0)]) / float64(time.Millisecond)
	}
	return at(0.50), at(0.99), at(1)
}

// baselineTarget is the raw JetStream loop: publish with Nats-Msg-Id, pull
// in batches, plain ack, no ledger.
func baselineTarget(js jetstream.JetStream, obj *Objects) benchTarget {
	msg := func(subject, id string, payload []byte) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = payload
		m.Header.Set(nats.MsgIdHdr, id)
		return m
	}
	return benchTarget{
		publish: func(ctx context.Context, subject, id string, payload []byte) error {
			_, err := js.PublishMsg(ctx, msg(subject, id, payload))
			return err
		},
		publishAsync: func(subject, id string, payload []byte) (jetstream.PubAckFuture, error) {
			return js.PublishMsgAsync(msg(subject, id, payload))
		},
		startWorkers: func(h func([]byte)) (func(), error) {
			cc, err := obj.Worker.Consume(func(m jetstream.Msg) {
				h(m.Data())
				m.Ack()
			}, jetstream.PullMaxMessages(500))
			if err != nil {
				return nil, err
			}
			return cc.Stop, nil
		},
	}
}

// jobqTarget is jobq's own producer and pool.
func jobqTarget(js jetstream.JetStream, obj *Objects, log zerolog.Logger) benchTarget {
	p := NewProducer(js, obj.Config)
	return benchTarget{
		close: p.Close,
		publish: func(ctx context.Context, subject, id string, payload []byte) error {
			_, err := p.Enqueue(ctx, subject, payload, EnqueueOptions{ID: id})
			return err
		},
		publishAsync: func(subject, id string, payload []byte) (jetstream.PubAckFuture, error) {
			return p.EnqueueAsync(subject, payload, EnqueueOptions{ID: id})
		},
		startWorkers: func(h func([]byte)) (func(), error) {
			pool := NewPool(obj, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
				h(job.Payload)
				return nil
			}), log)
			if err := pool.Start(context.Background()); err != nil {
				return nil, err
			}
			return func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				pool.Stop(ctx)
			}, nil
		},
	}
}

// startRSSSampler samples this process's resident set every 10ms and
// returns a func that stops it and reports the peak in MB.
func startRSSSampler() func() float64 {
	var peak atomic.Int64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			if kb := rssKB(); kb > peak.Load() {
				peak.Store(kb)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(done)
		<-stopped
		return float64(peak.Load()) / 1024
	}
}

// rssKB reads VmRSS from /proc/self/status; 0 where there is none.
func rssKB() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:")); ok {
			n, _ := strconv.ParseInt(string(bytes.TrimSpace(bytes.TrimSuffix(bytes.TrimSpace(v), []byte("kB")))), 10, 64)
			return n
		}
	}
	return 0
}
