package queue

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSubjectLabel(t *testing.T) {
	t.Parallel()
	tests := []struct{ subject, want string }{
		{"job.email.welcome", "job.email"},
		{"job.email", "job.email"},
		{"job.a.b.c.d", "job.a"},
		{"job", "job"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := subjectLabel(tt.subject); got != tt.want {
			t.Errorf("subjectLabel(%q): got %q, want %q", tt.subject, got, tt.want)
		}
	}
}

func TestMetricsInvalidUTF8IsOther(t *testing.T) {
	t.Parallel()
	m := NewMetrics(prometheus.NewRegistry())
	m.jobEnqueued("job.\xff.x") // a label that is not UTF-8 would panic in client_golang
	if got := testutil.ToFloat64(m.enqueued.WithLabelValues(OtherSubjectLabel)); got != 1 {
		t.Errorf("other: got %v, want 1", got)
	}
}

func TestMetricsNilIsSafe(t *testing.T) {
	t.Parallel()
	var m *Metrics
	m.jobEnqueued("job.x")
	m.jobStarted("job.x", true, time.Now())
	m.jobHandled("job.x", time.Second)
	m.jobCompleted("job.x")
	m.jobRetried("job.x")
	m.jobDeadLettered("job.x")
	m.jobSkipped("job.x")
}

// TestMetricsHotPathDoesNotAllocate checks that counting a job on a known
// label costs no allocation, also at the cap.
func TestMetricsHotPathDoesNotAllocate(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	subject := "job.email.welcome"
	enqueuedAt := time.Now()
	m.jobStarted(subject, true, enqueuedAt) // binds the label
	for i := range MaxSubjectLabels + 1 {
		m.jobSkipped("job.s" + string(rune('a'+i%26)) + string(rune('a'+i/26)))
	}
	over := "job.beyond.cap"
	m.jobSkipped(over)
	allocs := testing.AllocsPerRun(100, func() {
		m.jobStarted(subject, true, enqueuedAt)
		m.jobHandled(subject, time.Millisecond)
		m.jobCompleted(subject)
		m.jobRetried(over)
	})
	if allocs != 0 {
		t.Errorf("got %v allocations per job, want 0", allocs)
	}
}
