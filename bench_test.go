package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestCLIBench runs jobq bench small, in JSON and as a table: every mode
// handles every job once, and each ratio is the jobq figure over the
// baseline's.
func TestCLIBench(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := jobq(t, "bench", "--jobs", "400", "--workers", "4", "--dir", dir, "--json")
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
		Lost         int     `json:"lost"`
		Duplicates   int     `json:"duplicates"`
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
	for name, m := range map[string]mode{"baseline": rep.Baseline, "ledger": rep.Ledger, "no_ledger": rep.NoLedger} {
		if m.EnqueueSync <= 0 || m.EnqueueAsync <= 0 || m.Process <= 0 || m.E2E <= 0 || m.P50 <= 0 || m.P99 < m.P50 || m.RSS <= 0 || m.ProcessCPU <= 0 || m.E2ECPU <= 0 {
			t.Errorf("%s: got %+v, want every figure measured", name, m)
		}
		if m.Lost != 0 || m.Duplicates != 0 {
			t.Errorf("%s: lost %d, duplicated %d; want none", name, m.Lost, m.Duplicates)
		}
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

	r = jobq(t, "bench", "--jobs", "200", "--workers", "2", "--dir", dir, "--runs", "3")
	if r.code != 0 {
		t.Fatalf("bench: %s", r)
	}
	for _, want := range []string{"; the median of 3 runs", "baseline  ledger  ratio  no ledger  ratio", "process jobs/s", "end-to-end jobs/s", "process CPU µs/job", "end-to-end CPU µs/job", "run 3: ratios ledger process", "no ledger process", "lost 0, duplicated 0 (ledger)"} {
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
