package handlers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jobq/jobq/data"
)

// Exit statuses an Exec command uses to say what became of a job, from
// sysexits.h. Any non-zero status other than ExitPermanent is retried;
// ExitRetry is the one to use on purpose.
const (
	// ExitPermanent (EX_DATAERR) fails the job for good: it is dead-lettered
	// without further attempts.
	ExitPermanent = 65
	// ExitRetry (EX_TEMPFAIL) fails this attempt; the job is retried.
	ExitRetry = 75
)

const (
	// execKillDelay is how long a cancelled command's process group has
	// between SIGTERM and SIGKILL.
	execKillDelay = 5 * time.Second
	// stderrTailSize bounds how much of a command's stderr is kept for its
	// ExitError.
	stderrTailSize = 4 << 10
)

// ExecOptions configures an Exec handler. The zero value runs the command in
// the current directory with the process's environment and discards its
// output, keeping the tail of stderr for errors.
type ExecOptions struct {
	// Env holds extra KEY=VALUE entries added to the process's environment.
	// The JOBQ_* variables override entries of the same name.
	Env []string
	// Dir is the command's working directory. Defaults to the current one.
	Dir string
	// Stdout, if set, receives the command's stdout. Defaults to discarding it.
	// Write errors are ignored: the command's exit status decides.
	Stdout io.Writer
	// Stderr, if set, also receives the command's stderr, which is always
	// captured (its last 4 KiB) for the ExitError. Write errors are ignored.
	Stderr io.Writer
}

// Exec returns a Handler that runs "sh -c -- command" for each job, with the
// payload on stdin and the environment of the process plus opts.Env plus
// JOBQ_JOB_ID, JOBQ_SUBJECT, JOBQ_ATTEMPT, JOBQ_SEQ and JOBQ_RESUMED ("1" or
// "0").
//
// Stdout and Stderr, unless an *os.File, are written one write at a time,
// across the jobs that run at once too, so one writer that is not safe for
// concurrent use may be given as both.
//
// Exit status 0 means done. ExitPermanent returns a Permanent *ExitError; any
// other status returns a retryable *ExitError. A command that cannot start
// returns a retryable error. When ctx ends, the command's process group gets
// SIGTERM, and SIGKILL 5 seconds later if any of it is still running;
// Process returns once the whole group is gone, or at the SIGKILL, with an
// error wrapping ctx.Err(), and kills what is left of the group.
func Exec(command string, opts ExecOptions) Handler {
	opts.Env = slices.Clone(opts.Env)
	return &execHandler{command: command, opts: opts}
}

type execHandler struct {
	command string
	opts    ExecOptions
	mu      sync.Mutex // serializes writes to opts.Stdout and opts.Stderr, across jobs
}

// Process runs the command for job.
func (h *execHandler) Process(ctx context.Context, job *data.Job) error {
	if job == nil {
		return Permanent(errors.New("exec: nil job"))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("run command: %w", err)
	}

	cmd, gate, err := shellCommand(ctx, h.command)
	if err != nil {
		return fmt.Errorf("start command: %w", err)
	}
	defer gate.shut()
	cmd.Dir = h.opts.Dir
	cmd.Env = h.env(job)
	cmd.Stdin = bytes.NewReader(job.Payload)

	tail := &tailBuffer{limit: stderrTailSize}
	cmd.Stderr = &stderrWriter{tail: tail, user: userWriter{w: h.opts.Stderr, mu: &h.mu}}
	switch w := h.opts.Stdout.(type) {
	case nil:
	case *os.File:
		cmd.Stdout = w
	default:
		cmd.Stdout = &userWriter{w: w, mu: &h.mu}
	}

	g := killGroupOnCancel(cmd, execKillDelay)
	// A backstop: the group gets SIGKILL at execKillDelay, after which Wait
	// stops waiting for pipes that something outside the group still holds.
	cmd.WaitDelay = execKillDelay + time.Second

	// The thread that starts the command lives until Wait returns (see
	// dieWithJobq).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err = cmd.Start()
	gate.started()
	if err != nil {
		return fmt.Errorf("start command: %w", err)
	}
	stopWatch, watchdog, err := watchGroup(cmd)
	if err != nil {
		// Unwatched, it could outlive a jobq killed meanwhile: it never
		// runs, its gate shut.
		gate.shut()
		_ = cmd.Cancel()
		_ = cmd.Wait()
		g.done(ctx)
		return err
	}
	defer stopWatch()
	// Only now, its watchdog in its group, may the command run: what it
	// starts before then would outlive a jobq killed meanwhile.
	gate.open()
	err = cmd.Wait()
	g.settle(watchdog)
	canceled := g.done(ctx)

	if err == nil {
		return nil
	}
	if canceled {
		// Stopped by ctx. One that ended after the command exited, while
		// Wait waited for its output, leaves the exit status to decide.
		return fmt.Errorf("run command: %w", ctx.Err())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		xe := &ExitError{Code: exitCode(ee.ProcessState), Stderr: tail.String(), err: ee}
		if xe.Code == ExitPermanent {
			return Permanent(xe)
		}
		return xe
	}
	if errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success() {
		// The command succeeded; something it left behind held its output open.
		return nil
	}
	return fmt.Errorf("run command: %w", err)
}

