package main

import (
	"encoding/json"
	"slices"
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
		{name: "file that is not there", args: []string{"enqueue", "job.x", "--file", "/no/such/file"}, code: 2, want: []string{"--file", "/no/such/file"}},
		// Over NATS's limit on a protocol line, the server would close the
		// connection.
		{name: "subject over 1024 bytes", args: []string{"enqueue", "job." + strings.Repeat("a", 5000), "x"}, code: 2, want: []string{"longer than 1024 bytes"}},
		// An unset shell variable: a fresh ID would store the job again on
		// each retry.
		{name: "empty id", args: []string{"enqueue", "job.x", "x", "--id", ""}, code: 2, want: []string{"--id is empty"}},
		{name: "header name with a space", args: []string{"enqueue", "job.x", "x", "-H", "X A=v"}, code: 2, want: []string{`"X A"`, "header name"}},
		{name: "header name with a colon", args: []string{"enqueue", "job.x", "x", "-H", "X:Y=v"}, code: 2, want: []string{"header name"}},
		{name: "header name with a parenthesis", args: []string{"enqueue", "job.x", "x", "-H", "X(1)=v"}, code: 2, want: []string{"header name"}},
		{name: "header name not ASCII", args: []string{"enqueue", "job.x", "x", "-H", "X-é=v"}, code: 2, want: []string{"header name"}},
		{name: "header value with a line break", args: []string{"enqueue", "job.x", "x", "-H", "X-B=a\nb"}, code: 2, want: []string{"X-B", "line break"}},
		{name: "max payload over what the store keeps", args: []string{"enqueue", "job.x", "x", "--max-payload", "33554432"}, code: 2, want: []string{"--max-payload", "32 MiB"}},
		{name: "max payload that would overflow", args: []string{"enqueue", "job.x", "x", "--max-payload", "9000000000000000000"}, code: 2, want: []string{"--max-payload"}},
		{name: "import window out of range", stdin: `{"subject":"job.w"}` + "\n", args: []string{"import", "--window", "2000000000", "-"}, code: 2, want: []string{"--window 2000000000"}},
		{name: "import max payload over what the store keeps", stdin: `{"subject":"job.w"}` + "\n", args: []string{"import", "--max-payload", "9000000000000000000", "-"}, code: 2, want: []string{"--max-payload"}},
		{name: "config file that is not there", args: []string{"status", "--config", "/no/such/jobq.yaml"}, code: 2, want: []string{"--config", "/no/such/jobq.yaml"}},
		{name: "job that is not there", args: []string{"job", "no-such-job"}, code: 1, want: []string{"no ledger record", "no-such-job"}},
		{name: "dead letter that is not there", args: []string{"dlq", "show", "no-such-job"}, code: 1, want: []string{"no such dead letter"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantOneLineError(t, srv.jobqIn(t, tt.stdin, tt.args...), tt.code, tt.want...)
		})
	}
	t.Run("empty server", func(t *testing.T) {
		wantOneLineError(t, runCmd(t, cmdInput{env: []string{"JOBQ_SERVER="}}, jobqBin, "status"), 2, "--server is empty", "JOBQ_SERVER")
	})
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

// jobq import refuses a line whose text JSON decoding would change, as
// malformed: bytes that are not UTF-8 (two IDs in Latin-1 became one job,
// the second dropped as its duplicate) and escaped halves of surrogate
// pairs, which become U+FFFD. A subject too long for a NATS protocol line
// is malformed too, rather than close the connection and fail every line.
// The other lines are stored.
func TestCLIImportRefusesTextItWouldChange(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	lines := []string{
		`{"subject":"job.u","id":"good"}`,
		"{\"subject\":\"job.u\",\"id\":\"caf\xe9\"}",
		"{\"subject\":\"job.u\",\"id\":\"caf\xe8\"}",
		"{\"subject\":\"job.\xff\",\"id\":\"u1\"}",
		`{"subject":"job.u","id":"sur","payload":"\ud800"}`,
		`{"subject":"job.u","id":"hdr","headers":{"X-A":"\udc00"}}`,
		`{"subject":"job.` + strings.Repeat("a", 5000) + `","id":"long"}`,
		`{"subject":"job.u","id":"after"}`,
		`{"subject":"job.u","id":"fffd","payload":"\ufffd and \ud83d\ude00"}`,
		`{"subject":"job.u","id":"x\ufffd\ud800"}`,
	}
	r := s.jobqIn(t, strings.Join(lines, "\n")+"\n", "import", "--json", "-")
	var out struct {
		Stored, Duplicates, Malformed, Failed int
		Errors                                []struct {
			Line   int
			Reason string
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("import: %v\n%s", err, r)
	}
	var bad []int
	for _, e := range out.Errors {
		bad = append(bad, e.Line)
	}
	if r.code != 1 || out.Stored != 3 || out.Duplicates != 0 || out.Failed != 0 || !slices.Equal(bad, []int{2, 3, 4, 5, 6, 7, 10}) {
		t.Fatalf("import: exit %d, %+v; want lines 1, 8 and 9 stored, 2 to 7 and 10 malformed, exit 1", r.code, out)
	}
	for _, e := range out.Errors[:5] {
		if !strings.Contains(e.Reason, "UTF-8") && !strings.Contains(e.Reason, "surrogate") {
			t.Errorf("line %d: reason %q; want it to say what is wrong with the text", e.Line, e.Reason)
		}
	}
}

// A job over the server's own limit, lower than the client's --max-payload
// (a server started with a smaller one), is refused before sending, saying
// what the server takes, rather than with NATS's bare "maximum payload
// exceeded"; import reports such a line, saying so, and stores the others.
func TestPayloadOverTheServersLimit(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{args: []string{"--max-payload", "1000"}}) // the server takes 1000 + 64 KiB
	big := strings.Repeat("x", 200000)
	wantOneLineError(t, s.jobqIn(t, big, "enqueue", "job.big"), 2, "JOB takes at most")
	// A small payload with large headers is the same case.
	wantOneLineError(t, s.jobqIn(t, strings.Repeat("p", 30000), "enqueue", "-H", "X-Big="+strings.Repeat("v", 40000), "job.x"), 2, "JOB takes at most")
	r := s.jobqIn(t, `{"subject":"job.big","payload":"`+big+`"}`+"\n"+`{"subject":"job.small"}`+"\n", "import", "--json", "-")
	// Malformed, as any line that would be refused however often sent.
	var out struct{ Stored, Malformed, Failed int }
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Stored != 1 || out.Malformed != 1 || out.Failed != 0 || !strings.Contains(r.stdout, "JOB takes at most") {
		t.Errorf("import of a line over the server's limit: exit %d, %+v (%v), stdout %.300q; want it reported, saying why, and the other stored", r.code, out, err, r.stdout)
	}
}
