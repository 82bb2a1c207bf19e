package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobq/jobq/queue"
)

// TestCLIBench runs jobq bench small, in JSON and as a table: every mode
// handles every job once, and each ratio is the jobq figure over the
// baseline's.
func TestCLIBench(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// One run: its ratios are its own figures' (over several, each ratio
	// is the median of the runs' ratios, see TestCLIBenchRunsTakesTheMedian).
	r := jobq(t, "bench", "--jobs", "400", "--workers", "4", "--dir", dir, "--json", "--runs", "1")
	if r.code != 0 {
		t.Fatalf("bench --json: %s", r)
	}
	type mode struct {
		EnqueueSync  float64 `json:"enqueue_sync_per_s"`
		EnqueueAsync float64 `json:"enqueue_async_per_s"`
		Process      float64 `json:"process_per_s"`
		E2E          float64 `json:"e2e_per_s"`
		P50          float64 `json:"latency_p50_ms"`
		P99          float64 `json:"latency_p99_ms"`
		RSS          float64 `json:"peak_rss_mb"`
		ProcessCPU   float64 `json:"process_cpu_us_per_job"`
		E2ECPU       float64 `json:"e2e_cpu_us_per_job"`
		// Page faults may be none in one phase this small, not in all
		// six: each mode starts on a heap handed back to the system.
		ProcessFaults *float64 `json:"process_faults_per_job"`
		E2EFaults     *float64 `json:"e2e_faults_per_job"`
		Lost          int      `json:"lost"`
		Duplicates    int      `json:"duplicates"`
	}
	var rep struct {
		Jobs     int                `json:"jobs"`
		Baseline mode               `json:"baseline"`
		Ledger   mode               `json:"ledger"`
		NoLedger mode               `json:"no_ledger"`
		Ratio    map[string]float64 `json:"ratio"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("decode %q: %v", r.stdout, err)
	}
	if rep.Jobs != 400 {
		t.Errorf("jobs: got %d, want 400", rep.Jobs)
	}
	faults := 0.0
	for name, m := range map[string]mode{"baseline": rep.Baseline, "ledger": rep.Ledger, "no_ledger": rep.NoLedger} {
		if m.EnqueueSync <= 0 || m.EnqueueAsync <= 0 || m.Process <= 0 || m.E2E <= 0 || m.P50 <= 0 || m.P99 < m.P50 || m.RSS <= 0 || m.ProcessCPU <= 0 || m.E2ECPU <= 0 ||
			m.ProcessFaults == nil || m.E2EFaults == nil {
			t.Errorf("%s: got %+v, want every figure measured", name, m)
		} else {
			faults += *m.ProcessFaults + *m.E2EFaults
		}
		if m.Lost != 0 || m.Duplicates != 0 {
			t.Errorf("%s: lost %d, duplicated %d; want none", name, m.Lost, m.Duplicates)
		}
	}
	if faults <= 0 {
		t.Errorf("page faults per job: none in any mode's phases, want them counted")
	}
	for key, want := range map[string]float64{
		"ledger_process":    rep.Ledger.Process / rep.Baseline.Process,
		"ledger_e2e":        rep.Ledger.E2E / rep.Baseline.E2E,
		"no_ledger_process": rep.NoLedger.Process / rep.Baseline.Process,
	} {
		if got := rep.Ratio[key]; got <= 0 || got/want < 0.999 || got/want > 1.001 {
			t.Errorf("ratio.%s: got %v, want %v", key, got, want)
		}
	}

	// By default, the median of three runs: one run's ratios swing by a
	// third on a shared machine.
	r = jobq(t, "bench", "--jobs", "200", "--workers", "2", "--dir", dir)
	if r.code != 0 {
		t.Fatalf("bench: %s", r)
	}
	for _, want := range []string{"; the median of 3 runs", "baseline  ledger  ratio  no ledger  ratio", "process jobs/s", "end-to-end jobs/s", "process CPU µs/job", "end-to-end CPU µs/job", "run 3: ratios ledger process", "no ledger process", "lost 0, duplicated 0 (baseline); lost 0, duplicated 0 (ledger); lost 0, duplicated 0 (no ledger)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("bench table: want %q in\n%s", want, r.stdout)
		}
	}
}

func TestCLIBenchRunsTakesTheMedian(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := jobq(t, "bench", "--jobs", "200", "--workers", "2", "--dir", dir, "--runs", "2", "--json")
	if r.code != 0 {
		t.Fatalf("bench --runs 2: %s", r)
	}
	type ratio struct {
		LedgerProcess float64 `json:"ledger_process"`
	}
	var rep struct {
		Baseline struct {
			Process float64 `json:"process_per_s"`
		} `json:"baseline"`
		Ratio ratio `json:"ratio"`
		Runs  []struct {
			Baseline struct {
				Process float64 `json:"process_per_s"`
			} `json:"baseline"`
			Ratio ratio `json:"ratio"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("decode %q: %v", r.stdout, err)
	}
	if len(rep.Runs) != 2 {
		t.Fatalf("got %d runs, want 2", len(rep.Runs))
	}
	near := func(a, b float64) bool { return a > 0 && a/b > 0.999 && a/b < 1.001 }
	if want := (rep.Runs[0].Baseline.Process + rep.Runs[1].Baseline.Process) / 2; !near(rep.Baseline.Process, want) {
		t.Errorf("baseline process_per_s: got %v, want the median of the runs, %v", rep.Baseline.Process, want)
	}
	if want := (rep.Runs[0].Ratio.LedgerProcess + rep.Runs[1].Ratio.LedgerProcess) / 2; !near(rep.Ratio.LedgerProcess, want) {
		t.Errorf("ratio.ledger_process: got %v, want the median of the runs' ratios, %v", rep.Ratio.LedgerProcess, want)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Errorf("bench left %d entries in --dir (%v), want none", len(entries), err)
	}
	if r := jobq(t, "bench", "--runs", "0", "--dir", dir); r.code != 2 || !strings.Contains(r.stderr, "--runs") {
		t.Errorf("bench --runs 0: got %s, want exit 2 naming --runs", r)
	}
}

