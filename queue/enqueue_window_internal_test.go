package queue

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// lateFirstAck stores every publish, and holds the first one's ack until
// its ctx ends: a store that answered too late (a slow disk, a busy
// cluster).
type lateFirstAck struct {
	jetstream.JetStream
	n atomic.Int32
}

func (j *lateFirstAck) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := j.JetStream.PublishMsg(context.Background(), m, opts...)
	if j.n.Add(1) == 1 && err == nil {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return ack, err
}

// Enqueue re-sends a publish whose ack did not come in time under the same
// ID, so that JOB stores it once: only while JOB's dedupe window still
// holds the first send. With an attempt timeout longer than the window
// (jobq serve --dedupe-window 1s, enqueue --timeout 5s), the re-send was
// made after the window had forgotten the first send, and JOB stored the
// job twice.
func TestEnqueueDoesNotResendPastTheDedupeWindow(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{DedupeWindow: time.Second})
	js := &lateFirstAck{JetStream: obj.JS}
	p := NewProducer(js, obj.Config).JOBLimit(obj).AttemptTimeout(1500 * time.Millisecond)
	_, err := p.Enqueue(context.Background(), "job.late", []byte("x"), EnqueueOptions{ID: "late-1"})
	info, ierr := obj.Jobs.Info(context.Background())
	if ierr != nil {
		t.Fatal(ierr)
	}
	if info.State.Msgs != 1 {
		t.Errorf("JOB holds %d copies of late-1, want 1 (enqueue: %v)", info.State.Msgs, err)
	}
}
