package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

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
	// Dead is DLQ; nil in Open's objects if DLQ was deleted then (a pool
	// makes it again with the next dead letter; see deadStream).
	Dead   jetstream.Stream
	Ledger jetstream.KeyValue
	Config Config

	// afterJOBLookUp, in tests, runs in an eager jobStream's check after
	// its look-ups of JOB (see jobStream.earlier).
	afterJOBLookUp func()
}

// Provision creates JOB, WORKER, DLQ and processed, or brings existing ones in
// line with cfg. It is idempotent: the same config again changes nothing. An
// editable difference (dedupe window, max deliver, ack wait, TTL) is applied
// in place and logged; a difference that cannot be edited (retention,
// storage, ack policy, push consumer) is an ErrConflict and nothing is
// deleted.
func Provision(ctx context.Context, js jetstream.JetStream, cfg Config, log zerolog.Logger) (*Objects, error) {
	o, err := provision(ctx, js, cfg, log)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrStorageResourcesExceeded {
		return nil, fmt.Errorf("%w: %w; raise the limit (jobq serve --max-store, or the server's max_file_store), or lower the caps of %s and %s first (nats stream edit %s --max-bytes N)", ErrStoreLimit, err, StreamJob, StreamDLQ, StreamJob)
	}
	return o, err
}

// ErrStoreLimit is a stream the server would not make or edit, as the caps
// the streams hold, with the new one, add up to more than its storage
// limit: so after --max-store was lowered, even for an edit that lowers a
// cap.
var ErrStoreLimit = errors.New("the caps of the server's streams add up to more than its storage limit")

// jsErrStorageResourcesExceeded is nats-server's code for ErrStoreLimit.
const jsErrStorageResourcesExceeded = 10047

func provision(ctx context.Context, js jetstream.JetStream, cfg Config, log zerolog.Logger) (*Objects, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log = log.With().Str("component", "provision").Logger()
	o := &Objects{JS: js, Config: cfg}
	// What was created or edited, for a conflict met after it.
	var changes []string
	var change string
	var err error
	if o.Jobs, change, err = ensureStream(ctx, js, jobStreamConfig(cfg, js.Conn().MaxPayload()), log); err != nil {
		return nil, conflictAfter(err, changes)
	}
	if change != "" {
		changes = append(changes, change)
	}
	if o.Dead, change, err = ensureStream(ctx, js, deadStreamConfig(cfg), log); err != nil {
		return nil, conflictAfter(err, changes)
	}
	if change != "" {
		changes = append(changes, change)
	}
	if o.Worker, change, err = ensureConsumer(ctx, js, cfg, log); err != nil {
		return nil, conflictAfter(err, changes)
	}
	if change != "" {
		changes = append(changes, change)
	}
	if o.Ledger, err = ensureBucket(ctx, js, cfg, log); err != nil {
		return nil, conflictAfter(err, changes)
	}
	return o, nil
}

// What ensureStream and ensureConsumer did to an object, at the end of the
// change they return ("" when it was as jobq wants it).
const (
	wasCreated = "was created"
	wasUpdated = "was updated in place"
)

// conflictAfter ends an ErrConflict's message with what provisioning
// changed before it met the conflict: nothing, or changes (the objects it
// created or edited in place, which stay so).
func conflictAfter(err error, changes []string) error {
	switch {
	case !errors.Is(err, ErrConflict):
		return err
	case len(changes) == 0:
		return fmt.Errorf("%w (nothing was changed)", err)
	}
	return fmt.Errorf("%w (%s before it; nothing else was changed)", err, strings.Join(changes, " and "))
}

// jobStreamConfig is JOB as jobq makes it, on a server that carries
// messages of up to serverMax bytes (0: unknown).
func jobStreamConfig(cfg Config, serverMax int64) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        StreamJob,
		Description: "jobq jobs",
		Subjects:    []string{SubjectJobs},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		// A full store refuses new jobs rather than dropping stored ones.
		Discard:    jetstream.DiscardNew,
		Duplicates: cfg.DedupeWindow,
		MaxMsgSize: int32(jobMaxMsgSize(cfg.MaxPayload, serverMax)),
		MaxBytes:   cmp.Or(cfg.MaxBytes, -1),
		Replicas:   cfg.Replicas,
	}
}

