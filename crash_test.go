package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
)

// TestCrashLosesNothing runs jobq serve with an exec handler that appends the
// job's ID to a file, publishes hundreds of jobs, SIGKILLs the process at
// random moments several times, restarts it on the same store each time,
// and checks DESIGN.md's invariants from the effects file and the ledger:
//
//   - every job ran at least once and ended done (nothing lost);
//   - a job ran again only as a resumed attempt: the crash boundary, effect
//     done and completion not yet recorded (a job recorded done would run
//     again as a fresh, not resumed, attempt, and fail the test).
//
// make test runs it short; make soak (JOBQ_SOAK=1) runs it long.
func TestCrashLosesNothing(t *testing.T) {
	t.Parallel()
	jobs, kills := 300, 5
	if os.Getenv("JOBQ_SOAK") != "" {
		jobs, kills = 3000, 40
	}
	work := t.TempDir()
	effects := filepath.Join(work, "effects")
	// The effect first, then a little work, so kills land on both sides of
	// the boundary.
	handler := fmt.Sprintf(`exec:echo "$JOBQ_JOB_ID $JOBQ_ATTEMPT $JOBQ_RESUMED" >> %s; sleep 0.02`, shq(effects))
	opts := serveOpts{dir: t.TempDir(), args: []string{
		"--handler", "job.crash.>=" + handler, "--workers", "4",
		"--ack-wait", "2s", "--max-deliver", "100", "--retry-backoff", "100ms",
		"--log-level", "info",
	}}
	srv := startServe(t, opts)
	publishJobs(t, srv.url, jobs)

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for k := range kills {
		// Kill at a random moment while jobs are running.
		time.Sleep(time.Duration(150+rng.IntN(600)) * time.Millisecond)
		done := len(lines(t, effects))
		srv.Kill(t)
		t.Logf("kill %d after %d effects", k+1, done)
		srv = startServe(t, opts)
	}

	var st statusOut
	checkFor(t, 3*time.Minute, 200*time.Millisecond, func() error {
		st = srv.status(t)
		if st.Stream.Messages != 0 || st.Ledger.Records != uint64(jobs) {
			return fmt.Errorf("JOB holds %d jobs, ledger %d records; want 0 and %d", st.Stream.Messages, st.Ledger.Records, jobs)
		}
		return nil
	})
	if st.DLQ.Messages != 0 {
		t.Errorf("DLQ holds %d jobs, want 0", st.DLQ.Messages)
	}

	runs := map[string]int{}
	resumedRuns, duplicates := 0, 0
	for _, line := range lines(t, effects) {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("effects line %q: want ID ATTEMPT RESUMED", line)
		}
		id, resumed := f[0], f[2] == "1"
		runs[id]++
		if resumed {
			resumedRuns++
		}
		if runs[id] > 1 {
			duplicates++
			if !resumed {
				t.Errorf("job %s ran again as a fresh attempt (%q): only a resumed attempt may repeat an effect", id, line)
			}
		}
	}
	ledger := openLedger(t, srv.url)
	for i := range jobs {
		id := crashID(i)
		if runs[id] == 0 {
			t.Errorf("job %s never ran", id)
		}
		rec, err := ledger.Get(context.Background(), id)
		if err != nil || rec.State != data.StateDone {
			t.Errorf("job %s: got ledger %+v, %v; want done", id, rec, err)
		}
	}
	t.Logf("%d jobs, %d kills: %d effects, %d duplicates (all at the crash boundary, seen as resumed), %d resumed attempts",
		jobs, kills, len(lines(t, effects)), duplicates, resumedRuns)
	srv.Stop(t)
}

// openLedger reads jobq's ledger through a plain NATS client.
func openLedger(t *testing.T, url string) *data.Ledger {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), "processed")
	if err != nil {
		t.Fatalf("open ledger: %v", err)
	}
	return data.NewLedger(kv, time.Minute, nil)
}

func crashID(i int) string { return "crash-" + strconv.Itoa(i) }

// publishJobs stores n jobs with IDs crashID(i) through a plain NATS client.
func publishJobs(t *testing.T, url string, n int) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		m := nats.NewMsg("job.crash." + strconv.Itoa(i%7))
		m.Data = []byte("payload " + strconv.Itoa(i))
		m.Header.Set(nats.MsgIdHdr, crashID(i))
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(waitTimeout):
		t.Fatalf("publish: %d acks outstanding after %s", js.PublishAsyncPending(), waitTimeout)
	}
}

