package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// ErrConflict is returned by Provision when an existing object differs from
// jobq's configuration in a way that cannot be edited in place.
var ErrConflict = errors.New("existing jetstream object conflicts with jobq")

// Objects are the provisioned JetStream objects.
type Objects struct {
	JS     jetstream.JetStream
	Jobs   jetstream.Stream
	Worker jetstream.Consumer
	Dead   jetstream.Stream
	Ledger jetstream.KeyValue
	Config Config
}

// Provision creates JOB, WORKER, DLQ and processed, or brings existing ones in
// line with cfg. It is idempotent: the same config again changes nothing. An
// editable difference (dedupe window, max deliver, ack wait, TTL) is applied
// in place and logged; a difference that cannot be edited (retention,
// storage, ack policy, push consumer) is an ErrConflict and nothing is
// deleted.
func Provision(ctx context.Context, js jetstream.JetStream, cfg Config, log zerolog.Logger) (*Objects, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log = log.With().Str("component", "provision").Logger()
	o := &Objects{JS: js, Config: cfg}
	var err error
	if o.Jobs, err = ensureStream(ctx, js, jobStreamConfig(cfg), log); err != nil {
		return nil, err
	}
	if o.Dead, err = ensureStream(ctx, js, deadStreamConfig(), log); err != nil {
		return nil, err
	}
	if o.Worker, err = ensureConsumer(ctx, js, cfg, log); err != nil {
		return nil, err
	}
	if o.Ledger, err = ensureBucket(ctx, js, cfg, log); err != nil {
		return nil, err
	}
	return o, nil
}

func jobStreamConfig(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        StreamJob,
		Description: "jobq jobs",
		Subjects:    []string{SubjectJobs},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		// A full store refuses new jobs rather than dropping stored ones.
		Discard:    jetstream.DiscardNew,
		Duplicates: cfg.DedupeWindow,
		MaxMsgSize: int32(cfg.MaxPayload) + 64<<10, // room for headers
		MaxBytes:   cmp.Or(cfg.MaxBytes, -1),
		Replicas:   1,
	}
}

func deadStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        StreamDLQ,
		Description: "jobq dead letters",
		Subjects:    []string{SubjectDLQPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardNew,
		Duplicates:  DefaultDedupeWindow,
		MaxBytes:    -1,
		Replicas:    1,
	}
}

func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, log zerolog.Logger) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		if err != nil {
			return nil, fmt.Errorf("create stream %s: %w", want.Name, err)
		}
		log.Info().Str("stream", want.Name).Msg("stream created")
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", want.Name, err)
	}
	have := s.CachedInfo().Config
	if have.Retention != want.Retention {
		return nil, fmt.Errorf("%w: stream %s has retention %s, jobq needs %s; point --store-dir elsewhere or move the stream aside (nothing was changed)", ErrConflict, want.Name, have.Retention, want.Retention)
	}
	if have.Storage != want.Storage {
		return nil, fmt.Errorf("%w: stream %s has %s storage, jobq needs %s; point --store-dir elsewhere or move the stream aside (nothing was changed)", ErrConflict, want.Name, have.Storage, want.Storage)
	}
	next := have
	next.Subjects, next.Duplicates, next.Discard, next.MaxBytes = want.Subjects, want.Duplicates, want.Discard, want.MaxBytes
	if stored := s.CachedInfo().State.Bytes; next.MaxBytes > 0 && uint64(next.MaxBytes) < stored {
		// The server enforces a lowered cap by deleting the oldest jobs.
		next.MaxBytes = have.MaxBytes
		log.Warn().Str("stream", want.Name).Uint64("stored_bytes", stored).Int64("max_bytes", want.MaxBytes).
			Msg("stream holds more than the new byte cap: cap left as it was so no job is deleted; restart once it drained")
	}
	if want.MaxMsgSize != 0 {
		next.MaxMsgSize = want.MaxMsgSize
	}
	if slices.Equal(have.Subjects, next.Subjects) && have.Duplicates == next.Duplicates &&
		have.Discard == next.Discard && have.MaxMsgSize == next.MaxMsgSize && have.MaxBytes == next.MaxBytes {
		return s, nil
	}
	if s, err = js.UpdateStream(ctx, next); err != nil {
		return nil, fmt.Errorf("update stream %s: %w", want.Name, err)
	}
	log.Info().Str("stream", want.Name).
		Stringer("dedupe_window_was", have.Duplicates).Stringer("dedupe_window", next.Duplicates).
		Strs("subjects_were", have.Subjects).Int32("max_msg_size_was", have.MaxMsgSize).
		Int64("max_bytes_was", have.MaxBytes).Int64("max_bytes", next.MaxBytes).
		Msg("stream updated in place")
	return s, nil
}