// jobMaxMsgSize is the largest job JOB takes, headers and all: maxPayload
// and 64 KiB of room for headers, or the server's limit (0: unknown) if
// lower, less the room a job leaves for what its dead letter adds
// (dlqRoom), or DLQ would refuse it every time.
func jobMaxMsgSize(maxPayload int, serverMax int64) int64 {
	limit := int64(maxPayload) + 64<<10
	if serverMax > 0 {
		limit = min(limit, serverMax)
	}
	return limit - dlqRoom
}

func deadStreamConfig(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        StreamDLQ,
		Description: "jobq dead letters",
		Subjects:    []string{SubjectDLQPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardNew,
		Duplicates:  DefaultDedupeWindow,
		MaxBytes:    cmp.Or(cfg.DeadMaxBytes, -1),
		// -1, not 0: an operator's cap is put back (see ensureStream), or
		// every dead letter over it is refused and its job never leaves JOB.
		MaxMsgSize: -1,
		Replicas:   cfg.Replicas,
	}
}

// ensureStream creates want's stream, or checks the one found and edits it
// in place to jobq's settings. One that another jobq (or client) created
// between the look-up that found none and the create, with settings of its
// own (another --dedupe-window, say), is looked up again and taken as
// found: its create failed with "already in use", and of two jobq started
// together on one server with different flags, one exited. (With the same
// settings the create succeeds.) ensureConsumer and ensureBucket do the
// same.
func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, log zerolog.Logger) (s jetstream.Stream, change string, err error) {
	lookUp := func() (jetstream.Stream, error) {
		return retryUnanswered(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, want.Name) })
	}
	s, err = lookUp()
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		switch {
		case err == nil:
			log.Info().Str("stream", want.Name).Msg("stream created")
			return s, "stream " + want.Name + " " + wasCreated, nil
		case !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
			return nil, "", fmt.Errorf("create stream %s: %w", want.Name, err)
		}
		// Made by another jobq between the look-up and the create (see
		// ensureStream).
		s, err = lookUp()
	}
	if err != nil {
		return nil, "", fmt.Errorf("look up stream %s: %w", want.Name, err)
	}
	have := s.CachedInfo().Config
	if have.Retention != want.Retention {
		return nil, "", fmt.Errorf("%w: stream %s has retention %s, jobq needs %s; use another store (--store-dir, or with --server another server) or move the stream aside", ErrConflict, want.Name, have.Retention, want.Retention)
	}
	if have.Storage != want.Storage {
		return nil, "", fmt.Errorf("%w: stream %s has %s storage, jobq needs %s; use another store (--store-dir, or with --server another server) or move the stream aside", ErrConflict, want.Name, have.Storage, want.Storage)
	}
	if err := sameReplicas("stream "+want.Name, have.Replicas, want.Replicas, "nats stream edit "+want.Name+" --replicas "+strconv.Itoa(want.Replicas)); err != nil {
		return nil, "", err
	}
	if err := keepsWhatItStores("stream "+want.Name, have, true); err != nil {
		return nil, "", err
	}
	if have.AllowMsgTTL {
		// The server takes no edit that turns them off again.
		log.Warn().Str("stream", want.Name).
			Msg("stream allows per-message TTLs, which cannot be turned off: a message another client publishes with a Nats-TTL header expires unrun, with no dead letter; to close this, let it drain, stop jobq, delete the stream (nats stream rm " + want.Name + ") and start jobq again")
	}
	next := have
	next.Subjects, next.Duplicates, next.Discard, next.MaxBytes = want.Subjects, want.Duplicates, want.Discard, want.MaxBytes
	// Limits that would delete stored jobs or dead letters, and publishes
	// stored without an answer, are put back as jobq makes them.
	next.MaxAge, next.MaxMsgs, next.MaxMsgsPerSubject, next.DiscardNewPerSubject, next.NoAck = 0, -1, -1, false, false
	// So are roll-ups: another client's message with a Nats-Rollup header
	// would purge every job or dead letter stored before it.
	next.AllowRollup = false
	if stored := s.CachedInfo().State.Bytes; next.MaxBytes > 0 && uint64(next.MaxBytes) < stored {
		// The server enforces a lowered cap by deleting the oldest jobs.
		next.MaxBytes = have.MaxBytes
		log.Warn().Str("stream", want.Name).Uint64("stored_bytes", stored).Int64("max_bytes", want.MaxBytes).
			Msg("stream holds more than the new byte cap: cap left as it was so no job is deleted; restart once it drained")
	}
	if want.MaxMsgSize != 0 {
		next.MaxMsgSize = want.MaxMsgSize
	}
	if reflect.DeepEqual(have, next) {
		return s, "", nil
	}
	if s, err = js.UpdateStream(ctx, next); err != nil {
		return nil, "", fmt.Errorf("update stream %s: %w", want.Name, err)
	}
	log.Info().Str("stream", want.Name).
		Stringer("dedupe_window_was", have.Duplicates).Stringer("dedupe_window", next.Duplicates).
		Strs("subjects_were", have.Subjects).Int32("max_msg_size_was", have.MaxMsgSize).
		Int64("max_bytes_was", have.MaxBytes).Int64("max_bytes", next.MaxBytes).
		Stringer("max_age_was", have.MaxAge).Int64("max_msgs_was", have.MaxMsgs).
		Int64("max_msgs_per_subject_was", have.MaxMsgsPerSubject).Bool("no_ack_was", have.NoAck).
		Bool("allow_rollup_was", have.AllowRollup).
		Msg("stream updated in place")
	return s, "stream " + want.Name + " " + wasUpdated, nil
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

