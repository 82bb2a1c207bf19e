package queue_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server"
	"github.com/jobq/jobq/server/servertest"
)

func provisionJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(servertest.Connect(t, servertest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func TestProvisionFresh(t *testing.T) {
	t.Parallel()
	js := provisionJS(t)
	ctx := context.Background()
	if _, err := queue.Provision(ctx, js, queue.Config{}, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, queue.StreamJob)
	sc := s.CachedInfo().Config
	if sc.Retention != jetstream.WorkQueuePolicy || sc.Storage != jetstream.FileStorage || sc.Duplicates != 10*time.Minute ||
		len(sc.Subjects) != 1 || sc.Subjects[0] != "job.>" || sc.Discard != jetstream.DiscardNew {
		t.Errorf("JOB: got %+v, want workqueue/file/10m/job.>/discard new", sc)
	}
	c, _ := js.Consumer(ctx, queue.StreamJob, queue.ConsumerWorker)
	cc := c.CachedInfo().Config
	if cc.Durable != "WORKER" || cc.AckPolicy != jetstream.AckExplicitPolicy || cc.MaxDeliver != 3 || cc.AckWait != time.Minute || cc.DeliverSubject != "" {
		t.Errorf("WORKER: got %+v, want durable pull, explicit ack, 3, 60s", cc)
	}
	kv, _ := js.KeyValue(ctx, queue.BucketProcessed)
	st, _ := kv.Status(ctx)
	if st.TTL() != 168*time.Hour || st.BackingStore() != "JetStream" {
		t.Errorf("processed: got ttl %s, want 168h", st.TTL())
	}
	if _, err := js.Stream(ctx, queue.StreamDLQ); err != nil {
		t.Errorf("DLQ: %v", err)
	}
}

func TestProvisionIsIdempotent(t *testing.T) {
	t.Parallel()
	js := provisionJS(t)
	ctx := context.Background()
	if _, err := queue.Provision(ctx, js, queue.Config{}, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	if _, err := queue.Provision(ctx, js, queue.Config{}, zerolog.New(&logs)); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Errorf("second provision logged changes: %s", logs.String())
	}
}

func TestProvisionEditsInPlace(t *testing.T) {
	t.Parallel()
	js := provisionJS(t)
	ctx := context.Background()
	obj, err := queue.Provision(ctx, js, queue.Config{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	prod := queue.NewProducer(js, queue.Config{})
	if _, err := prod.Enqueue(ctx, "job.keep", []byte("x"), queue.EnqueueOptions{ID: "keep"}); err != nil {
		t.Fatal(err)
	}
	obj.Ledger.Put(ctx, "keep", []byte(`{"id":"keep","state":"done"}`))
	var logs bytes.Buffer
	cfg := queue.Config{DedupeWindow: 5 * time.Minute, MaxDeliver: 5, AckWait: 30 * time.Second, ProcessedTTL: 48 * time.Hour}
	if _, err := queue.Provision(ctx, js, cfg, zerolog.New(&logs)); err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, queue.StreamJob)
	c, _ := js.Consumer(ctx, queue.StreamJob, queue.ConsumerWorker)
	kv, _ := js.KeyValue(ctx, queue.BucketProcessed)
	st, _ := kv.Status(ctx)
	if got := s.CachedInfo().Config.Duplicates; got != 5*time.Minute {
		t.Errorf("dedupe window: got %s, want 5m", got)
	}
	if cc := c.CachedInfo().Config; cc.MaxDeliver != 5 || cc.AckWait != 30*time.Second {
		t.Errorf("consumer: got max deliver %d ack wait %s, want 5 and 30s", cc.MaxDeliver, cc.AckWait)
	}
	if st.TTL() != 48*time.Hour {
		t.Errorf("ttl: got %s, want 48h", st.TTL())
	}
	for _, want := range []string{"stream updated in place", "consumer updated in place", "bucket updated in place"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q: %s", want, logs.String())
		}
	}
	// Nothing stored was lost on the way.
	if info, _ := s.Info(ctx); info.State.Msgs != 1 {
		t.Errorf("JOB holds %d jobs, want 1", info.State.Msgs)
	}
	if _, err := kv.Get(ctx, "keep"); err != nil {
		t.Errorf("ledger record: %v", err)
	}
}

func TestProvisionConflicts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		prepare func(context.Context, jetstream.JetStream) error
		want    string
		// changed is what the message says was changed before the
		// conflict was met.
		changed string
	}{
		{
			name: "stream with limits retention",
			prepare: func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "JOB", Subjects: []string{"job.>"}, Storage: jetstream.FileStorage})
				return err
			},
			want:    "retention",
			changed: "(nothing was changed)",
		},
		{
			name: "stream in memory",
			prepare: func(ctx context.Context, js jetstream.JetStream) error {
				_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "JOB", Subjects: []string{"job.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage})
				return err
			},
			want:    "storage",
			changed: "(nothing was changed)",
		},
		{
			name: "push consumer",
			prepare: func(ctx context.Context, js jetstream.JetStream) error {
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "JOB", Subjects: []string{"job.>"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage}); err != nil {
					return err
				}
				_, err := js.CreateOrUpdatePushConsumer(ctx, "JOB", jetstream.ConsumerConfig{Durable: "WORKER", DeliverSubject: "deliver.here", AckPolicy: jetstream.AckExplicitPolicy})
				return err
			},
			want: "push consumer",
			// JOB made by another client, without jobq's dedupe window
			// and limit on a message, is put right in place.
			changed: "(stream JOB was updated in place and stream DLQ was created before it; nothing else was changed)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			js := provisionJS(t)
			ctx := context.Background()
			if err := tt.prepare(ctx, js); err != nil {
				t.Fatal(err)
			}
			js.Publish(ctx, "job.precious", []byte("x"))
			_, err := queue.Provision(ctx, js, queue.Config{}, zerolog.Nop())
			if !errors.Is(err, queue.ErrConflict) || !strings.Contains(err.Error(), tt.want) || !strings.HasSuffix(err.Error(), tt.changed) {
				t.Fatalf("got %v, want ErrConflict about %s, ending %s", err, tt.want, tt.changed)
			}
			s, err := js.Stream(ctx, "JOB")
			if err != nil {
				t.Fatalf("JOB is gone: %v", err)
			}
			if info, _ := s.Info(ctx); info.State.Msgs != 1 {
				t.Errorf("JOB holds %d jobs, want the 1 it had", info.State.Msgs)
			}
		})
	}
}

