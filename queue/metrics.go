package queue

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric label values.
const (
	// MaxSubjectLabels caps the distinct values of the subject label; jobs
	// on further subjects are counted under OtherSubjectLabel.
	MaxSubjectLabels = 100
	// OtherSubjectLabel is the subject label of the jobs past the cap, and
	// of subjects that are not valid UTF-8.
	OtherSubjectLabel = "other"
)

// durationBuckets spans a fast in-process handler to a five-minute one.
var durationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// Metrics counts what producers and workers do, for Prometheus: every
// counter and histogram is labelled by subject, the job subject's first two
// tokens ("job.email" for "job.email.welcome"), with at most
// MaxSubjectLabels values. Set it as Config.Metrics. A nil *Metrics records
// nothing. It is safe for concurrent use.
type Metrics struct {
	enqueued, started, completed, retried, deadLettered, skipped *prometheus.CounterVec
	handlerSeconds, waitSeconds                                  *prometheus.HistogramVec

	// bySubject maps a subject label to its bound metrics. It is replaced,
	// never changed, so a job's lookup takes no lock and allocates nothing.
	bySubject atomic.Pointer[map[string]*subjectMetrics]
	other     atomic.Pointer[subjectMetrics]
	mu        sync.Mutex // serializes adding a label
}

// subjectMetrics are the metrics of one subject label.
type subjectMetrics struct {
	enqueued, started, completed, retried, deadLettered, skipped prometheus.Counter
	handlerSeconds, waitSeconds                                  prometheus.Observer
}

// NewMetrics returns Metrics registered with reg. Registering a second
// Metrics with the same reg panics.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"subject"})
	}
	histogram := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: durationBuckets}, []string{"subject"})
	}
	m := &Metrics{
		enqueued:       counter("jobq_jobs_enqueued_total", "Jobs stored in JOB by this process's producers, duplicates not counted."),
		started:        counter("jobq_jobs_started_total", "Handler runs started."),
		completed:      counter("jobq_jobs_completed_total", "Jobs whose completion was recorded."),
		retried:        counter("jobq_jobs_retried_total", "Failed attempts released for a retry."),
		deadLettered:   counter("jobq_jobs_dead_lettered_total", "Jobs moved to the dead-letter stream."),
		skipped:        counter("jobq_jobs_skipped_total", "Deliveries acked without running: the job was done already, is dead-lettered already, or is a duplicate of a running job."),
		handlerSeconds: histogram("jobq_handler_duration_seconds", "How long handler runs took, successful or not."),
		waitSeconds:    histogram("jobq_enqueue_to_start_seconds", "Time from a job's enqueue to the start of its first run."),
	}
	m.bySubject.Store(&map[string]*subjectMetrics{})
	if reg != nil {
		reg.MustRegister(m.enqueued, m.started, m.completed, m.retried, m.deadLettered, m.skipped, m.handlerSeconds, m.waitSeconds)
	}
	return m
}

// subjectLabel returns the first two tokens of subject: "job.email" for
// "job.email.welcome". It does not allocate.
func subjectLabel(subject string) string {
	i := strings.IndexByte(subject, '.')
	if i < 0 {
		return subject
	}
	if j := strings.IndexByte(subject[i+1:], '.'); j >= 0 {
		return subject[:i+1+j]
	}
	return subject
}

// of returns the metrics of subject's label.
func (m *Metrics) of(subject string) *subjectMetrics {
	label := subjectLabel(subject)
	labels := *m.bySubject.Load()
	if s, ok := labels[label]; ok {
		return s
	}
	if o := m.other.Load(); o != nil && len(labels) >= MaxSubjectLabels {
		return o
	}
	return m.add(label)
}

// add binds the metrics of a new label, or of OtherSubjectLabel once the
// cap is reached.
func (m *Metrics) add(label string) *subjectMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.bySubject.Load()
	if s, ok := old[label]; ok {
		return s
	}
	if len(old) >= MaxSubjectLabels || label == OtherSubjectLabel || !utf8.ValidString(label) {
		if o := m.other.Load(); o != nil {
			return o
		}
		o := m.bind(OtherSubjectLabel)
		m.other.Store(o)
		return o
	}
	label = strings.Clone(label) // not the delivered message's memory
	s := m.bind(label)
	labels := make(map[string]*subjectMetrics, len(old)+1)
	for k, v := range old {
		labels[k] = v
	}
	labels[label] = s
	m.bySubject.Store(&labels)
	return s
}

func (m *Metrics) bind(label string) *subjectMetrics {
	return &subjectMetrics{
		enqueued:       m.enqueued.WithLabelValues(label),
		started:        m.started.WithLabelValues(label),
		completed:      m.completed.WithLabelValues(label),
		retried:        m.retried.WithLabelValues(label),
		deadLettered:   m.deadLettered.WithLabelValues(label),
		skipped:        m.skipped.WithLabelValues(label),
		handlerSeconds: m.handlerSeconds.WithLabelValues(label),
		waitSeconds:    m.waitSeconds.WithLabelValues(label),
	}
}