func ensureConsumer(ctx context.Context, js jetstream.JetStream, cfg Config, log zerolog.Logger) (jetstream.Consumer, string, error) {
	want := jetstream.ConsumerConfig{
		Durable:       ConsumerWorker,
		Description:   "jobq workers",
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxDeliver:    cfg.MaxDeliver,
		AckWait:       cfg.AckWait,
		MaxAckPending: max(1000, 2*(cfg.Workers+cfg.Prefetch)),
	}
	lookUp := func() (jetstream.Consumer, error) {
		return retryUnanswered(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
			return js.Consumer(ctx, StreamJob, ConsumerWorker)
		})
	}
	c, err := lookUp()
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		c, err = js.CreateConsumer(ctx, StreamJob, want)
		switch {
		case err == nil:
			log.Info().Str("consumer", ConsumerWorker).Msg("consumer created")
			return c, "consumer " + ConsumerWorker + " " + wasCreated, nil
		case !errors.Is(err, jetstream.ErrConsumerExists):
			return nil, "", fmt.Errorf("create consumer %s: %w", ConsumerWorker, err)
		}
		// Made by another jobq between the look-up and the create (see
		// ensureStream).
		c, err = lookUp()
	}
	if errors.Is(err, jetstream.ErrNotPullConsumer) {
		return nil, "", fmt.Errorf("%w: consumer %s is a push consumer, jobq needs a pull consumer; delete it with `nats consumer rm %s %s`", ErrConflict, ConsumerWorker, StreamJob, ConsumerWorker)
	}
	if err != nil {
		return nil, "", fmt.Errorf("look up consumer %s: %w", ConsumerWorker, err)
	}
	have := c.CachedInfo().Config
	switch {
	case have.DeliverSubject != "":
		return nil, "", fmt.Errorf("%w: consumer %s is a push consumer, jobq needs a pull consumer; delete it with `nats consumer rm %s %s`", ErrConflict, ConsumerWorker, StreamJob, ConsumerWorker)
	case have.AckPolicy != want.AckPolicy:
		return nil, "", fmt.Errorf("%w: consumer %s has ack policy %s, jobq needs explicit", ErrConflict, ConsumerWorker, have.AckPolicy)
	case len(have.BackOff) > 0:
		// BackOff replaces AckWait as the lease and would redeliver long jobs.
		return nil, "", fmt.Errorf("%w: consumer %s has a backoff list, which replaces the ack wait jobq relies on", ErrConflict, ConsumerWorker)
	}
	next := have
	next.MaxDeliver, next.AckWait = want.MaxDeliver, want.AckWait
	if have.MaxAckPending >= 0 { // -1: no limit, more than any
		next.MaxAckPending = max(have.MaxAckPending, want.MaxAckPending)
	}
	// A filter would leave the other jobs undelivered, to be swept into
	// DLQ as exhausted unrun; headers only would run jobs without their
	// payloads and record them done.
	next.FilterSubject, next.HeadersOnly = "", false
	if len(next.FilterSubjects) > 0 {
		next.FilterSubjects = nil
	}
	// Priority groups would refuse every pull of jobq's, which names no
	// group: no job would run.
	next.PriorityPolicy, next.PinnedTTL = jetstream.PriorityPolicyNone, 0
	if len(next.PriorityGroups) > 0 {
		next.PriorityGroups = nil
	}
	if reflect.DeepEqual(have, next) {
		return c, "", nil
	}
	if c, err = js.UpdateConsumer(ctx, StreamJob, next); err != nil {
		return nil, "", fmt.Errorf("update consumer %s: %w", ConsumerWorker, err)
	}
	log.Info().Str("consumer", ConsumerWorker).
		Int("max_deliver_was", have.MaxDeliver).Int("max_deliver", next.MaxDeliver).
		Stringer("ack_wait_was", have.AckWait).Stringer("ack_wait", next.AckWait).
		Int("max_ack_pending_was", have.MaxAckPending).Int("max_ack_pending", next.MaxAckPending).
		Str("filter_subject_was", have.FilterSubject).Strs("filter_subjects_were", have.FilterSubjects).
		Bool("headers_only_was", have.HeadersOnly).Strs("priority_groups_were", have.PriorityGroups).
		Msg("consumer updated in place")
	return c, "consumer " + ConsumerWorker + " " + wasUpdated, nil
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, cfg Config, log zerolog.Logger) (jetstream.KeyValue, error) {
	lookUp := func() (jetstream.KeyValue, error) {
		return retryUnanswered(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return js.KeyValue(ctx, BucketProcessed) })
	}
	kv, err := lookUp()
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = createBucket(ctx, js, cfg, log)
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return kv, err
		}
		// Made by another jobq between the look-up and the create (see
		// ensureStream).
		kv, err = lookUp()
	}
	if err != nil {
		return nil, fmt.Errorf("look up bucket %s: %w", BucketProcessed, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("read bucket %s: %w", BucketProcessed, err)
	}
	have := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
	if have.Storage != jetstream.FileStorage {
		return nil, fmt.Errorf("%w: bucket %s has %s storage, jobq needs file", ErrConflict, BucketProcessed, have.Storage)
	}
	if err := sameReplicas("bucket "+BucketProcessed, have.Replicas, cfg.Replicas, bucketEdit(cfg.Replicas)); err != nil {
		return nil, err
	}
	if err := keepsWhatItStores("bucket "+BucketProcessed, have, false); err != nil {
		return nil, err
	}
	if have.Replicas > 1 && have.AllowDirect {
		return nil, fmt.Errorf("%w: bucket %s has %s and answers direct gets, so a follower behind its leader could answer jobq's ledger reads and a job recorded done could run again; stop every jobq on it and run `nats stream edit %s --no-allow-direct`",
			ErrConflict, BucketProcessed, replicas(have.Replicas), bucketStream)
	}
	// The stream is edited rather than the bucket, which would also turn
	// direct gets back on, and set aside what else it has.
	next := have
	next.MaxAge = cfg.ProcessedTTL
	next.Duplicates = min(next.Duplicates, cfg.ProcessedTTL)
	// A record must live its TTL: no limit may evict it sooner, and a full
	// bucket refuses writes rather than drop old records.
	next.MaxMsgs, next.MaxBytes, next.Discard, next.NoAck = -1, -1, jetstream.DiscardNew, false
	next.DiscardNewPerSubject = false // it would refuse every second write of a key
	next.MaxMsgsPerSubject = max(next.MaxMsgsPerSubject, 1)
	// A size cap would refuse the records and leases over it: jobs would
	// never be checked, claimed or recorded done.
	next.MaxMsgSize = -1
	if reflect.DeepEqual(have, next) {
		return kv, nil
	}
	if _, err := js.UpdateStream(ctx, next); err != nil {
		return nil, fmt.Errorf("update bucket %s: %w", BucketProcessed, err)
	}
	log.Info().Str("bucket", BucketProcessed).Stringer("ttl_was", have.MaxAge).Stringer("ttl", cfg.ProcessedTTL).
		Int64("max_msgs_was", have.MaxMsgs).Int64("max_bytes_was", have.MaxBytes).Stringer("discard_was", have.Discard).
		Int64("max_msgs_per_subject_was", have.MaxMsgsPerSubject).Bool("discard_new_per_subject_was", have.DiscardNewPerSubject).
		Bool("no_ack_was", have.NoAck).Int32("max_msg_size_was", have.MaxMsgSize).Msg("bucket updated in place")
	return js.KeyValue(ctx, BucketProcessed)
}