// env returns the command's environment for job.
func (h *execHandler) env(job *data.Job) []string {
	resumed := "0"
	if job.Resumed {
		resumed = "1"
	}
	// jobq's own configuration (JOBQ_TOKEN, JOBQ_PASSWORD, ...) stays out
	// of the command's environment: it may hold secrets.
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "JOBQ_") })
	env = slices.Grow(env, len(h.opts.Env)+5)
	env = append(env, h.opts.Env...)
	return append(env,
		"JOBQ_JOB_ID="+envSafe(job.ID),
		"JOBQ_SUBJECT="+envSafe(job.Subject),
		"JOBQ_ATTEMPT="+strconv.Itoa(job.Attempt),
		"JOBQ_SEQ="+strconv.FormatUint(job.Seq, 10),
		"JOBQ_RESUMED="+resumed,
	)
}

// envSafe returns v as an environment variable can hold it: percent-encoded
// (as the http handler's headers) if it holds a NUL, which another NATS
// client may put in a job's ID or subject; and as its ledger key (data.Key:
// "==" and its SHA-256) if longer than maxEnvValue, as another client's ID
// may be. The command could never start with either, and the job would be
// retried to no end.
func envSafe(v string) string {
	safe := v
	if strings.IndexByte(v, 0) >= 0 {
		safe = url.PathEscape(v)
	}
	if len(safe) > maxEnvValue {
		return data.Key(v)
	}
	return safe
}

// maxEnvValue is the longest value envSafe passes as it is, well under
// what Linux takes for one environment variable (128 KiB).
const maxEnvValue = 64 << 10

// tailBuffer keeps the last limit bytes written to it.
type tailBuffer struct {
	buf   []byte
	limit int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= t.limit {
		t.buf = append(t.buf[:0], p[len(p)-t.limit:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.limit; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

func (t *tailBuffer) String() string { return string(t.buf) }

// stderrWriter keeps the tail of a command's stderr and copies it to the
// caller's writer, if any.
type stderrWriter struct {
	tail *tailBuffer
	user userWriter
}

func (w *stderrWriter) Write(p []byte) (int, error) {
	_, _ = w.tail.Write(p)
	return w.user.Write(p)
}

// userWriter copies a command's output to a writer of the caller's, w if
// not nil, until a write fails: the command runs on, and its exit status
// decides its job, not the writer (whose error Wait returned, failing a
// command that exited 0). mu serializes the writes with those of the
// other writers of the handler, its jobs running at once included, so one
// writer may be given as both Stdout and Stderr.
type userWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (w *userWriter) Write(p []byte) (int, error) {
	if w.w != nil {
		w.mu.Lock()
		if _, err := w.w.Write(p); err != nil {
			w.w = nil
		}
		w.mu.Unlock()
	}
	return len(p), nil
}
