package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// A done record that cannot even be sent (the connection's buffer full
// while it reconnects; here, the ledger's writes closed under the handler)
// is written again, as one the ledger did not answer, while the job, whose
// handler succeeded, is held. It was released instead, to run again once
// its lease ended.
func TestADoneRecordThatCannotBeSentIsWrittenAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	obj := objectsWith(t, Config{Workers: 1})
	var p *Pool
	var runs atomic.Int32
	p = NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		runs.Add(1)
		p.ledger.Close() // the done record's send fails at once
		return nil
	}), servertest.Logger(t))
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		p.Stop(sctx)
	})
	if _, err := NewProducer(obj.JS, obj.Config).Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
		t.Fatal(err)
	}
	ledger := data.NewLedger(obj.Ledger, 0, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := ledger.Get(ctx, "J")
		info, ierr := obj.Jobs.Info(ctx)
		if err == nil && rec.State == data.StateDone && ierr == nil && info.State.Msgs == 0 {
			break
		}
		if err != nil && !errors.Is(err, data.ErrNotFound) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after its handler succeeded: record %+v (%v), JOB holds %v jobs (%v); want it recorded done and acked", rec, err, info.State.Msgs, ierr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the job ran %d times, want 1", n)
	}
}