// keepsWhatItStores refuses an object on which jobq could not keep its
// promises, and that no edit can put right: one sealed, one that answers
// writes before they are stored, or, if jobq deletes from it, one that
// denies deletes (a job could then not leave JOB, nor a dead letter DLQ,
// once handled). The bucket denies them: its records go by markers.
func keepsWhatItStores(object string, have jetstream.StreamConfig, deletes bool) error {
	var what string
	switch {
	case have.Sealed:
		what = "is sealed"
	case deletes && have.DenyDelete:
		what = "denies message deletes"
	case have.PersistMode == jetstream.AsyncPersistMode:
		what = "persists asynchronously, answering writes that a crash can lose"
	default:
		return nil
	}
	return fmt.Errorf("%w: %s %s, which the server cannot undo and jobq cannot work with; move it aside", ErrConflict, object, what)
}

// bucketStream is the stream that holds the processed bucket.
const bucketStream = "KV_" + BucketProcessed

// createBucket creates the processed bucket. One copy answers direct gets,
// which the pools' batched reads use; a replicated one answers reads from
// its leader alone, since a follower can be behind it. The bucket's stream
// is created as such at once, so that no pool sees it otherwise.
func createBucket(ctx context.Context, js jetstream.JetStream, cfg Config, log zerolog.Logger) (jetstream.KeyValue, error) {
	want := jetstream.KeyValueConfig{
		Bucket:      BucketProcessed,
		Description: "jobq ledger: one record per job ID",
		History:     1,
		TTL:         cfg.ProcessedTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}
	if cfg.Replicas == 1 {
		kv, err := js.CreateKeyValue(ctx, want)
		if err != nil {
			return nil, fmt.Errorf("create bucket %s: %w", BucketProcessed, err)
		}
		log.Info().Str("bucket", BucketProcessed).Msg("bucket created")
		return kv, nil
	}
	// The stream nats.go makes of want, but for direct gets.
	sc := jetstream.StreamConfig{
		Name:              bucketStream,
		Description:       want.Description,
		Subjects:          []string{"$KV." + BucketProcessed + ".>"},
		MaxMsgsPerSubject: int64(want.History),
		MaxBytes:          -1,
		MaxAge:            want.TTL,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           want.Storage,
		Replicas:          want.Replicas,
		AllowRollup:       true,
		DenyDelete:        true,
		Duplicates:        min(2*time.Minute, want.TTL),
		Discard:           jetstream.DiscardNew,
	}
	if _, err := js.CreateStream(ctx, sc); err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", BucketProcessed, err)
	}
	log.Info().Str("bucket", BucketProcessed).Int("replicas", cfg.Replicas).Msg("bucket created")
	return js.KeyValue(ctx, BucketProcessed)
}

