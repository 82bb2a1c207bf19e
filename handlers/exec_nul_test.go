//go:build unix

package handlers_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// A job's ID (its Nats-Msg-Id) or subject may hold a NUL byte when another
// NATS client published it. An environment variable cannot: the command
// never started, and the retryable error had the job retried to no end.
// Such a value reaches the command percent-encoded, as the http handler's
// headers do.
func TestExecJobWithNULInItsIDOrSubjectRuns(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		job  *data.Job
		want string
	}{
		{&data.Job{ID: "a\x00b", Subject: "job.x"}, "a%00b|job.x"},
		{&data.Job{ID: "seq-2", Subject: "job.y\x00z"}, "seq-2|job.y%00z"},
		{&data.Job{ID: "a b%", Subject: "job.x"}, "a b%|job.x"}, // kept as is without a NUL
	} {
		var out bytes.Buffer
		err := handlers.Exec(`printf '%s|%s' "$JOBQ_JOB_ID" "$JOBQ_SUBJECT"`, handlers.ExecOptions{Stdout: &out}).Process(context.Background(), tt.job)
		if err != nil || out.String() != tt.want {
			t.Errorf("job %q on %q: got %v, %q; want the command run with %q", tt.job.ID, tt.job.Subject, err, out.String(), tt.want)
		}
	}
}

// A job ID longer than one environment variable may be (Linux: 128 KiB),
// as another NATS client may publish one: the command never started
// ("argument list too long"), and the job was retried until dead-lettered.
// It reaches the command as its ledger key, "==" and its SHA-256.
func TestExecJobWithAVeryLongIDRuns(t *testing.T) {
	t.Parallel()
	for _, id := range []string{strings.Repeat("i", 200<<10), strings.Repeat("\x00", 30<<10)} {
		job := &data.Job{ID: id, Subject: "job.x", Payload: []byte("p")}
		var out bytes.Buffer
		err := handlers.Exec(`cat >/dev/null; printf '%s' "$JOBQ_JOB_ID"`, handlers.ExecOptions{Stdout: &out}).Process(context.Background(), job)
		if want := data.Key(id); err != nil || out.String() != want {
			t.Errorf("job ID of %d bytes: got %v, %q; want the command run with %q", len(id), err, out.String(), want)
		}
	}
}
