//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A value flag typed last with no value (an unquoted, unset $ID) is "flag
// needs an argument". It took the "--" that flagsFirst puts before the
// arguments: each such job was stored with the ID "--", and every later one
// dropped as its duplicate, exit 0.
func TestTrailingValueFlagWithoutValueIsBadUsage(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	for _, payload := range []string{`{"employee":"E1"}`, `{"employee":"E2"}`} {
		r := runCmd(t, cmdInput{}, jobqBin, "enqueue", "--server", s.url, "job.payroll", payload, "--id")
		wantOneLineError(t, r, 2, "--id")
		// The same before a "--" typed to end the flags: it was taken
		// for the ID "--", the second job dropped as its duplicate.
		r = runCmd(t, cmdInput{}, jobqBin, "enqueue", "--server", s.url, "--id", "--", "job.payroll", payload)
		wantOneLineError(t, r, 2, "--id")
	}
	if st := s.status(t); st.Stream.Messages != 0 {
		t.Errorf("JOB holds %d jobs after four enqueues without an --id value; want none stored", st.Stream.Messages)
	}
	// Same cause: --server "--" was dialled, and reported as unreachable.
	wantOneLineError(t, jobq(t, "job", "some-id", "--server"), 2, "--server")
}

// --sync under a millisecond is bad usage, in serve and bench alike: 1ns
// passed the check (a positive duration) and panicked in nats-server's
// file store (rand.Int64N(0)) with a stack trace.
func TestSyncBelowAMillisecondIsBadUsage(t *testing.T) {
	t.Parallel()
	r := runCmd(t, cmdInput{timeout: 30 * time.Second}, jobqBin, "serve", "--store-dir", filepath.Join(t.TempDir(), "store"),
		"--listen", "127.0.0.1:0", "--http", "", "--log-level", "error", "--sync", "1ns")
	wantOneLineError(t, r, 2, "--sync")
	wantOneLineError(t, jobq(t, "bench", "--sync", "999us"), 2, "--sync")
}

// --workers and --prefetch are bounded, checked before anything is
// provisioned: too large to allocate, they crashed serve with a Go panic
// and a stack trace, after raising WORKER's MaxAckPending for good. A
// negative --prefetch for bench, and an --timeout so long that enqueue's
// four of it overflow, are bad usage too.
func TestHugeWorkersIsBadUsage(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"--workers", "--prefetch"} {
		r := runCmd(t, cmdInput{timeout: 30 * time.Second}, jobqBin, "serve", "--store-dir", filepath.Join(t.TempDir(), "store"),
			"--listen", "127.0.0.1:0", "--http", "", "--log-level", "error",
			"--handler", "job.>=log", flag, "9223372036854775807")
		wantOneLineError(t, r, 2, flag)
	}
	wantOneLineError(t, jobq(t, "bench", "--prefetch", "-1"), 2, "--prefetch")
	wantOneLineError(t, jobq(t, "bench", "--workers", "2000000000"), 2, "--workers")
	wantOneLineError(t, jobq(t, "enqueue", "--server", "nats://"+freeAddr(t), "--timeout", "1000000h", "job.x", "y"), 2, "--timeout")
}

// enqueue --file reads no further than --max-payload, as from stdin: it
// read the whole file first, so a FIFO, /dev/zero or a huge file was read
// to its end or until memory ran out. Here a FIFO gets 2 MiB and stays
// open: the bounded read says "payload too large" at once.
func TestEnqueueFileIsReadWithinTheLimit(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "payload")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		defer f.Close()
		f.Write(make([]byte, 2<<20))
		<-release // the writer stays: no EOF
	}()
	r := runCmd(t, cmdInput{timeout: 20 * time.Second}, jobqBin, "enqueue", "--server", "nats://"+freeAddr(t), "job.big", "--file", fifo)
	wantOneLineError(t, r, 2, "payload too large")
}

// An --http port out of range is bad usage (exit 2), as the same mistake
// in --listen is. It was exit 1, blaming a taken port ("pass a free
// address").
func TestHTTPPortOutOfRangeIsBadUsage(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1:http"} {
		r := runCmd(t, cmdInput{timeout: 30 * time.Second}, jobqBin, "serve", "--store-dir", filepath.Join(t.TempDir(), "store"),
			"--listen", "127.0.0.1:0", "--http", addr)
		wantOneLineError(t, r, 2, "--http")
		if strings.Contains(r.stderr, "free address") {
			t.Errorf("--http %s: %q blames a taken port; the port is invalid", addr, r.stderr)
		}
	}
}

// A failure to write the output is a runtime failure (exit 1): the text
// outputs ignored it, and exited 0 with nothing written (the --json ones
// exited 1). enqueue says the job was stored, so that a script does not
// store it again under a new ID.
func TestOutputWriteErrorIsAFailure(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	for _, args := range [][]string{
		{"version"},
		{"completion", "bash"},
		{"enqueue", "--server", s.url, "--id", "full-1", "job.full", "x"},
		{"dlq", "purge", "--server", s.url},
	} {
		full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		r := runCmdTo(t, full, args...)
		full.Close()
		if r.code != 1 || !strings.Contains(r.stderr, "no space left") || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
			t.Errorf("jobq %q > /dev/full: %s; want exit status 1 and one line saying the write failed", args, r)
		}
		if args[0] == "enqueue" && !strings.Contains(r.stderr, "job stored at seq 1") {
			t.Errorf("enqueue > /dev/full: %q; want it to say the job was stored", r.stderr)
		}
	}
}

// runCmdTo runs jobq with args, its stdout going to out, stdin /dev/null.
func runCmdTo(t *testing.T, out *os.File, args ...string) result {
	t.Helper()
	errf, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	p, err := os.StartProcess(jobqBin, append([]string{jobqBin}, args...), &os.ProcAttr{
		Env:   subprocessEnv(),
		Files: []*os.File{nil, out, errf},
	})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(errf.Name())
	return result{stderr: string(b), code: st.ExitCode()}
}

// serve --server that cannot be reached says to check --server: the advice
// of the client commands, to start one with jobq serve, was no help there.
func TestServeWithAnUnreachableServerSaysSo(t *testing.T) {
	t.Parallel()
	nowhere := "nats://" + freeAddr(t)
	r := runCmd(t, cmdInput{timeout: 30 * time.Second}, jobqBin, "serve", "--server", nowhere, "--http", "", "--handler", "job.>=log")
	wantOneLineError(t, r, 1, "cannot reach the NATS server at "+nowhere, "check --server")
	if strings.Contains(r.stderr, "start one with") {
		t.Errorf("serve: %q advises starting a server with jobq serve", r.stderr)
	}
}

// --listen is the embedded server's: with --server it is not used, so it
// may be --http's address (its default, 127.0.0.1:4222, was refused as
// the same as --http 127.0.0.1:4222).
func TestServeWithServerTakesAnyListen(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	r := runCmd(t, cmdInput{timeout: 30 * time.Second}, jobqBin, "serve", "--server", "nats://"+freeAddr(t), "--store-dir", filepath.Join(t.TempDir(), "store"),
		"--listen", addr, "--http", addr)
	if r.code == 2 || strings.Contains(r.stderr, "same address") {
		t.Errorf("serve --server with --listen %s --http %s: %s; want it past its flags, to fail reaching the server", addr, addr, r)
	}
}
