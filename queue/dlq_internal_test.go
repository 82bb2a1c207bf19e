package queue

import (
	"maps"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A dead letter's own headers, Jobq- and Nats-, in any case, are not among
// the job headers it shows and re-drives: a foreign publisher's jobq-job-id
// would otherwise ride along beside the re-drive's Jobq-Job-Id.
func TestDeadLetterFromLeavesOutJobqAndNatsHeadersInAnyCase(t *testing.T) {
	d := deadLetterFrom(&jetstream.RawStreamMsg{
		Subject: SubjectDLQPrefix + "job.x",
		Header: nats.Header{
			HeaderJobID: {"J"}, "jobq-job-id": {"other"}, "NATS-TTL": {"1s"},
			"Nats-Msg-Id": {"m"}, "X-Keep": {"y"},
		},
	})
	if want := map[string][]string{"X-Keep": {"y"}}; !maps.EqualFunc(d.Header, want, slices.Equal) {
		t.Errorf("headers: got %v, want %v", d.Header, want)
	}
	if d.ID != "J" || d.Subject != "job.x" {
		t.Errorf("got ID %q, subject %q; want J, job.x", d.ID, d.Subject)
	}
}