// jobEnqueued counts a job stored by a producer (not a duplicate).
func (m *Metrics) jobEnqueued(subject string) {
	if m == nil {
		return
	}
	m.of(subject).enqueued.Inc()
}

// jobStarted counts a handler run about to start and, on a job's first
// run, observes how long it waited since its enqueue.
func (m *Metrics) jobStarted(subject string, first bool, enqueuedAt time.Time) {
	if m == nil {
		return
	}
	s := m.of(subject)
	s.started.Inc()
	if first && !enqueuedAt.IsZero() {
		s.waitSeconds.Observe(max(time.Since(enqueuedAt), 0).Seconds())
	}
}

// jobHandled observes how long a handler run took.
func (m *Metrics) jobHandled(subject string, took time.Duration) {
	if m == nil {
		return
	}
	m.of(subject).handlerSeconds.Observe(took.Seconds())
}

// jobCompleted counts a job whose completion was recorded.
func (m *Metrics) jobCompleted(subject string) {
	if m == nil {
		return
	}
	m.of(subject).completed.Inc()
}

// jobRetried counts a failed attempt released for a retry.
func (m *Metrics) jobRetried(subject string) {
	if m == nil {
		return
	}
	m.of(subject).retried.Inc()
}

// jobDeadLettered counts a job moved to DLQ.
func (m *Metrics) jobDeadLettered(subject string) {
	if m == nil {
		return
	}
	m.of(subject).deadLettered.Inc()
}

// jobSkipped counts a delivery acked without running.
func (m *Metrics) jobSkipped(subject string) {
	if m == nil {
		return
	}
	m.of(subject).skipped.Inc()
}

// DefaultStatusTimeout bounds one scrape's read of the JetStream objects.
const DefaultStatusTimeout = 2 * time.Second

// StatusCollector reports jobq's JetStream objects as gauges, read with
// ReadStatus at each scrape: jobq_stream_jobs, jobq_consumer_pending,
// jobq_consumer_ack_pending, jobq_dlq_jobs and jobq_ledger_records. A read
// that fails or times out makes the scrape report an error for these
// gauges; the other metrics are unaffected when the handler continues on
// errors (promhttp.ContinueOnError).
type StatusCollector struct {
	obj     *Objects
	timeout time.Duration
	descs   statusDescs
}

type statusDescs struct {
	streamJobs, pending, ackPending, dlqJobs, ledgerRecords *prometheus.Desc
}

// NewStatusCollector returns a StatusCollector over obj whose reads take at
// most timeout; 0 means DefaultStatusTimeout.
func NewStatusCollector(obj *Objects, timeout time.Duration) *StatusCollector {
	if timeout <= 0 {
		timeout = DefaultStatusTimeout
	}
	return &StatusCollector{obj: obj, timeout: timeout, descs: statusDescs{
		streamJobs:    prometheus.NewDesc("jobq_stream_jobs", "Jobs stored in the "+StreamJob+" stream.", nil, nil),
		pending:       prometheus.NewDesc("jobq_consumer_pending", "Jobs stored and not yet delivered by the "+ConsumerWorker+" consumer.", nil, nil),
		ackPending:    prometheus.NewDesc("jobq_consumer_ack_pending", "Jobs delivered by "+ConsumerWorker+" and running or waiting for a retry.", nil, nil),
		dlqJobs:       prometheus.NewDesc("jobq_dlq_jobs", "Jobs in the "+StreamDLQ+" dead-letter stream.", nil, nil),
		ledgerRecords: prometheus.NewDesc("jobq_ledger_records", "Records in the "+BucketProcessed+" ledger bucket.", nil, nil),
	}}
}

// Describe implements prometheus.Collector.
func (c *StatusCollector) Describe(ch chan<- *prometheus.Desc) {
	d := c.descs
	for _, desc := range []*prometheus.Desc{d.streamJobs, d.pending, d.ackPending, d.dlqJobs, d.ledgerRecords} {
		ch <- desc
	}
}

// Collect implements prometheus.Collector.
func (c *StatusCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	d := c.descs
	st, err := ReadStatus(ctx, c.obj)
	if err != nil {
		for _, desc := range []*prometheus.Desc{d.streamJobs, d.pending, d.ackPending, d.dlqJobs, d.ledgerRecords} {
			ch <- prometheus.NewInvalidMetric(desc, err)
		}
		return
	}
	gauge := func(desc *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v)
	}
	gauge(d.streamJobs, float64(st.Stream.Messages))
	gauge(d.pending, float64(st.Consumer.Pending))
	gauge(d.ackPending, float64(st.Consumer.AckPending))
	gauge(d.dlqJobs, float64(st.DLQ.Messages))
	gauge(d.ledgerRecords, float64(st.Ledger.Records))
}
