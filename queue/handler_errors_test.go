package queue_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// A handler's error text is kept to 4 KiB: whole, one over the server's
// payload limit (a Go handler that wraps a large upstream response in its
// error, say) made every outcome write fail, so the job was dead-lettered
// but never recorded failed.
func TestHugeHandlerErrorStillRecordsTheOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	b.startPool(t, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		return handlers.Permanent(errors.New("upstream said: " + strings.Repeat("é", 1<<20)))
	}))
	b.enqueue(t, "job.big", "big-1", "x")
	rec := b.waitState(t, "big-1", data.StateFailed)
	if n := len(rec.LastError); n == 0 || n > 4<<10 || !utf8.ValidString(rec.LastError) || !strings.HasPrefix(rec.LastError, "upstream said: éé") {
		t.Errorf("last error: %d bytes, valid UTF-8 %v, starts %q; want its first 4 KiB at most, cut between characters", n, utf8.ValidString(rec.LastError), rec.LastError[:min(len(rec.LastError), 20)])
	}
	if n := b.status(t).DLQ.Messages; n != 1 {
		t.Errorf("DLQ holds %d dead letters, want 1", n)
	}
}

// A handler that ends its goroutine with runtime.Goexit (t.FailNow or
// t.SkipNow called from a handler) escapes every recover. Its worker was
// gone for good: with the last one gone, the pool still fetched and leased
// jobs but ran none, and they were dead-lettered as deliveries exhausted
// without ever running. Now the attempt fails, is retried, and another
// worker takes the place of the one that exited.
func TestHandlerGoexitDoesNotKillTheWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{Workers: 1})
	var ran atomic.Int32
	b.startPool(t, handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
		if job.ID == "goexit-1" {
			runtime.Goexit()
		}
		ran.Add(1)
		return nil
	}))
	b.enqueue(t, "job.x", "goexit-1", "x")
	b.enqueue(t, "job.x", "next-1", "x")
	deadline := time.Now().Add(10 * time.Second)
	for ran.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if ran.Load() == 0 {
		t.Fatalf("job next-1 never ran in 10s: the pool's only worker died with the handler that called runtime.Goexit")
	}
	// Retried, or with a short backoff dead-lettered already: either way
	// its attempt failed for the Goexit.
	waitFor(t, 20*time.Second, func() error {
		rec, err := data.NewLedger(b.obj.Ledger, time.Minute, nil).Get(context.Background(), "goexit-1")
		if err != nil || !strings.Contains(rec.LastError, "runtime.Goexit") {
			return fmt.Errorf("goexit-1: record %+v, %v; want its last error to say the handler called runtime.Goexit", rec, err)
		}
		return nil
	})
}

// nilPtrErr is the classic typed-nil error: a handler returns a nil
// *nilPtrErr as an error, which is != nil, and its Error method
// dereferences the nil receiver.
type nilPtrErr struct{ msg string }

func (e *nilPtrErr) Error() string { return e.msg }

// A handler's error whose Error method panics (a typed nil, the commonest
// of Go slips) is a handler panic, retried as any: it panicked in
// Pool.fail, on the worker's goroutine, outside call's recover, and took
// the process down with every job in flight, and then every process the
// job was delivered to. The scenario runs in a child process, which the
// panic would kill.
func TestHandlerErrorWhoseErrorMethodPanicsDoesNotCrashThePool(t *testing.T) {
	if os.Getenv("JOBQ_TEST_CHILD") == "1" {
		b := setup(t, queue.Config{})
		b.startPool(t, handlers.HandlerFunc(func(context.Context, *data.Job) error {
			var e *nilPtrErr
			return e
		}))
		b.enqueue(t, "job.x", "nilerr-1", "x")
		// Retried, or with a short backoff dead-lettered already: either
		// way, recorded with the panic of its Error method.
		waitFor(t, 20*time.Second, func() error {
			rec, err := data.NewLedger(b.obj.Ledger, time.Minute, nil).Get(context.Background(), "nilerr-1")
			if err != nil || !strings.Contains(rec.LastError, "handler panic") {
				return fmt.Errorf("nilerr-1: record %+v, %v; want its last error the panic of its Error method", rec, err)
			}
			return nil
		})
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHandlerErrorWhoseErrorMethodPanicsDoesNotCrashThePool$", "-test.count=1")
	cmd.Env = append(os.Environ(), "JOBQ_TEST_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		first := string(out)
		if i := strings.Index(first, "panic:"); i >= 0 {
			first = first[i:min(len(first), i+600)]
		}
		t.Fatalf("the pool's process died (%v) on a handler error whose Error method panics:\n%s", err, first)
	}
}

// goexitOnce is an Observer that calls runtime.Goexit (t.FailNow, say) the
// first time it is told of a retry.
type goexitOnce struct{ fired atomic.Bool }

func (o *goexitOnce) JobFinished(_ *data.Job, state data.State, _ time.Duration, _ error) {
	if state == data.StateRetrying && o.fired.CompareAndSwap(false, true) {
		runtime.Goexit()
	}
}

// A Goexit on a worker's goroutine after the handler returned (here in the
// Observer) replaces the worker, but does not finish the job's attempt a
// second time: it did, and InFlight stayed at -1.
func TestGoexitAfterTheHandlerReturnedFinishesTheJobOnce(t *testing.T) {
	t.Parallel()
	o := &goexitOnce{}
	b := setup(t, queue.Config{Workers: 1, MaxDeliver: 5, Observer: o})
	p := b.startPool(t, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		return errors.New("attempt fails")
	}))
	b.enqueue(t, "job.x", "obs-1", "x")
	waitFor(t, 10*time.Second, func() error {
		if !o.fired.Load() {
			return errors.New("no retry observed yet")
		}
		return nil
	})
	waitFor(t, 5*time.Second, func() error {
		if n := p.InFlight(); n != 0 {
			return fmt.Errorf("InFlight() = %d with no handler running, want 0: the job's attempt was finished twice", n)
		}
		return nil
	})
}

// A handler panic's text is cut as a returned error's is: over the
// server's payload limit, the dead-lettered job was never recorded failed.
func TestHugePanicStillRecordsTheOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 1})
	b.startPool(t, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		panic("upstream said: " + strings.Repeat("é", 1<<20))
	}))
	b.enqueue(t, "job.big", "bigpanic-1", "x")
	rec := b.waitState(t, "bigpanic-1", data.StateFailed)
	if n := len(rec.LastError); n > 4<<10 || !strings.HasPrefix(rec.LastError, "handler panic: upstream said: é") || !utf8.ValidString(rec.LastError) {
		t.Errorf("last error: %d bytes, starts %q; want the panic's first 4 KiB at most", n, rec.LastError[:min(n, 40)])
	}
}

// queue.Next runs the handler on the caller's goroutine: a Goexit there
// ends it still, but fails the attempt first, which was left to wait out
// the ack wait, unrecorded.
func TestNextHandlerGoexitFailsTheAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 3})
	b.enqueue(t, "job.n", "nextgoexit-1", "x")
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = queue.Next(context.Background(), b.obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
			runtime.Goexit()
			return nil
		}), 5*time.Second, servertest.Logger(t))
	}()
	<-done
	if rec := b.waitState(t, "nextgoexit-1", data.StateRetrying); !strings.Contains(rec.LastError, "runtime.Goexit") {
		t.Errorf("last error %q, want it to say the handler called runtime.Goexit", rec.LastError)
	}
}
