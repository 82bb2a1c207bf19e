package queue_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/queue"
)

// An operator let JOB take per-message TTLs (nats stream edit JOB
// --allow-msg-ttl), which the server does not let anyone take back. A job
// that another client then publishes with a Nats-TTL header expires unrun,
// a job lost without a dead letter. jobq cannot put it back, so it says so
// at every start.
func TestJobStreamThatAllowsMessageTTLsIsWarnedOf(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	b.editJobs(t, func(c *jetstream.StreamConfig) { c.AllowMsgTTL = true })
	off := func(c *jetstream.StreamConfig) { c.AllowMsgTTL = false }
	info, _ := b.obj.Jobs.Info(context.Background())
	cfg := info.Config
	off(&cfg)
	if _, err := b.js.UpdateStream(context.Background(), cfg); err == nil {
		t.Fatalf("the server let JOB's per-message TTLs be turned off: provisioning should do it rather than warn")
	}
	var logs bytes.Buffer
	if _, err := queue.Provision(context.Background(), b.js, b.cfg, zerolog.New(&logs)); err != nil {
		t.Fatalf("provision again: %v", err)
	}
	for _, want := range []string{`"level":"warn"`, `"stream":"JOB"`, "Nats-TTL", "expires unrun"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("provision of a JOB that allows message TTLs: log lacks %q:\n%s", want, logs.String())
		}
	}
}
