package queue

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// lateAcks stores every publish and holds its ack until its ctx ends.
type lateAcks struct{ jetstream.JetStream }

func (j *lateAcks) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if _, err := j.JetStream.PublishMsg(context.Background(), m, opts...); err != nil {
		return nil, err
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// A line whose re-sends outlast JOB's dedupe window fails saying the job
// may be stored and must be checked before it is sent again, as it could
// then be stored twice. Its error wraps the last attempt's timeout, so
// Import took it for a JOB that does not answer and stopped, telling to
// run the same input again, "lines with an id are stored once": that
// sends the line again, past the window, and JOB stores it twice.
func TestImportStopAfterThePastWindowResendDoesNotSayRunItAgain(t *testing.T) {
	t.Parallel()
	obj := objectsWith(t, Config{DedupeWindow: time.Second})
	p := NewProducer(&lateAcks{JetStream: obj.JS}, obj.Config).JOBLimit(obj).AttemptTimeout(1500 * time.Millisecond)
	in := `{"subject":"job.w","id":"w-1"}` + "\n" + `{"subject":"job.w","id":"w-2"}` + "\n" + `{"subject":"job.w","id":"w-3"}` + "\n"
	sum, err := Import(context.Background(), p, strings.NewReader(in), ImportOptions{AckTimeout: time.Nanosecond, Window: 1})
	t.Logf("summary %+v", sum)
	if err != nil && strings.Contains(err.Error(), "stored twice") && strings.Contains(err.Error(), "run the same input again") {
		t.Errorf("import's error says both that a line may be stored, to be checked before it is sent again, and to run the same input again:\n%v", err)
	}
}
