package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
)

// TestMetricsCountJobOutcomes runs jobs that succeed, fail once, fail for
// good, and copies of done and running jobs through a pool, then checks
// every counter's exact value per subject label, the histograms' counts,
// and that the status gauges agree with ReadStatus.
func TestMetricsCountJobOutcomes(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, queue.Config{Workers: 4, MaxDeliver: 3, AckWait: time.Second, Metrics: queue.NewMetrics(reg)})
	reg.MustRegister(queue.NewStatusCollector(b.obj, 5*time.Second))

	release := make(chan struct{})
	slowStarted := make(chan struct{})
	var slowOnce sync.Once
	h := handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		switch job.ID {
		case "flaky-1":
			if job.Attempt == 1 {
				return errors.New("try again")
			}
		case "bad-perm":
			return handlers.Permanent(errors.New("bad address"))
		case "bad-always":
			return errors.New("still down")
		case "slow-1":
			slowOnce.Do(func() { close(slowStarted) })
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})

	for i := range 3 {
		b.enqueue(t, "job.ok.daily", fmt.Sprintf("ok-%d", i), "x")
	}
	if ack := b.enqueue(t, "job.ok.daily", "ok-0", "x"); !ack.Duplicate {
		t.Fatalf("republished ok-0: got %+v, want a duplicate", ack)
	}
	b.enqueue(t, "job.flaky", "flaky-1", "x")
	b.enqueue(t, "job.bad.mail", "bad-perm", "x")
	b.enqueue(t, "job.bad.sms", "bad-always", "x")
	b.enqueue(t, "job.slow", "slow-1", "x")

	// Before any worker runs, the gauges show the stored jobs.
	checkStatusGauges(t, b, reg, 7)

	b.startPool(t, h)
	b.waitState(t, "ok-0", data.StateDone)
	<-slowStarted
	// A copy of a done job and a copy of the running one, stored as
	// distinct messages under the same job IDs, as a re-drive would be.
	// Both are skipped while the second runs.
	for _, id := range []string{"ok-0", "slow-1"} {
		b.publishCopy(t, "job.copy."+id, "copy-of-"+id, id)
	}
	waitFor(t, 20*time.Second, func() error {
		if got := counterValue(t, reg, "jobq_jobs_skipped_total", "job.copy"); got != 2 {
			return fmt.Errorf("got %v copies skipped, want 2", got)
		}
		return nil
	})
	close(release)
	b.waitDrained(t)
	b.waitState(t, "bad-always", data.StateFailed)

	tests := []struct {
		subject                                                      string
		enqueued, started, completed, retried, deadLettered, skipped float64
		handled, waited                                              uint64
	}{
		{subject: "job.ok", enqueued: 3, started: 3, completed: 3, handled: 3, waited: 3},
		{subject: "job.flaky", enqueued: 1, started: 2, completed: 1, retried: 1, handled: 2, waited: 1},
		{subject: "job.bad", enqueued: 2, started: 4, retried: 2, deadLettered: 2, handled: 4, waited: 2},
		{subject: "job.slow", enqueued: 1, started: 1, completed: 1, handled: 1, waited: 1},
		{subject: "job.copy", skipped: 2},
	}
	for _, tt := range tests {
		t.Run(tt.subject, func(t *testing.T) {
			for name, want := range map[string]float64{
				"jobq_jobs_enqueued_total":      tt.enqueued,
				"jobq_jobs_started_total":       tt.started,
				"jobq_jobs_completed_total":     tt.completed,
				"jobq_jobs_retried_total":       tt.retried,
				"jobq_jobs_dead_lettered_total": tt.deadLettered,
				"jobq_jobs_skipped_total":       tt.skipped,
			} {
				if got := counterValue(t, reg, name, tt.subject); got != want {
					t.Errorf("%s{subject=%q}: got %v, want %v", name, tt.subject, got, want)
				}
			}
			if got := histogramCount(t, reg, "jobq_handler_duration_seconds", tt.subject); got != tt.handled {
				t.Errorf("jobq_handler_duration_seconds{subject=%q}: got %d observations, want %d", tt.subject, got, tt.handled)
			}
			if got := histogramCount(t, reg, "jobq_enqueue_to_start_seconds", tt.subject); got != tt.waited {
				t.Errorf("jobq_enqueue_to_start_seconds{subject=%q}: got %d observations, want %d", tt.subject, got, tt.waited)
			}
		})
	}
	// A label's series all appear with its first job, at 0 where nothing
	// happened.
	if n, err := testutil.GatherAndCount(reg, "jobq_jobs_started_total"); err != nil || n != len(tests) {
		t.Errorf("jobq_jobs_started_total: got %d series (%v), want %d", n, err, len(tests))
	}
	checkStatusGauges(t, b, reg, 0)
	if st := b.status(t); st.DLQ.Messages != 2 || st.Ledger.Records != 7 {
		t.Errorf("got %d dead letters and %d ledger records, want 2 and 7", st.DLQ.Messages, st.Ledger.Records)
	}
}

