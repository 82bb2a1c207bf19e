package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
)

// Status is a snapshot of jobq's JetStream objects.
type Status struct {
	Stream   StreamStatus   `json:"stream"`
	Consumer ConsumerStatus `json:"consumer"`
	DLQ      StreamStatus   `json:"dlq"`
	Ledger   LedgerStatus   `json:"ledger"`
}

// StreamStatus describes a stream.
type StreamStatus struct {
	Name     string `json:"name"`
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// DedupeWindow is set for JOB only.
	DedupeWindow string `json:"dedupe_window,omitempty"`
}

// ConsumerStatus describes WORKER.
type ConsumerStatus struct {
	Name string `json:"name"`
	// Pending jobs are stored and not yet delivered.
	Pending uint64 `json:"pending"`
	// AckPending jobs are delivered and running or waiting for a retry.
	AckPending  int    `json:"ack_pending"`
	Redelivered int    `json:"redelivered"`
	Waiting     int    `json:"waiting_pulls"`
	MaxDeliver  int    `json:"max_deliver"`
	AckWait     string `json:"ack_wait"`
}

// LedgerStatus describes the processed bucket.
type LedgerStatus struct {
	Bucket  string `json:"bucket"`
	Records uint64 `json:"records"`
	// Leases counts the worker pools' leases (see data.Lease) in the
	// bucket, beside the records: one per running pool, and those that
	// pools killed before they could delete them left until they end.
	Leases uint64 `json:"leases"`
	Bytes  uint64 `json:"bytes"`
	TTL    string `json:"ttl"`
}

// Open looks up jobq's objects without creating or changing them, for client
// commands against a running jobq.
func Open(ctx context.Context, js jetstream.JetStream) (*Objects, error) {
	o := &Objects{JS: js}
	var err error
	if o.Jobs, err = js.Stream(ctx, StreamJob); err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", StreamJob, err)
	}
	if o.Worker, err = js.Consumer(ctx, StreamJob, ConsumerWorker); err != nil {
		return nil, fmt.Errorf("look up consumer %s: %w", ConsumerWorker, err)
	}
	// A deleted DLQ holds no dead letters: the client commands go on
	// without it (see deadStream), enqueue among them, rather than fail
	// until a pool makes it again.
	if o.Dead, err = js.Stream(ctx, StreamDLQ); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("look up stream %s: %w", StreamDLQ, err)
	}
	if o.Ledger, err = js.KeyValue(ctx, BucketProcessed); err != nil {
		return nil, fmt.Errorf("look up bucket %s: %w", BucketProcessed, err)
	}
	ci := o.Worker.CachedInfo().Config
	// The replicas of JOB, for DLQ if a pool makes it again (see
	// makeDLQAnew): Provision gives them all the same.
	o.Config = Config{MaxDeliver: ci.MaxDeliver, AckWait: ci.AckWait, Replicas: o.Jobs.CachedInfo().Config.Replicas}
	switch jobMax := o.Jobs.CachedInfo().Config.MaxBytes; {
	case o.Dead != nil:
		o.Config.DeadMaxBytes = max(o.Dead.CachedInfo().Config.MaxBytes, 0)
	case jobMax > 0:
		// DLQ was deleted: made anew, it takes its share of the store
		// again.
		o.Config.DeadMaxBytes = deadShareOf(jobMax)
	}
	if st, err := o.Ledger.Status(ctx); err == nil {
		o.Config.ProcessedTTL = st.TTL()
	}
	o.Config = o.Config.withDefaults()
	return o, nil
}

// ReadStatus reads a Status.
func ReadStatus(ctx context.Context, o *Objects) (Status, error) {
	var st Status
	si, err := o.Jobs.Info(ctx)
	if err != nil {
		return st, fmt.Errorf("read stream %s: %w", StreamJob, err)
	}
	st.Stream = streamStatus(si)
	st.Stream.DedupeWindow = si.Config.Duplicates.String()
	_, di, err := deadLetterInfo(ctx, o)
	if err != nil {
		return st, fmt.Errorf("read stream %s: %w", StreamDLQ, err)
	}
	st.DLQ = StreamStatus{Name: StreamDLQ}
	if di != nil {
		st.DLQ = streamStatus(di)
	}
	ci, err := o.Worker.Info(ctx)
	if err != nil {
		return st, fmt.Errorf("read consumer %s: %w", ConsumerWorker, err)
	}
	st.Consumer = ConsumerStatus{
		Name: ci.Name, Pending: ci.NumPending, AckPending: ci.NumAckPending,
		Redelivered: ci.NumRedelivered, Waiting: ci.NumWaiting,
		MaxDeliver: ci.Config.MaxDeliver, AckWait: ci.Config.AckWait.String(),
	}
	ks, err := o.Ledger.Status(ctx)
	if err != nil {
		return st, fmt.Errorf("read bucket %s: %w", BucketProcessed, err)
	}
	st.Ledger = LedgerStatus{Bucket: ks.Bucket(), Records: ks.Values(), Bytes: ks.Bytes(), TTL: ks.TTL().String()}
	if kv, ok := ks.(*jetstream.KeyValueBucketStatus); ok {
		// A key each: a bucket that keeps more history (an operator's
		// --max-msgs-per-subject, which provisioning keeps) holds several
		// messages of a record.
		st.Ledger.Records = kv.StreamInfo().State.NumSubjects
	}
	keys, live, err := countLeases(ctx, o.JS, o.Ledger)
	if err != nil {
		return st, fmt.Errorf("read bucket %s: %w", BucketProcessed, err)
	}
	st.Ledger.Leases = live
	st.Ledger.Records -= min(keys, st.Ledger.Records)
	return st, nil
}

// countLeases counts the lease keys in the processed bucket, those whose
// last message is a delete marker included, as its subject count does, and
// the leases that are there.
func countLeases(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue) (keys, live uint64, err error) {
	s, err := js.Stream(ctx, "KV_"+BucketProcessed)
	if err != nil {
		return 0, 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("$KV."+BucketProcessed+"."+data.LeasePrefix+">"))
	if err != nil {
		return 0, 0, err
	}
	keys = uint64(len(info.State.Subjects))
	if keys == 0 {
		return 0, 0, nil
	}
	names, err := kv.ListKeysFiltered(ctx, data.LeasePrefix+">")
	if err != nil {
		return 0, 0, err
	}
	for range names.Keys() {
		live++
	}
	return keys, live, nil
}

func streamStatus(si *jetstream.StreamInfo) StreamStatus {
	return StreamStatus{
		Name: si.Config.Name, Messages: si.State.Msgs, Bytes: si.State.Bytes,
		FirstSeq: si.State.FirstSeq, LastSeq: si.State.LastSeq,
	}
}

// Demo publishes a payroll job every interval until ctx ends, with IDs like
// "payroll-20261129T103000-0001" (the demo's start time and a counter), so a
// first run shows jobs flowing and a restarted demo does not reuse IDs.
func Demo(ctx context.Context, p *Producer, interval time.Duration, onErr func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	run := time.Now().UTC().Format("20060102T150405")
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		day := time.Now().UTC().Format("2006-01-02")
		id := fmt.Sprintf("payroll-%s-%04d", run, n)
		payload := fmt.Sprintf(`{"employee":"E%03d","period":"%s","amount":%d}`, n%100, day, 1000+n%7*250)
		if _, err := p.Enqueue(ctx, "job.payroll", []byte(payload), EnqueueOptions{ID: id}); err != nil && ctx.Err() == nil {
			onErr(err)
		}
	}
}
