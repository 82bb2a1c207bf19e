package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobq/jobq/queue"
)

// TestImportCommand runs `jobq import` through run() against an embedded
// server on a loopback port, as the client would reach `jobq serve`.
func TestImportCommand(t *testing.T) {
	t.Parallel()
	srv, obj := provisioned(t, true, queue.Config{})
	dir := t.TempDir()
	file := func(name string, lines ...string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	withBad := file("with-bad.ndjson",
		`{"subject":"job.cli.a","id":"cli-1","payload":"one"}`,
		`{"subject":"job.cli.a","id":"cli-2","payload":{"n":2}}`,
		`{"subject":"cli.a","id":"cli-x"}`,
		``,
		`{"subject":"job.cli.a","id":"cli-1","payload":"one"}`,
		`{"subject":"job.cli.b","id":"cli-3","headers":{"X-Tenant":"acme"}}`,
	)
	good := strings.Join([]string{
		`{"subject":"job.cli.c","id":"cli-4"}`,
		`{"subject":"job.cli.c","id":"cli-5","payload_base64":"aGk="}`,
	}, "\n")

	tests := []struct {
		name                   string
		args                   []string
		stdin                  string
		wantCode               int
		wantStdout, wantStderr []string
		wantJSON               *queue.ImportSummary
	}{
		{
			name:       "file with a bad line",
			args:       []string{withBad},
			wantCode:   exitFailure,
			wantStdout: []string{"lines:       5\n", "stored:      3\n", "duplicates:  1\n", "malformed:   1\n", "failed:      0\n", `line 3: invalid subject "cli.a": not under "job."`},
			wantStderr: []string{"jobq: 1 of 5 lines not stored (1 malformed, 0 failed): see the summary above\n"},
		},
		{
			name:     "stdin as json",
			args:     []string{"--json", "-"},
			stdin:    good,
			wantCode: exitOK,
			wantJSON: &queue.ImportSummary{Lines: 2, Stored: 2, Errors: []queue.LineError{}},
		},
		{
			name:     "again: duplicates",
			args:     []string{"-", "--json", "--window", "1"},
			stdin:    good,
			wantCode: exitOK,
			wantJSON: &queue.ImportSummary{Lines: 2, Duplicates: 2, Errors: []queue.LineError{}},
		},
		{
			name:       "strict",
			args:       []string{"--strict", withBad},
			wantCode:   exitUsage,
			wantStdout: []string{"lines:       3\n", "duplicates:  2\n", "malformed:   1\n"},
			wantStderr: []string{"jobq: malformed line: line 3: invalid subject", "nothing after it was published (--strict)"},
		},
		{name: "no file", args: nil, wantCode: exitUsage, wantStderr: []string{"import takes one FILE"}},
		{name: "missing file", args: []string{filepath.Join(dir, "nope.ndjson")}, wantCode: exitUsage, wantStderr: []string{"import ", "nope.ndjson: no such file"}},
		{name: "bad window", args: []string{"--window", "0", withBad}, wantCode: exitUsage, wantStderr: []string{"--window"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"jobq", "import", "--server", srv.ClientURL()}, tt.args...)
			code := run(args, strings.NewReader(tt.stdin), &stdout, &stderr)
			if code != tt.wantCode {
				t.Fatalf("got exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.wantCode, stdout.String(), stderr.String())
			}
			for _, want := range tt.wantStdout {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("stdout has no %q:\n%s", want, stdout.String())
				}
			}
			for _, want := range tt.wantStderr {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr has no %q:\n%s", want, stderr.String())
				}
			}
			if tt.wantCode == exitOK && stderr.Len() > 0 {
				t.Errorf("got stderr %q, want none", stderr.String())
			}
			if tt.wantJSON != nil {
				var got queue.ImportSummary
				if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
					t.Fatalf("stdout is not a JSON summary: %v\n%s", err, stdout.String())
				}
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(*tt.wantJSON)
				if !bytes.Equal(g, w) {
					t.Errorf("got summary %s, want %s", g, w)
				}
			}
		})
	}

	// JOB holds each job once, as the file said.
	want := map[string]string{"cli-1": "one", "cli-2": `{"n":2}`, "cli-3": "", "cli-4": "", "cli-5": "hi"}
	info, err := obj.Jobs.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(len(want)) {
		t.Errorf("JOB holds %d jobs, want %d", info.State.Msgs, len(want))
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := obj.Jobs.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatalf("read seq %d: %v", seq, err)
		}
		id := m.Header.Get("Nats-Msg-Id")
		if payload, ok := want[id]; !ok || string(m.Data) != payload {
			t.Errorf("job %s: got payload %q, want %q (known: %t)", id, m.Data, payload, ok)
		}
		if id == "cli-3" && m.Header.Get("X-Tenant") != "acme" {
			t.Errorf("job cli-3: got headers %v, want X-Tenant: acme", m.Header)
		}
	}
}

// jobq import - ends on SIGTERM while it waits for input that does not
// come (a pipe left open), having stored the lines it read: the signal is
// not left until the next line or the end of the input.
func TestCLIImportStopsOnSignalWhileReadingStdin(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	cmd := exec.Command(jobqBin, "import", "--server", s.url, "--json", "-")
	cmd.Env = subprocessEnv()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close()
	cmd.Stdin = pr
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	if _, err := pw.WriteString(`{"subject":"job.sig","id":"sig1"}` + "\n"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, waitTimeout, 50*time.Millisecond, func() error {
		if n := s.status(t).Stream.Messages; n != 1 {
			return fmt.Errorf("JOB holds %d jobs, want the line read", n)
		}
		return nil
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("jobq import - still running 10s after SIGTERM\nstdout:\n%s\nstderr:\n%s", &stdout, &stderr)
	}
	var sum queue.ImportSummary
	if err := json.Unmarshal(stdout.Bytes(), &sum); err != nil || sum.Stored != 1 || cmd.ProcessState.ExitCode() != 1 || !strings.Contains(stderr.String(), "import stopped at line 2") {
		t.Errorf("import stopped by SIGTERM: exit %d, summary %+v (%v), stderr %q; want exit 1, 1 stored, and where it stopped", cmd.ProcessState.ExitCode(), sum, err, stderr.String())
	}
}
