//go:build unix

package handlers_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// generous bounds waits that normally take milliseconds; it is a deadline
// for a hang, not a timing assertion.
const generous = 30 * time.Second

// writeScript writes an sh script with body into dir and returns a command
// that runs it with dir as $1. The command has sh read the script rather
// than exec it: a parallel test's fork may hold the script's write
// descriptor for a moment, and an exec would then fail with "text file
// busy" (golang/go#22315).
func writeScript(t *testing.T, dir, body string) string {
	t.Helper()
	path := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return "sh " + shellQuote(path) + " " + shellQuote(dir)
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// readFile returns the contents of dir/name.
func readFile(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// eventually polls cond until it holds or generous passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(generous)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not true after %v", what, generous)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processGone reports whether pid no longer runs. A zombie counts as gone: it
// runs no more and waits only for a parent to reap it.
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

func TestExecPayloadAndEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		job  data.Job
	}{
		{
			name: "fresh",
			job:  data.Job{ID: "id-1", Subject: "job.email.welcome", Seq: 42, Attempt: 1, Payload: []byte(`{"to":"a@b"}`)},
		},
		{
			name: "resumed",
			job:  data.Job{ID: "id with spaces", Subject: "job.x", Seq: 18446744073709551615, Attempt: 3, Resumed: true, Payload: []byte("line 1\nline 2\x00\xff\n")},
		},
		{
			name: "empty payload",
			job:  data.Job{ID: "seq-9", Subject: "job.y", Seq: 9, Attempt: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cmd := writeScript(t, dir, `
cat > "$1/payload"
printf '%s\n' "$JOBQ_JOB_ID" "$JOBQ_SUBJECT" "$JOBQ_ATTEMPT" "$JOBQ_SEQ" "$JOBQ_RESUMED" "$EXTRA" > "$1/env"
pwd -P > "$1/pwd"
`)
			h := handlers.Exec(cmd, handlers.ExecOptions{
				Env: []string{"EXTRA=extra value", "JOBQ_JOB_ID=overridden"},
				Dir: dir,
			})
			if err := h.Process(context.Background(), &tt.job); err != nil {
				t.Fatalf("Process = %v, want nil", err)
			}
			if got, want := readFile(t, dir, "payload"), string(tt.job.Payload); got != want {
				t.Errorf("stdin = %q, want %q", got, want)
			}
			resumed := "0"
			if tt.job.Resumed {
				resumed = "1"
			}
			want := strings.Join([]string{
				tt.job.ID, tt.job.Subject, strconv.Itoa(tt.job.Attempt),
				strconv.FormatUint(tt.job.Seq, 10), resumed, "extra value",
			}, "\n") + "\n"
			if got := readFile(t, dir, "env"); got != want {
				t.Errorf("env = %q, want %q", got, want)
			}
			wantDir, err := filepath.EvalSymlinks(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(readFile(t, dir, "pwd")); got != wantDir {
				t.Errorf("working directory = %q, want %q", got, wantDir)
			}
		})
	}
}

func TestExecExitStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		body      string
		raw       bool // body is the command itself, not a script
		wantCode  int  // 0 for a nil error
		permanent bool
		wantMsg   string
	}{
		{name: "done", body: "exit 0"},
		{name: "done reading nothing", body: "true"},
		{name: "permanent", body: "echo 'bad input: no \"to\"' >&2; exit 65", wantCode: handlers.ExitPermanent, permanent: true, wantMsg: `exit status 65: bad input: no "to"`},
		{name: "retry", body: "echo 'smtp down' >&2; exit 75", wantCode: handlers.ExitRetry, wantMsg: "exit status 75: smtp down"},
		{name: "other code", body: "exit 1", wantCode: 1, wantMsg: "exit status 1"},
		{name: "high code", body: "exit 255", wantCode: 255, wantMsg: "exit status 255"},
		{name: "killed by signal", body: "kill -KILL $$", raw: true, wantCode: 128 + int(syscall.SIGKILL), wantMsg: "exit status 137"},
		{name: "script killed by signal", body: "kill -TERM $$", wantCode: 128 + int(syscall.SIGTERM)},
		{name: "command not found", body: "./does-not-exist", wantCode: 127},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cmd := tt.body
			if !tt.raw {
				cmd = writeScript(t, dir, tt.body)
			}
			err := handlers.Exec(cmd, handlers.ExecOptions{Dir: dir}).
				Process(context.Background(), &data.Job{ID: "x", Subject: "job.x", Attempt: 1})
			if tt.wantCode == 0 {
				if err != nil {
					t.Fatalf("Process = %v, want nil", err)
				}
				return
			}
			var xe *handlers.ExitError
			if !errors.As(err, &xe) {
				t.Fatalf("Process = %v (%T), want an *ExitError", err, err)
			}
			if xe.Code != tt.wantCode {
				t.Errorf("Code = %d, want %d", xe.Code, tt.wantCode)
			}
			if got := handlers.IsPermanent(err); got != tt.permanent {
				t.Errorf("IsPermanent(%v) = %v, want %v", err, got, tt.permanent)
			}
			if tt.wantMsg != "" && err.Error() != tt.wantMsg {
				t.Errorf("Error() = %q, want %q", err.Error(), tt.wantMsg)
			}
		})
	}
}

