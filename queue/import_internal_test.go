package queue

import (
	"bufio"
	"strings"
	"testing"

	"github.com/jobq/jobq/handlers"
)

// FuzzParseImportLine checks that any line either parses into a job that
// Enqueue would accept or is refused with an error, never a panic.
func FuzzParseImportLine(f *testing.F) {
	for _, seed := range []string{
		`{"subject":"job.a","id":"a-1","payload":"x"}`,
		`{"subject":"job.a","payload":{"n":[1,2]}}`,
		`{"subject":"job.a","payload_base64":"AAE="}`,
		`{"subject":"job.a","headers":{"X-A":"1","X-B":["2","3"]}}`,
		`{"subject":"job.a","payload":null}`,
		`{"subject":"job.*"}`,
		`{"subject":5}`,
		`{"payload":"x"}`,
		`["job.a"]`,
		`{"subject":"job.a",`,
		`{"subject":"job.a","headers":{"Nats-Msg-Id":"x"}}`,
		`{"subject":"job.a","id":"a\u0001b"}`,
	} {
		f.Add(seed)
	}
	p := &Producer{maxPayload: 64}
	f.Fuzz(func(t *testing.T, line string) {
		job, err := p.parseImportLine([]byte(line))
		if err != nil {
			return
		}
		if err := handlers.ValidSubject(job.subject); err != nil {
			t.Errorf("accepted subject %q: %v", job.subject, err)
		}
		if len(job.payload) > p.maxPayload {
			t.Errorf("accepted a %d-byte payload over the limit %d", len(job.payload), p.maxPayload)
		}
		if _, err := p.message(job.subject, job.payload, job.opts); err != nil {
			t.Errorf("accepted a job Enqueue refuses: %v", err)
		}
	})
}

func TestReadLineTooLong(t *testing.T) {
	t.Parallel()
	in := "short\n" + strings.Repeat("x", 100) + "\nlast"
	br := bufio.NewReaderSize(strings.NewReader(in), 16)
	type got struct {
		line    string
		tooLong bool
	}
	var lines []got
	for {
		line, tooLong, err := readLine(br, nil, 50)
		if err != nil {
			break
		}
		lines = append(lines, got{string(line), tooLong})
	}
	want := []got{{"short", false}, {"", true}, {"last", false}}
	if len(lines) != len(want) {
		t.Fatalf("got %+v, want %+v", lines, want)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d: got %+v, want %+v", i+1, lines[i], want[i])
		}
	}
}