// --payload outside what the bench can send is bad usage. Before, 0 ran
// with 128-byte payloads and 1 to 11 with 12-byte ones, the table naming
// the size it ran, not the one asked for; and a payload over what the
// bench's server takes failed at run time, in the warm-up.
func TestCLIBenchPayloadOutOfRangeIsBadUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, p := range []string{"0", "11", "2000000"} {
		r := jobq(t, "bench", "--jobs", "20", "--payload", p, "--dir", dir)
		wantOneLineError(t, r, 2, "--payload "+p, "want 12")
	}
	// The largest accepted, 1 MiB less 4 KiB for headers, runs.
	largest := strconv.Itoa(1<<20 - 4<<10)
	r := jobq(t, "bench", "--jobs", "3", "--payload", largest, "--dir", dir, "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"payload": `+largest+",") {
		t.Errorf("bench --payload %s: got %s, want it run", largest, r)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Errorf("bench left %d entries in --dir (%v), want none", len(entries), err)
	}
}

// A stop signal (SIGTERM here, SIGINT, Ctrl-C, alike) stops the bench,
// which removes its temporary stores and fails with one line. Before, the
// signal killed jobq and left them behind.
func TestCLIBenchStopsOnASignalAndRemovesItsStores(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(jobqBin, "bench", "--runs", "1", "--dir", dir)
	cmd.Env = subprocessEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var last string
	for l := range lines {
		last = l
		if l == "bench: baseline process" {
			break
		}
	}
	if last != "bench: baseline process" {
		cmd.Wait()
		t.Fatalf("bench ended before its baseline's process phase: %q", last)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for l := range lines {
			last = l
		}
		done <- cmd.Wait()
	}()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatal("bench still running a minute after its signal")
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("bench after a signal: got %v, want exit status 1", err)
	}
	if want := "jobq: bench stopped by a signal"; !strings.HasPrefix(last, want) {
		t.Errorf("bench after a signal: got last line %q, want %q", last, want)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Errorf("bench left %d entries in --dir (%v), want none", len(entries), err)
	}
}

// Over several runs, every ratio in the table is the median of the runs'
// own ratios. Before, those of enqueueing and of CPU per job divided the
// ledger's median by the baseline's, figures of different runs.
func TestBenchTableRatiosAreEachRunsOwn(t *testing.T) {
	t.Parallel()
	run := func(base, ledger float64) queue.BenchReport {
		r := queue.BenchReport{Jobs: 10}
		for _, m := range []*queue.BenchResult{&r.Baseline, &r.Ledger, &r.NoLedger} {
			f := ledger
			if m == &r.Baseline {
				f = base
			}
			m.EnqueueSyncPerS, m.EnqueueAsyncPerS, m.ProcessPerS, m.E2EPerS, m.ProcessCPUUs, m.E2ECPUUs = f, f, f, f, f, f
			m.ProcessFaults, m.E2EFaults = f, f
		}
		r.Ratio = queue.BenchRatio{LedgerProcess: ledger / base, LedgerE2E: ledger / base, NoLedgerProcess: ledger / base, NoLedgerE2E: ledger / base}
		return r
	}
	// Ratios 1, 2.5 and 0.75: their median is 1; the medians' ratio,
	// 300/200, 1.5.
	rep := queue.BenchMedian([]queue.BenchReport{run(100, 100), run(200, 500), run(400, 300)})
	var out strings.Builder
	printBench(&out, rep, "1s")
	for _, name := range []string{"enqueue jobs/s (one at a time)", "enqueue jobs/s (async)", "process jobs/s", "end-to-end jobs/s", "process CPU µs/job", "end-to-end CPU µs/job", "process page faults/job", "end-to-end page faults/job"} {
		var row []string
		for l := range strings.Lines(out.String()) {
			if strings.HasPrefix(strings.TrimSpace(l), name) {
				row = strings.Fields(strings.TrimPrefix(strings.TrimSpace(l), name))
			}
		}
		if len(row) != 5 || row[2] != "1.00x" || row[4] != "1.00x" {
			t.Errorf("%s: got %q, want the ratios 1.00x, the median of each run's\n%s", name, row, out.String())
		}
	}
}
