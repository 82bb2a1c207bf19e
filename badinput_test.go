package main

import (
	"strings"
	"testing"
)

// TestBadInputLosesNothing sends a table of bad input to a running jobq and
// checks each gets one clear line and the right exit status, and that the
// stored jobs are exactly the ones there before.
func TestBadInputLosesNothing(t *testing.T) {
	t.Parallel()
	srv := startServe(t, serveOpts{}) // a broker: the jobs stay stored
	for _, id := range []string{"keep-1", "keep-2", "keep 3/with*odd>chars ✓"} {
		srv.enqueue(t, "job.keep", "payload of "+id, id)
	}
	big := strings.Repeat("x", 2<<20)
	tests := []struct {
		name  string
		stdin string
		args  []string
		code  int
		want  []string
	}{
		{name: "subject outside job", args: []string{"enqueue", "orders.new", "x"}, code: 2, want: []string{`"orders.new"`, "job.email"}},
		{name: "empty subject", args: []string{"enqueue", "", "x"}, code: 2, want: []string{"subject"}},
		{name: "wildcard subject", args: []string{"enqueue", "job.>", "x"}, code: 2, want: []string{`"job.>"`}},
		{name: "empty token", args: []string{"enqueue", "job..x", "x"}, code: 2, want: []string{`"job..x"`}},
		{name: "payload over the 1 MiB limit", stdin: big, args: []string{"enqueue", "job.big"}, code: 2, want: []string{"payload too large", "--max-payload"}},
		{name: "payload over a lower limit, from stdin", stdin: "0123456789", args: []string{"enqueue", "job.big", "--max-payload", "4"}, code: 2, want: []string{"payload too large"}},
		{name: "id with a line break", args: []string{"enqueue", "job.x", "x", "--id", "a\nb"}, code: 2, want: []string{"control character"}},
		{name: "id of a job published without one", args: []string{"enqueue", "job.x", "x", "--id", "seq-7"}, code: 2, want: []string{"seq-7", "published without one; use another"}},
		{name: "a header of jobq's own", args: []string{"enqueue", "job.x", "x", "-H", "Jobq-Job-Id=seq-1"}, code: 2, want: []string{"Jobq-Job-Id", "jobq's own"}},
		{name: "header without value", args: []string{"enqueue", "job.x", "x", "-H", "novalue"}, code: 2, want: []string{"key=value"}},
		{name: "file that is not there", args: []string{"enqueue", "job.x", "--file", "/no/such/file"}, code: 1, want: []string{"/no/such/file"}},
		{name: "job that is not there", args: []string{"job", "no-such-job"}, code: 1, want: []string{"no ledger record", "no-such-job"}},
		{name: "dead letter that is not there", args: []string{"dlq", "show", "no-such-job"}, code: 1, want: []string{"no such dead letter"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantOneLineError(t, srv.jobqIn(t, tt.stdin, tt.args...), tt.code, tt.want...)
		})
	}
	st := srv.status(t)
	if st.Stream.Messages != 3 || st.Stream.LastSeq != 3 || st.DLQ.Messages != 0 {
		t.Errorf("after bad input: JOB holds %d jobs (last seq %d), DLQ %d; want the 3 stored before and nothing else", st.Stream.Messages, st.Stream.LastSeq, st.DLQ.Messages)
	}
	for range 3 {
		j := srv.next(t)
		if !strings.HasPrefix(j.Payload, "payload of ") || !strings.HasSuffix(j.Payload, j.ID) {
			t.Errorf("job %q: got payload %q, want the one stored", j.ID, j.Payload)
		}
	}
}