func TestExecPayloadNotRead(t *testing.T) {
	t.Parallel()
	payload := bytes.Repeat([]byte("p"), 1<<20) // more than a pipe buffer holds
	for _, cmd := range []string{"exit 0", "head -c 10 >/dev/null"} {
		err := handlers.Exec(cmd, handlers.ExecOptions{}).Process(context.Background(), &data.Job{Subject: "job.x", Payload: payload})
		if err != nil {
			t.Errorf("Exec(%q).Process = %v, want nil", cmd, err)
		}
	}
}

func TestExecStderrTail(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := writeScript(t, dir, `
i=0
while [ $i -lt 2000 ]; do echo "noise line $i" >&2; i=$((i+1)); done
echo "final words" >&2
exit 3
`)
	err := handlers.Exec(cmd, handlers.ExecOptions{}).Process(context.Background(), &data.Job{Subject: "job.x"})
	var xe *handlers.ExitError
	if !errors.As(err, &xe) {
		t.Fatalf("Process = %v, want an *ExitError", err)
	}
	if len(xe.Stderr) > 4096 || !strings.HasSuffix(xe.Stderr, "noise line 1999\nfinal words\n") {
		t.Errorf("Stderr has %d bytes ending %q, want at most 4096 ending in the last lines",
			len(xe.Stderr), xe.Stderr[max(0, len(xe.Stderr)-40):])
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "exit status 3: ") || !strings.HasSuffix(msg, "; noise line 1999; final words") {
		t.Errorf("Error() = %q, want exit status 3 and the last lines", msg)
	}
	if limit := len("exit status 3: ") + 512; len(msg) > limit {
		t.Errorf("Error() has %d bytes, want at most %d", len(msg), limit)
	}
}

// syncBuffer is a bytes.Buffer that the race detector lets two writers share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// errWriter fails every write.
type errWriter struct{}

func (errWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestExecOutput(t *testing.T) {
	t.Parallel()
	const body = `
i=0
while [ $i -lt 200 ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done
`
	t.Run("one writer for both", func(t *testing.T) {
		t.Parallel()
		var buf bytes.Buffer // not safe for concurrent use: Exec must serialize
		h := handlers.Exec(writeScript(t, t.TempDir(), body), handlers.ExecOptions{Stdout: &buf, Stderr: &buf})
		if err := h.Process(context.Background(), &data.Job{Subject: "job.x"}); err != nil {
			t.Fatalf("Process = %v, want nil", err)
		}
		for _, want := range []string{"out 0\n", "err 0\n", "out 199\n", "err 199\n"} {
			if !strings.Contains(buf.String(), want) {
				t.Errorf("output lacks %q, want both streams", want)
			}
		}
	})
	t.Run("separate writers", func(t *testing.T) {
		t.Parallel()
		var stdout, stderr syncBuffer
		h := handlers.Exec(writeScript(t, t.TempDir(), body), handlers.ExecOptions{Stdout: &stdout, Stderr: &stderr})
		if err := h.Process(context.Background(), &data.Job{Subject: "job.x"}); err != nil {
			t.Fatalf("Process = %v, want nil", err)
		}
		if got := stdout.String(); !strings.HasSuffix(got, "out 199\n") || strings.Contains(got, "err") {
			t.Errorf("stdout = %q, want only out lines", got)
		}
		if got := stderr.String(); !strings.HasSuffix(got, "err 199\n") || strings.Contains(got, "out") {
			t.Errorf("stderr = %q, want only err lines", got)
		}
	})
	t.Run("failing stderr writer", func(t *testing.T) {
		t.Parallel()
		h := handlers.Exec(writeScript(t, t.TempDir(), body+"echo last >&2; exit 75\n"),
			handlers.ExecOptions{Stdout: io.Discard, Stderr: errWriter{}})
		err := h.Process(context.Background(), &data.Job{Subject: "job.x"})
		if got, want := err.Error(), "exit status 75: "; !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "last") {
			t.Errorf("Process = %q, want %q... ending in the last stderr line", got, want)
		}
	})
}

