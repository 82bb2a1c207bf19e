package queue_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// A line whose ack was lost (here every ack: an ack timeout shorter than
// any round trip) is re-sent under its ID. With input that then pauses (a
// pipe that gives lines as they come), the re-send waited for the next
// window's worth of lines, or the end of the input: past JOB's dedupe
// window, so that JOB stored the job twice. The re-send must go out while
// the window still holds the first send.
func TestImportResendsALostAckWithinTheDedupeWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{DedupeWindow: time.Second})
	r := io.MultiReader(strings.NewReader(`{"subject":"job.pause","id":"pause-1"}`+"\n"),
		readerFunc(func([]byte) (int, error) {
			time.Sleep(3 * time.Second) // the input pauses, longer than the dedupe window
			return 0, io.EOF
		}))
	sum, err := queue.Import(context.Background(), b.prod, r, queue.ImportOptions{AckTimeout: time.Nanosecond})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	if got := b.storedJobs(t); len(got) != 1 {
		t.Errorf("JOB holds %d copies of pause-1, want 1; summary %+v", len(got), sum)
	}
}

// IDs may hold any printable bytes (README): one that starts or ends with
// a space other than ASCII's, such as a no-break space or an ideographic
// one, travels in its header as it is (only ASCII spaces and tabs are
// trimmed), yet ValidID refused it as white space "which headers drop".
func TestEnqueueTakesIDsEndingInUnicodeSpaces(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	for _, id := range []string{"order-7\u00a0", "\u3000注文-8", "x\u2003"} {
		if _, err := b.prod.Enqueue(context.Background(), "job.space", []byte("x"), queue.EnqueueOptions{ID: id}); err != nil {
			t.Errorf("enqueue %q: %v", id, err)
		}
	}
	c := newCounter()
	b.startPool(t, c.wrap(ok))
	b.waitDrained(t)
	for _, id := range []string{"order-7\u00a0", "\u3000注文-8", "x\u2003"} {
		if rec := b.record(t, id); c.get(id) != 1 || rec.State != data.StateDone || rec.ID != id {
			t.Errorf("job %q ran %d times, record %+v; want once, done with its ID", id, c.get(id), rec)
		}
	}
}

// WORKER's max ack pending only grows (ensureConsumer), so that pools
// sharing it are never held to less: -1, no limit, set by an operator
// (nats consumer edit JOB WORKER --max-pending -1), is more than any. It
// was put down to jobq's 1,032, logged without a word about it.
func TestProvisionKeepsAnUnlimitedMaxAckPending(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{})
	ctx := context.Background()
	cc := b.obj.Worker.CachedInfo().Config
	cc.MaxAckPending = -1
	if _, err := b.js.UpdateConsumer(ctx, queue.StreamJob, cc); err != nil {
		t.Fatal(err)
	}
	obj, err := queue.Provision(ctx, b.js, b.cfg, servertest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := obj.Worker.CachedInfo().Config.MaxAckPending; got != -1 {
		t.Errorf("WORKER's max ack pending: got %d after Provision, want -1 (no limit) kept", got)
	}
}
