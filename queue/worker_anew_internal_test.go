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