func TestExecCannotStart(t *testing.T) {
	t.Parallel()
	h := handlers.Exec("true", handlers.ExecOptions{Dir: filepath.Join(t.TempDir(), "missing")})
	err := h.Process(context.Background(), &data.Job{Subject: "job.x"})
	var xe *handlers.ExitError
	if err == nil || errors.As(err, &xe) || handlers.IsPermanent(err) {
		t.Errorf("Process = %v, want a retryable error that is not an *ExitError", err)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Process = %v, want it to wrap os.ErrNotExist", err)
	}
}

// TestExecCommandStartingWithADash: the command is sh's command string as
// given, even when it starts with "-", which sh would otherwise take for
// its options and refuse.
func TestExecCommandStartingWithADash(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	h := handlers.Exec(`-no-such-command 2>/dev/null; echo ran >"$OUT"`, handlers.ExecOptions{Env: []string{"OUT=" + out}})
	if err := h.Process(context.Background(), &data.Job{Subject: "job.x"}); err != nil {
		t.Fatalf("Process = %v, want the command run as written", err)
	}
	if got := readFile(t, filepath.Dir(out), "out"); got != "ran\n" {
		t.Errorf("command wrote %q, want %q", got, "ran\n")
	}
}

func TestExecContextDoneBeforeStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := handlers.Exec(writeScript(t, dir, `touch "$1/ran"`), handlers.ExecOptions{}).
		Process(ctx, &data.Job{Subject: "job.x"})
	if !errors.Is(err, context.Canceled) || handlers.IsPermanent(err) {
		t.Errorf("Process = %v, want a retryable error wrapping %v", err, context.Canceled)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the command ran (stat: %v), want it not started", err)
	}
}

func TestExecCancelKillsGroup(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
	}{
		// The shell waits for a grandchild; SIGTERM to the group ends both.
		{"sleeping child", `
echo $$ > "$1/shpid.tmp" && mv "$1/shpid.tmp" "$1/shpid"
sleep 100 &
echo $! > "$1/pid.tmp" && mv "$1/pid.tmp" "$1/pid"
wait
`},
		// Both ignore SIGTERM; the SIGKILL that follows 5s later ends them.
		{"ignoring SIGTERM", `
trap '' TERM
echo $$ > "$1/shpid.tmp" && mv "$1/shpid.tmp" "$1/shpid"
sleep 100 &
echo $! > "$1/pid.tmp" && mv "$1/pid.tmp" "$1/pid"
wait
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			h := handlers.Exec(writeScript(t, dir, tt.body), handlers.ExecOptions{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- h.Process(ctx, &data.Job{Subject: "job.x"}) }()

			var pids []int
			for _, name := range []string{"shpid", "pid"} {
				eventually(t, "the script writes "+name, func() bool {
					select {
					case err := <-done:
						t.Fatalf("Process returned %v before the script wrote %s", err, name)
					default:
					}
					_, err := os.Stat(filepath.Join(dir, name))
					return err == nil
				})
				pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, dir, name)))
				if err != nil {
					t.Fatal(err)
				}
				pids = append(pids, pid)
			}
			cancel()

			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) || handlers.IsPermanent(err) {
					t.Errorf("Process = %v, want a retryable error wrapping %v", err, context.Canceled)
				}
			case <-time.After(generous):
				t.Fatalf("Process still running %v after cancel, want it to return", generous)
			}
			// The group got SIGKILL before Process returned; a process may
			// still be on its way out.
			for _, pid := range pids {
				t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
				eventually(t, fmt.Sprintf("process %d is gone", pid), func() bool { return processGone(pid) })
			}
		})
	}
}

func TestExecNilJob(t *testing.T) {
	t.Parallel()
	if err := handlers.Exec("true", handlers.ExecOptions{}).Process(context.Background(), nil); !handlers.IsPermanent(err) {
		t.Errorf("Process(nil) = %v, want a permanent error", err)
	}
}
