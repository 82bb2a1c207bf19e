package queue

import (
	"encoding/binary"
	"testing"
	"time"
)

func TestBenchCountsFindLossAndDuplicates(t *testing.T) {
	c := newBenchCounts(5, false)
	job := func(i uint32) []byte {
		b := make([]byte, 12)
		binary.BigEndian.PutUint32(b[8:], i)
		return b
	}
	for _, i := range []uint32{0, 1, 1, 3, 4, 4, 4, 9} { // 2 missing, 1 and 4 twice or more, 9 out of range
		c.handle(job(i))
	}
	if lost, dup := c.verify(); lost != 1 || dup != 2 {
		t.Errorf("verify: got %d lost, %d duplicated; want 1 and 2", lost, dup)
	}
	if got := c.handled.Load(); got != 4 {
		t.Errorf("handled: got %d distinct jobs, want 4", got)
	}
}

func TestBenchCountsTimeEachJobsFirstHandling(t *testing.T) {
	c := newBenchCounts(5, true)
	now := time.Now()
	job := func(i uint32, age time.Duration) []byte {
		b := make([]byte, 12)
		binary.BigEndian.PutUint64(b, uint64(now.Add(-age).UnixNano()))
		binary.BigEndian.PutUint32(b[8:], i)
		return b
	}
	c.handle(job(0, 1*time.Second))
	c.handle(job(1, 2*time.Second))
	c.handle(job(2, 3*time.Second))
	c.handle(job(2, time.Hour)) // a duplicate: not timed again
	// Jobs 3 and 4 are never handled: they have no latency.
	p50, p99, maxMs := c.latencies()
	near := func(got, want float64) bool { return got >= want && got < want+500 }
	if !near(p50, 2000) || !near(p99, 3000) || maxMs != p99 {
		t.Errorf("latencies: got p50 %.0f ms, p99 %.0f ms, max %.0f ms; want about 2000, 3000, 3000", p50, p99, maxMs)
	}
}

func TestBenchMedianTakesEachFiguresMedianAndAddsUpLosses(t *testing.T) {
	run := func(base, ledger float64, lost int) BenchReport {
		r := BenchReport{Jobs: 10}
		r.Baseline.ProcessPerS, r.Ledger.ProcessPerS = base, ledger
		r.Ledger.Lost = lost
		r.Ratio.LedgerProcess = ledger / base
		return r
	}
	runs := []BenchReport{run(100, 50, 0), run(200, 60, 2), run(50, 40, 1)}
	got := BenchMedian(runs)
	if got.Baseline.ProcessPerS != 100 || got.Ledger.ProcessPerS != 50 {
		t.Errorf("process: got baseline %v, ledger %v; want the medians 100 and 50", got.Baseline.ProcessPerS, got.Ledger.ProcessPerS)
	}
	// Each ratio is the median of the runs' own ratios (0.5, 0.3, 0.8),
	// not the ratio of the medians.
	if got.Ratio.LedgerProcess != 0.5 {
		t.Errorf("ratio.ledger_process: got %v, want 0.5", got.Ratio.LedgerProcess)
	}
	if got.Ledger.Lost != 3 || len(got.Runs) != 3 || got.Jobs != 10 {
		t.Errorf("got lost %d, %d runs, jobs %d; want 3, 3 and 10", got.Ledger.Lost, len(got.Runs), got.Jobs)
	}
	if two := BenchMedian(runs[:2]); two.Baseline.ProcessPerS != 150 {
		t.Errorf("median of two: got %v, want their mean 150", two.Baseline.ProcessPerS)
	}
	if one := BenchMedian(runs[:1]); one.Runs != nil || one.Ledger.Lost != 0 || one.Baseline.ProcessPerS != 100 {
		t.Errorf("one run: got %+v, want it as it is, without runs", one)
	}
}

// The bench finds the longest time in which a phase made no progress:
// no job handled, or, once all were, none acked (JOB's count unchanged).
func TestBenchPauseWatchFindsTheLongestPause(t *testing.T) {
	var w pauseWatch
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	w.see(progressMark{handled: 0}, at(0))
	w.see(progressMark{handled: 3}, at(time.Second))
	w.see(progressMark{handled: 3}, at(2*time.Second))
	w.see(progressMark{handled: 3}, at(7*time.Second)) // 6s without a job handled
	w.see(progressMark{handled: 10, stored: 4}, at(8*time.Second))
	w.see(progressMark{handled: 10, stored: 2}, at(9*time.Second))
	if w.longest != 6*time.Second {
		t.Errorf("longest pause: got %s, want 6s", w.longest)
	}
	w.see(progressMark{handled: 10, stored: 2}, at(17*time.Second)) // 8s without an ack
	if w.longest != 8*time.Second {
		t.Errorf("longest pause with the acks stuck: got %s, want 8s", w.longest)
	}
	if r := (BenchResult{LongestPauseS: w.longest.Seconds()}); !r.Stalled() {
		t.Error("an 8s pause: want the run taken as stalled")
	}
	if r := (BenchResult{LongestPauseS: 0.3}); r.Stalled() {
		t.Error("a 0.3s pause: want the run not taken as stalled")
	}
}

// Over several runs, the longest pause is the longest of any run, and the
// baseline's stalls add up.
func TestBenchMedianKeepsTheLongestPauseAndTheStalls(t *testing.T) {
	runs := []BenchReport{{BaselineStalls: 1}, {}, {BaselineStalls: 1}}
	runs[0].Ledger.LongestPauseS, runs[1].Ledger.LongestPauseS, runs[2].Ledger.LongestPauseS = 0.2, 31, 0.1
	got := BenchMedian(runs)
	if got.Ledger.LongestPauseS != 31 || got.BaselineStalls != 2 {
		t.Errorf("got longest pause %v, baseline stalls %d; want 31 and 2", got.Ledger.LongestPauseS, got.BaselineStalls)
	}
}
