package queue_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server"
)

// A job that leaves JOB without being handled is reported as lost, by the
// mode that lost it, once nothing is left to come. Here one job is deleted
// from JOB while the baseline, and again while the no-ledger mode, fills the
// queue for the process phase. Before, the bench waited five minutes for
// it, then failed with "handled 1999 of 2000 jobs in 5m" and dropped the
// mode's figures, its lost job with them; and of two modes with a loss, the
// error named only the last.
func TestBenchReportsALostJobAndTheModeThatLostIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var srv *server.Server
	connect := func(ctx context.Context, dir string) (func() (*nats.Conn, error), func(), error) {
		s, err := server.Start(ctx, server.Config{StoreDir: dir, Logger: zerolog.Nop()})
		if err != nil {
			return nil, nil, err
		}
		srv = s
		return func() (*nats.Conn, error) { return s.Connect() }, func() { s.Shutdown(context.Background()) }, nil
	}
	deleted := map[string]bool{}
	latency := map[string][2]int{} // mode: the last done and total of its latency phase
	progress := func(mode, phase string, done, total int) {
		if phase == "latency" {
			latency[mode] = [2]int{done, total}
		}
		if (mode != "baseline" && mode != "no_ledger") || phase != "enqueue async" || deleted[mode] {
			return
		}
		// Some of the queue is stored: the oldest job goes.
		deleted[mode] = true
		js, closeJS := benchJS(t, srv)
		defer closeJS()
		if js == nil {
			return
		}
		s, err := js.Stream(ctx, queue.StreamJob)
		if err != nil {
			t.Error(err)
			return
		}
		if err := s.DeleteMsg(ctx, s.CachedInfo().State.FirstSeq); err != nil {
			t.Error(err)
		}
	}
	rep, err := queue.Bench(ctx, queue.BenchConfig{Jobs: 2100, Workers: 4, Dir: t.TempDir(), Connect: connect, Progress: progress, Log: zerolog.Nop()})
	if !errors.Is(err, queue.ErrBenchLoss) {
		t.Fatalf("bench: got %v, want %v", err, queue.ErrBenchLoss)
	}
	for _, want := range []string{"baseline lost 1 and duplicated 0", "no_ledger lost 1 and duplicated 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("bench: got %q, want it to say %q", err, want)
		}
	}
	for name, m := range map[string]queue.BenchResult{"baseline": rep.Baseline, "ledger": rep.Ledger, "no_ledger": rep.NoLedger} {
		want := 1
		if name == "ledger" {
			want = 0
		}
		if m.Lost != want || m.Duplicates != 0 {
			t.Errorf("%s: lost %d, duplicated %d; want %d and 0", name, m.Lost, m.Duplicates, want)
		}
		if m.ProcessPerS <= 0 || m.E2EPerS <= 0 || m.LatencyP50Ms <= 0 {
			t.Errorf("%s: got %+v, want every phase measured", name, m)
		}
	}
	// The latency phase sends at most 2000 jobs, and its progress counts
	// to that, not to --jobs.
	for _, mode := range []string{"baseline", "ledger", "no_ledger"} {
		if got := latency[mode]; got != [2]int{2000, 2000} {
			t.Errorf("%s latency progress: got %d of %d at its end, want 2000 of 2000", mode, got[0], got[1])
		}
	}
}

// A baseline that stalled is measured again on a fresh store, as every
// mode is. Here WORKER is paused for 7s as the first baseline fills the
// queue, a stall. Before, the baseline was measured again on the store the
// stalled measurement left behind.
func TestBenchMeasuresAStalledBaselineAgainOnAFreshStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var srv *server.Server
	var stale []string
	connect := func(ctx context.Context, dir string) (func() (*nats.Conn, error), func(), error) {
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			stale = append(stale, filepath.Base(dir))
		}
		s, err := server.Start(ctx, server.Config{StoreDir: dir, Logger: zerolog.Nop()})
		if err != nil {
			return nil, nil, err
		}
		srv = s
		return func() (*nats.Conn, error) { return s.Connect() }, func() { s.Shutdown(context.Background()) }, nil
	}
	paused := false
	progress := func(mode, phase string, _, _ int) {
		if mode != "baseline" || phase != "enqueue async" || paused {
			return
		}
		paused = true
		js, closeJS := benchJS(t, srv)
		defer closeJS()
		if js == nil {
			return
		}
		if _, err := js.PauseConsumer(ctx, queue.StreamJob, queue.ConsumerWorker, time.Now().Add(7*time.Second)); err != nil {
			t.Error(err)
		}
	}
	rep, err := queue.Bench(ctx, queue.BenchConfig{Jobs: 600, Workers: 4, Dir: t.TempDir(), Connect: connect, Progress: progress, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if rep.BaselineStalls != 1 || rep.Baseline.Stalled() {
		t.Errorf("got %d baseline stalls, the last measurement's longest pause %.1fs; want 1, and none", rep.BaselineStalls, rep.Baseline.LongestPauseS)
	}
	if stale != nil {
		t.Errorf("measured %q on a store that was there before, want fresh stores", stale)
	}
}

// benchJS connects to the server of the mode a bench measures, from its
// progress callback; nil, with the error reported, if it cannot. Call done
// once through.
func benchJS(t *testing.T, srv *server.Server) (js jetstream.JetStream, done func()) {
	t.Helper()
	nc, err := srv.Connect()
	if err != nil {
		t.Error(err)
		return nil, func() {}
	}
	if js, err = jetstream.New(nc); err != nil {
		t.Error(err)
	}
	return js, nc.Close
}