// Bind returns o's objects looked up over js, without changing them: for a
// second connection, such as the one a worker pool gets so that its traffic
// does not queue behind a producer's on one connection.
func (o *Objects) Bind(ctx context.Context, js jetstream.JetStream) (*Objects, error) {
	b := &Objects{JS: js, Config: o.Config}
	var err error
	if b.Jobs, err = js.Stream(ctx, StreamJob); err != nil {
		return nil, fmt.Errorf("open stream %s: %w", StreamJob, err)
	}
	if b.Dead, err = js.Stream(ctx, StreamDLQ); err != nil {
		return nil, fmt.Errorf("open stream %s: %w", StreamDLQ, err)
	}
	if b.Worker, err = js.Consumer(ctx, StreamJob, ConsumerWorker); err != nil {
		return nil, fmt.Errorf("open consumer %s: %w", ConsumerWorker, err)
	}
	if b.Ledger, err = js.KeyValue(ctx, BucketProcessed); err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", BucketProcessed, err)
	}
	return b, nil
}

func ensureConsumer(ctx context.Context, js jetstream.JetStream, cfg Config, log zerolog.Logger) (jetstream.Consumer, error) {
	want := jetstream.ConsumerConfig{
		Durable:       ConsumerWorker,
		Description:   "jobq workers",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxDeliver:    cfg.MaxDeliver,
		AckWait:       cfg.AckWait,
		MaxAckPending: max(1000, 2*(cfg.Workers+cfg.Prefetch)),
	}
	c, err := js.Consumer(ctx, StreamJob, ConsumerWorker)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		c, err = js.CreateConsumer(ctx, StreamJob, want)
		if err != nil {
			return nil, fmt.Errorf("create consumer %s: %w", ConsumerWorker, err)
		}
		log.Info().Str("consumer", ConsumerWorker).Msg("consumer created")
		return c, nil
	}
	if errors.Is(err, jetstream.ErrNotPullConsumer) {
		return nil, fmt.Errorf("%w: consumer %s is a push consumer, jobq needs a pull consumer; delete it with `nats consumer rm %s %s` (nothing was changed)", ErrConflict, ConsumerWorker, StreamJob, ConsumerWorker)
	}
	if err != nil {
		return nil, fmt.Errorf("look up consumer %s: %w", ConsumerWorker, err)
	}
	have := c.CachedInfo().Config
	switch {
	case have.DeliverSubject != "":
		return nil, fmt.Errorf("%w: consumer %s is a push consumer, jobq needs a pull consumer; delete it with `nats consumer rm %s %s` (nothing was changed)", ErrConflict, ConsumerWorker, StreamJob, ConsumerWorker)
	case have.AckPolicy != want.AckPolicy:
		return nil, fmt.Errorf("%w: consumer %s has ack policy %s, jobq needs explicit (nothing was changed)", ErrConflict, ConsumerWorker, have.AckPolicy)
	case len(have.BackOff) > 0:
		// BackOff replaces AckWait as the lease and would redeliver long jobs.
		return nil, fmt.Errorf("%w: consumer %s has a backoff list, which replaces the ack wait jobq relies on (nothing was changed)", ErrConflict, ConsumerWorker)
	}
	if have.MaxDeliver == want.MaxDeliver && have.AckWait == want.AckWait && have.MaxAckPending >= want.MaxAckPending {
		return c, nil
	}
	next := have
	next.MaxDeliver, next.AckWait = want.MaxDeliver, want.AckWait
	next.MaxAckPending = max(have.MaxAckPending, want.MaxAckPending)
	if c, err = js.UpdateConsumer(ctx, StreamJob, next); err != nil {
		return nil, fmt.Errorf("update consumer %s: %w", ConsumerWorker, err)
	}
	log.Info().Str("consumer", ConsumerWorker).
		Int("max_deliver_was", have.MaxDeliver).Int("max_deliver", next.MaxDeliver).
		Stringer("ack_wait_was", have.AckWait).Stringer("ack_wait", next.AckWait).
		Msg("consumer updated in place")
	return c, nil
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, cfg Config, log zerolog.Logger) (jetstream.KeyValue, error) {
	want := jetstream.KeyValueConfig{
		Bucket:      BucketProcessed,
		Description: "jobq ledger: one record per job ID",
		History:     1,
		TTL:         cfg.ProcessedTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    1,
	}
	kv, err := js.KeyValue(ctx, BucketProcessed)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, want)
		if err != nil {
			return nil, fmt.Errorf("create bucket %s: %w", BucketProcessed, err)
		}
		log.Info().Str("bucket", BucketProcessed).Msg("bucket created")
		return kv, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up bucket %s: %w", BucketProcessed, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("read bucket %s: %w", BucketProcessed, err)
	}
	info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
	if info.Config.Storage != jetstream.FileStorage {
		return nil, fmt.Errorf("%w: bucket %s has %s storage, jobq needs file (nothing was changed)", ErrConflict, BucketProcessed, info.Config.Storage)
	}
	if st.TTL() == want.TTL {
		return kv, nil
	}
	want.History = uint8(st.History())
	if kv, err = js.UpdateKeyValue(ctx, want); err != nil {
		return nil, fmt.Errorf("update bucket %s: %w", BucketProcessed, err)
	}
	log.Info().Str("bucket", BucketProcessed).Stringer("ttl_was", st.TTL()).Stringer("ttl", want.TTL).Msg("bucket updated in place")
	return kv, nil
}