// sameReplicas checks that an existing object has the replicas jobq is
// configured with. jobq does not change them: on the bucket that would
// switch every running pool's protocol (see createBucket).
func sameReplicas(object string, have, want int, edit string) error {
	if have == want {
		return nil
	}
	return fmt.Errorf("%w: %s has %s, --replicas is %d; pass --replicas %d, or stop every jobq on this server and run `%s`",
		ErrConflict, object, replicas(have), want, have, edit)
}

func replicas(n int) string {
	if n == 1 {
		return "1 replica"
	}
	return strconv.Itoa(n) + " replicas"
}

// bucketEdit is the nats CLI command that gives the processed bucket n
// replicas.
func bucketEdit(n int) string {
	if n == 1 {
		return "nats stream edit " + bucketStream + " --replicas 1 --allow-direct"
	}
	return "nats stream edit " + bucketStream + " --replicas " + strconv.Itoa(n) + " --no-allow-direct"
}

// lookUpTry bounds one try of a look-up that retryUnanswered tries again.
const lookUpTry = 5 * time.Second

// retryUnanswered runs look-up f, a JetStream API read, again while it gets
// no answer, until ctx ends: on a cluster, a request can go unanswered
// while a stream or the cluster elects a leader, and a single wait for the
// whole of ctx failed where the next try, seconds later, is answered. Each
// try waits at most lookUpTry. Under a ctx without a deadline, f runs once,
// with nats.go's own timeout.
func retryUnanswered[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	if _, ok := ctx.Deadline(); !ok {
		return f(ctx)
	}
	for {
		tctx, cancel := context.WithTimeout(ctx, lookUpTry)
		v, err := f(tctx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) { // only its own wait ran out
			return v, err
		}
	}
}