// TestCrashSoonAfterDeliveryIsMarkedResumed kills jobq from inside a handler,
// right after its effect and within the server's ~100ms delay in saving its
// consumer's delivery counts, while many jobs are running. The server then
// forgets those deliveries and hands the jobs out again as first attempts:
// only their claims, written before the handlers ran, tell that they ran.
// Every job that runs twice must see the second run as resumed (DESIGN.md,
// invariant 4).
func TestCrashSoonAfterDeliveryIsMarkedResumed(t *testing.T) {
	t.Parallel()
	work := t.TempDir()
	effects := filepath.Join(work, "effects")
	marker := filepath.Join(work, "killed")
	handler := fmt.Sprintf(`exec:echo "$JOBQ_JOB_ID $JOBQ_ATTEMPT $JOBQ_RESUMED" >> %s; if [ "$JOBQ_JOB_ID" = crash-40 ] && [ ! -e %s ]; then touch %s; kill -9 $PPID; fi; sleep 0.2`, shq(effects), shq(marker), shq(marker))
	// Deliveries to spare: the crash spends one of each job it held, a
	// redelivery while the dead pool's lease holds the job another, and on
	// a loaded machine a lapse of the restarted pool's lease (renewed
	// every second with --ack-wait 3s) a third, which with the default of
	// 3 would dead-letter a job that never ran.
	opts := serveOpts{dir: t.TempDir(), args: []string{"--handler", "job.crash.>=" + handler, "--workers", "64", "--ack-wait", "3s", "--max-deliver", "10"}}
	srv := startServe(t, opts)
	publishJobs(t, srv.url, 80)
	select {
	case <-srv.done:
		srv.ended = true
	case <-time.After(30 * time.Second):
		t.Fatal("the handler of crash-40 did not kill jobq in 30s")
	}
	srv = startServe(t, opts)
	checkFor(t, time.Minute, 200*time.Millisecond, func() error {
		if st := srv.status(t); st.Stream.Messages != 0 {
			return fmt.Errorf("JOB holds %d jobs", st.Stream.Messages)
		}
		return nil
	})
	runs := map[string]int{}
	for _, l := range lines(t, effects) {
		f := strings.Fields(l)
		runs[f[0]]++
		if runs[f[0]] > 1 && f[2] != "1" {
			t.Errorf("job %s ran again, not marked resumed: %q", f[0], l)
		}
	}
	// Twice: its effect, then the resumed attempt. On a loaded machine the
	// restarted pool's lease (renewed every second with --ack-wait 3s) may
	// lapse, cutting its jobs off to run again, each marked resumed too.
	if runs["crash-40"] < 2 {
		t.Errorf("crash-40 ran %d times, want 2 (its effect, then the resumed attempt)", runs["crash-40"])
	}
	for i := range 80 {
		if id := fmt.Sprintf("crash-%d", i); runs[id] == 0 {
			t.Errorf("job %s never ran", id)
		}
	}
	srv.Stop(t)
}

// TestBrokerCrashDoesNotRunAJobTwiceAtOnce: jobq runs its workers against an
// external server (a second jobq, serving as a broker), which is SIGKILLed
// right after a burst of deliveries and restarted while the workers' jobs
// still run. The restarted server has forgotten the last deliveries and
// hands those jobs out again as first attempts; their claims, written before
// the handlers started, keep the copies from running beside them (DESIGN.md,
// invariant 3).
func TestBrokerCrashDoesNotRunAJobTwiceAtOnce(t *testing.T) {
	t.Parallel()
	effects := filepath.Join(t.TempDir(), "effects")
	broker := startServe(t, serveOpts{})
	addr := strings.TrimPrefix(broker.url, "nats://")
	handler := fmt.Sprintf(`exec:echo "$JOBQ_JOB_ID start" >> %s; sleep 4; echo "$JOBQ_JOB_ID end" >> %s`, shq(effects), shq(effects))
	startServe(t, serveOpts{args: []string{"--server", broker.url, "--handler", "job.crash.>=" + handler, "--workers", "64"}})
	publishJobs(t, broker.url, 40)
	checkFor(t, 30*time.Second, time.Millisecond, func() error {
		if n := len(lines(t, effects)); n < 20 {
			return fmt.Errorf("%d handlers started", n)
		}
		return nil
	})
	broker.Kill(t)
	// The same store and address, so that the workers reconnect to it.
	startServe(t, serveOpts{dir: broker.dir, args: []string{"--listen", addr}})
	time.Sleep(8 * time.Second) // every first run has ended; a copy would have started
	running := map[string]bool{}
	for _, l := range lines(t, effects) {
		id, what, _ := strings.Cut(l, " ")
		if what == "start" && running[id] {
			t.Errorf("job %s started again while it ran", id)
		}
		running[id] = what == "start"
	}
}
