package queue

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/server/servertest"
)

// Two jobq started together on one empty server, with different flags:
// the other one creates each object between this one's look-up, which
// found none, and its create, which then failed with "already in use"
// (its settings differ), and this jobq exited. The object is looked up
// again, taken as found, and edited in place to this jobq's settings. Each
// case lets the other jobq in before one kind of create.
func TestProvisionBeatenToEachCreateTakesWhatItFinds(t *testing.T) {
	t.Parallel()
	mine := Config{MaxDeliver: 4, AckWait: 40 * time.Second, DedupeWindow: 3 * time.Minute, ProcessedTTL: 48 * time.Hour, Workers: 2}
	other := Config{MaxDeliver: 7, AckWait: 20 * time.Second, DedupeWindow: 9 * time.Minute, ProcessedTTL: 24 * time.Hour, Workers: 300}
	for _, before := range []string{"CreateStream", "CreateConsumer", "CreateKeyValue"} {
		t.Run(before, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			srv := servertest.Start(t)
			js, err := jetstream.New(servertest.Connect(t, srv))
			if err != nil {
				t.Fatal(err)
			}
			otherJS, err := jetstream.New(servertest.Connect(t, srv))
			if err != nil {
				t.Fatal(err)
			}
			racing := &otherFirst{JetStream: js, before: before, other: func() {
				if _, err := Provision(ctx, otherJS, other, servertest.Logger(t)); err != nil {
					t.Errorf("the other jobq's provisioning: %v", err)
				}
			}}
			obj, err := Provision(ctx, racing, mine, servertest.Logger(t))
			if err != nil {
				t.Fatalf("provision beaten to %s: %v", before, err)
			}
			if !racing.ran {
				t.Fatalf("no %s: the other jobq never came first", before)
			}
			// The object raced for has this jobq's settings; those made
			// before the race, the other's, which edited them after.
			switch before {
			case "CreateStream":
				s, err := obj.JS.Stream(ctx, StreamJob)
				if err != nil {
					t.Fatal(err)
				}
				if got := s.CachedInfo().Config.Duplicates; got != mine.DedupeWindow {
					t.Errorf("JOB has a dedupe window of %s; want this jobq's %s", got, mine.DedupeWindow)
				}
			case "CreateConsumer":
				w, err := obj.JS.Consumer(ctx, StreamJob, ConsumerWorker)
				if err != nil {
					t.Fatal(err)
				}
				if c := w.CachedInfo().Config; c.MaxDeliver != mine.MaxDeliver || c.AckWait != mine.AckWait {
					t.Errorf("WORKER has max deliver %d, ack wait %s; want this jobq's %d, %s", c.MaxDeliver, c.AckWait, mine.MaxDeliver, mine.AckWait)
				}
			case "CreateKeyValue":
				st, err := obj.Ledger.Status(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if got := st.TTL(); got != mine.ProcessedTTL {
					t.Errorf("the bucket's TTL is %s; want this jobq's %s", got, mine.ProcessedTTL)
				}
			}
		})
	}
}

// otherFirst is a JetStream on which another jobq provisions (other) just
// before the first create named before.
type otherFirst struct {
	jetstream.JetStream
	before string
	other  func()
	once   sync.Once
	ran    bool
}

func (o *otherFirst) first(name string) {
	if name == o.before {
		o.once.Do(func() { o.other(); o.ran = true })
	}
}

func (o *otherFirst) CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	o.first("CreateStream")
	return o.JetStream.CreateStream(ctx, cfg)
}

func (o *otherFirst) CreateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	o.first("CreateConsumer")
	return o.JetStream.CreateConsumer(ctx, stream, cfg)
}

func (o *otherFirst) CreateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	o.first("CreateKeyValue")
	return o.JetStream.CreateKeyValue(ctx, cfg)
}