// TestMetricsCapSubjectLabels checks that subjects past the cap are counted
// under "other", so a producer with unbounded subjects cannot grow the
// series without bound.
func TestMetricsCapSubjectLabels(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, queue.Config{Metrics: queue.NewMetrics(reg)})
	const extra = 5
	for i := range queue.MaxSubjectLabels + extra {
		b.enqueue(t, fmt.Sprintf("job.s%d.x", i), "", "x")
	}
	b.enqueue(t, "job.s0.again", "", "x") // an existing label stays itself
	if got := counterValue(t, reg, "jobq_jobs_enqueued_total", queue.OtherSubjectLabel); got != extra {
		t.Errorf("other: got %v, want %d", got, extra)
	}
	if got := counterValue(t, reg, "jobq_jobs_enqueued_total", "job.s0"); got != 2 {
		t.Errorf("job.s0: got %v, want 2", got)
	}
	if n, err := testutil.GatherAndCount(reg, "jobq_jobs_enqueued_total"); err != nil || n != queue.MaxSubjectLabels+1 {
		t.Errorf("got %d series (%v), want %d", n, err, queue.MaxSubjectLabels+1)
	}
}

// TestMetricsNilIsOff runs a pool and a producer without metrics.
func TestMetricsNilIsOff(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	b.startPool(t, handlers.HandlerFunc(ok))
	b.enqueue(t, "job.plain", "plain-1", "x")
	b.waitState(t, "plain-1", data.StateDone)
}

// checkStatusGauges scrapes the status gauges and compares them with
// ReadStatus; the state must be still while it runs. wantJobs is JOB's
// expected count.
func checkStatusGauges(t *testing.T, b *testBundle, reg *prometheus.Registry, wantJobs uint64) {
	t.Helper()
	// The server updates a consumer's counts a moment after a publish: two
	// reads agree once they settle.
	var diff error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		st := b.status(t)
		if st.Stream.Messages != wantJobs {
			t.Fatalf("JOB holds %d jobs, want %d", st.Stream.Messages, wantJobs)
		}
		want := fmt.Sprintf(`
# HELP jobq_consumer_ack_pending Jobs delivered by WORKER and running or waiting for a retry.
# TYPE jobq_consumer_ack_pending gauge
jobq_consumer_ack_pending %d
# HELP jobq_consumer_pending Jobs stored and not yet delivered by the WORKER consumer.
# TYPE jobq_consumer_pending gauge
jobq_consumer_pending %d
# HELP jobq_dlq_jobs Jobs in the DLQ dead-letter stream.
# TYPE jobq_dlq_jobs gauge
jobq_dlq_jobs %d
# HELP jobq_ledger_records Records in the processed ledger bucket.
# TYPE jobq_ledger_records gauge
jobq_ledger_records %d
# HELP jobq_stream_jobs Jobs stored in the JOB stream.
# TYPE jobq_stream_jobs gauge
jobq_stream_jobs %d
`, st.Consumer.AckPending, st.Consumer.Pending, st.DLQ.Messages, st.Ledger.Records, st.Stream.Messages)
		if diff = testutil.GatherAndCompare(reg, strings.NewReader(want),
			"jobq_stream_jobs", "jobq_consumer_pending", "jobq_consumer_ack_pending", "jobq_dlq_jobs", "jobq_ledger_records"); diff == nil {
			return
		}
	}
	t.Errorf("status gauges differ from ReadStatus after 5s: %v", diff)
}

// metricOf returns the series of family name with subject label subject,
// or nil.
func metricOf(t *testing.T, reg prometheus.Gatherer, name, subject string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "subject" && l.GetValue() == subject {
					return m
				}
			}
		}
	}
	return nil
}

func counterValue(t *testing.T, reg prometheus.Gatherer, name, subject string) float64 {
	t.Helper()
	return metricOf(t, reg, name, subject).GetCounter().GetValue()
}

func histogramCount(t *testing.T, reg prometheus.Gatherer, name, subject string) uint64 {
	t.Helper()
	return metricOf(t, reg, name, subject).GetHistogram().GetSampleCount()
}
