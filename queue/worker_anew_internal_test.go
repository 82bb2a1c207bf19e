package queue

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// WORKER deleted, then made again by another client before the pool makes
// it anew: what the pool logs is what it found and did.
func TestMakeWorkerAnewSaysWhatItFound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name   string
		remake func(jetstream.JetStream) error
		want   string
	}{
		{"deleted", func(jetstream.JetStream) error { return nil }, "was deleted: created it again"},
		{"made again as jobq makes it", func(js jetstream.JetStream) error {
			_, _, err := ensureConsumer(ctx, js, Config{}.withDefaults(), zerolog.Nop())
			return err
		}, "another pool created it again"},
		{"made again with other settings", func(js jetstream.JetStream) error {
			_, err := js.CreateConsumer(ctx, StreamJob, jetstream.ConsumerConfig{Durable: ConsumerWorker, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 9})
			return err
		}, "another client made it again: its settings were put back to jobq's"},
		{"made again as a push consumer", func(js jetstream.JetStream) error {
			_, err := js.CreateOrUpdatePushConsumer(ctx, StreamJob, jetstream.ConsumerConfig{Durable: ConsumerWorker, DeliverSubject: "deliver.here", AckPolicy: jetstream.AckExplicitPolicy})
			return err
		}, "as jobq cannot use it: no job is fetched until it is put right"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			obj := objectsWith(t, Config{})
			if err := obj.JS.DeleteConsumer(ctx, StreamJob, ConsumerWorker); err != nil {
				t.Fatal(err)
			}
			if err := tt.remake(obj.JS); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			NewPool(obj, nil, zerolog.New(&buf)).makeWorkerAnew(ctx)
			if got := buf.String(); strings.Count(got, ConsumerWorker+" was deleted") != 1 || !strings.Contains(got, tt.want) {
				t.Errorf("log: %s; want one line of WORKER's deletion saying %q", got, tt.want)
			}
		})
	}
}

// WORKER made again by another client, as a push consumer, between the
// pool's look-up and its create: the pool looks again, and says what it
// found, rather than take it for another pool's.
func TestMakeWorkerAnewLooksAgainWhenBeatenToIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{})
	if err := obj.JS.DeleteConsumer(ctx, StreamJob, ConsumerWorker); err != nil {
		t.Fatal(err)
	}
	real := obj.JS
	obj.JS = beatenToCreate{JetStream: real, first: func() error {
		_, err := real.CreateOrUpdatePushConsumer(ctx, StreamJob, jetstream.ConsumerConfig{Durable: ConsumerWorker, DeliverSubject: "deliver.here", AckPolicy: jetstream.AckExplicitPolicy})
		return err
	}}
	var buf bytes.Buffer
	NewPool(obj, nil, zerolog.New(&buf)).makeWorkerAnew(ctx)
	if got := buf.String(); !strings.Contains(got, "as jobq cannot use it") {
		t.Errorf("log: %s; want it to say WORKER was made again as jobq cannot use it", got)
	}
}

// beatenToCreate is a JetStream on which another client creates a consumer
// (first) just before each consumer this one creates.
type beatenToCreate struct {
	jetstream.JetStream
	first func() error
}

func (b beatenToCreate) CreateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if err := b.first(); err != nil {
		return nil, err
	}
	return b.JetStream.CreateConsumer(ctx, stream, cfg)
}

// Stop cut off the making of WORKER anew: that is no failure to be fixed
// by a restart (the next start makes it), which the log said.
func TestMakeWorkerAnewCutOffByStopSaysSo(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{})
	if err := obj.JS.DeleteConsumer(context.Background(), StreamJob, ConsumerWorker); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var buf bytes.Buffer
	NewPool(obj, nil, zerolog.New(&buf)).makeWorkerAnew(ctx)
	if got := buf.String(); strings.Contains(got, "restart jobq") || strings.Contains(got, `"level":"error"`) || !strings.Contains(got, "at its next start") {
		t.Errorf("log: %s; want a warning that the next start makes WORKER, and no error asking for a restart", got)
	}
}