func TestProvisionNeverShrinksCapBelowStoredJobs(t *testing.T) {
	t.Parallel()
	js := provisionJS(t)
	ctx := context.Background()
	if _, err := queue.Provision(ctx, js, queue.Config{}, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	prod := queue.NewProducer(js, queue.Config{})
	for range 10 {
		if _, err := prod.Enqueue(ctx, "job.big", bytes.Repeat([]byte("x"), 10<<10), queue.EnqueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	if _, err := queue.Provision(ctx, js, queue.Config{MaxBytes: 20 << 10}, zerolog.New(&logs)); err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, queue.StreamJob)
	if info, _ := s.Info(ctx); info.State.Msgs != 10 {
		t.Errorf("JOB holds %d jobs after a smaller cap, want all 10", info.State.Msgs)
	}
	if !strings.Contains(logs.String(), "cap left as it was") {
		t.Errorf("no warning logged: %s", logs.String())
	}
}

func TestBindOpensTheSameObjectsOnAnotherConnection(t *testing.T) {
	t.Parallel()
	srv := servertest.Start(t)
	b := setupOn(t, srv, queue.Config{Workers: 2})
	js2, err := jetstream.New(servertest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	bound, err := b.obj.Bind(context.Background(), js2)
	if err != nil {
		t.Fatalf("bind: %v", err)
	}
	if bound.JS != js2 || bound.Config.AckWait != b.obj.Config.AckWait {
		t.Errorf("bound objects: got %+v, want the second connection and the same config", bound)
	}
	c := newCounter()
	p := queue.NewPool(bound, c.wrap(ok), servertest.Logger(t))
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Stop(ctx)
	})
	b.enqueue(t, "job.bind", "bind-1", "x")
	b.waitState(t, "bind-1", data.StateDone)
	if got := c.get("bind-1"); got != 1 {
		t.Errorf("job ran %d times, want 1", got)
	}

	// A server without the objects: a clear error naming what is missing.
	js3, err := jetstream.New(servertest.Connect(t, servertest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.obj.Bind(context.Background(), js3); err == nil || !strings.Contains(err.Error(), "JOB") {
		t.Errorf("bind without objects: got %v, want an error naming JOB", err)
	}
}

// Open, for client commands, takes the settings a running jobq provisioned:
// the consumer's and the bucket's, not the defaults.
func TestOpenReadsTheProvisionedSettings(t *testing.T) {
	t.Parallel()
	js := provisionJS(t)
	ctx := context.Background()
	want := queue.Config{MaxDeliver: 5, AckWait: 20 * time.Second, ProcessedTTL: time.Hour}
	if _, err := queue.Provision(ctx, js, want, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	obj, err := queue.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if got := obj.Config; got.MaxDeliver != want.MaxDeliver || got.AckWait != want.AckWait || got.ProcessedTTL != want.ProcessedTTL {
		t.Errorf("open: got max deliver %d, ack wait %s, ttl %s; want %d, %s, %s",
			got.MaxDeliver, got.AckWait, got.ProcessedTTL, want.MaxDeliver, want.AckWait, want.ProcessedTTL)
	}
}

// A server whose storage limit was lowered below the caps its streams hold
// (a NATS server given a smaller max_file_store, as jobq serve --server
// uses) refuses every stream edit, even one that lowers a cap. Provision
// says so in one line, and what to do; it gave the server's bare "insufficient
// storage resources available".
func TestProvisionSaysWhenTheCapsExceedTheServersLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	big := server.Config{StoreDir: dir, MaxStore: 1 << 30, Logger: servertest.Logger(t)}
	srv, err := server.Start(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(servertest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	cfg := queue.Config{}
	cfg.MaxBytes, cfg.DeadMaxBytes = queue.StoreShares(1 << 30)
	if _, err := queue.Provision(ctx, js, cfg, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	small := big
	small.MaxStore = 256 << 20
	js, err = jetstream.New(servertest.Connect(t, servertest.StartConfig(t, small)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxBytes, cfg.DeadMaxBytes = queue.StoreShares(256 << 20)
	_, err = queue.Provision(ctx, js, cfg, zerolog.Nop())
	if !errors.Is(err, queue.ErrStoreLimit) || !strings.Contains(err.Error(), "--max-store") || !strings.Contains(err.Error(), "nats stream edit JOB --max-bytes") {
		t.Errorf("Provision: %v; want ErrStoreLimit, saying what to do", err)
	}
}
