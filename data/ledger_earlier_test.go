package data_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
)

// A seq-ID job of a JOB made anew that finds a not-done record of the
// earlier JOB's job at its sequence (retrying, failed, an expired claim)
// takes it over afresh: its claim carried the record's first time over, so
// its own done record was older than JOB, and a redelivery of it was taken
// for another job's and run again.
func TestLedgerDoneRecordOfAClaimOverAnEarlierStreamsIsDone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := data.NewLedger(newKV(t), time.Minute, nil)
	id := data.SeqID(1)

	// The earlier JOB: seq-1 failed an attempt and waits for a retry.
	c, err := l.Claim(ctx, &data.Job{ID: id, Subject: "job.x", Seq: 1, Attempt: 1}, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Retry(ctx, &c, time.Millisecond, "boom"); err != nil {
		t.Fatal(err)
	}

	// JOB deleted and made anew.
	created := madeAnewNow(l)

	// The new JOB's seq-1 runs and is recorded done.
	c, err = l.Claim(ctx, &data.Job{ID: id, Subject: "job.x", Seq: 1, Attempt: 1, EnqueuedAt: time.Now()}, "w2")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Done(ctx, &c, time.Millisecond); err != nil {
		t.Fatal(err)
	}

	// The same message delivered again (its ack lost).
	c2, err := l.Claim(ctx, &data.Job{ID: id, Subject: "job.x", Seq: 1, Attempt: 2}, "w3")
	if !errors.Is(err, data.ErrAlreadyDone) {
		t.Errorf("redelivery of a job recorded done: got %v (record %+v), want ErrAlreadyDone; its done record has FirstAt %v, before JOB's creation %v",
			err, c2.Record, c.Record.FirstAt, created)
	}
}

// FailUnclaimed writes over an earlier JOB's done record: it left any done
// record alone, so a seq-ID job of a JOB made anew that the sweep
// dead-lettered stayed "done", and its dead-lettered copy, delivered again
// once its removal from JOB was lost, was not told apart (ErrDeadLettered)
// but claimed and run.
func TestLedgerFailUnclaimedWritesOverAnEarlierStreamsDoneRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := data.NewLedger(newKV(t), time.Minute, nil)
	id := data.SeqID(1)
	c, err := l.Claim(ctx, &data.Job{ID: id, Subject: "job.x", Seq: 1, Attempt: 1}, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Done(ctx, &c, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	created := madeAnewNow(l)

	job := &data.Job{ID: id, Subject: "job.x", Seq: 1, Attempt: 3, EnqueuedAt: time.Now()}
	if err := l.FailUnclaimed(ctx, job, "deliveries exhausted (max deliver 3)"); err != nil {
		t.Fatal(err)
	}
	rec, err := l.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != data.StateFailed {
		t.Errorf("record of the dead-lettered job: state %s, first_at %v (before JOB's creation %v); want failed", rec.State, rec.FirstAt, created)
	}
	again := &data.Job{ID: id, Subject: "job.x", Seq: 1, Attempt: 4, EnqueuedAt: job.EnqueuedAt}
	if _, err := l.Claim(ctx, again, "w2"); !errors.Is(err, data.ErrDeadLettered) {
		t.Errorf("the dead-lettered copy delivered again: got %v, want ErrDeadLettered (it would run)", err)
	}
}

// A job's records keep when its message was stored, and for a SeqID job
// Earlier goes by that: a job of an earlier JOB that first runs after JOB
// was made anew writes records that are still told for the earlier JOB's.
// A job with an ID of its own is that job in any JOB.
func TestLedgerRecordsOfASeqIDJobKeepWhenItWasStored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := data.NewLedger(newKV(t), time.Minute, nil)
	stored := time.Now().Add(-time.Second).UTC()
	created := stored.Add(500 * time.Millisecond) // JOB made anew after the job was stored
	l.SetJobStreamCreated(func(context.Context) (time.Time, error) { return created, nil })
	for _, id := range []string{data.SeqID(7), "own"} {
		c, err := l.Claim(ctx, &data.Job{ID: id, Subject: "job.x", Seq: 7, Attempt: 1, EnqueuedAt: stored}, "w1")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Done(ctx, &c, time.Millisecond); err != nil {
			t.Fatal(err)
		}
		rec, err := l.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !rec.StoredAt.Equal(stored) {
			t.Errorf("%s: stored_at %v, want %v", id, rec.StoredAt, stored)
		}
		earlier, err := l.Earlier(ctx, id, time.Time{}, rec) // no message at hand, as for jobq job
		if err != nil || earlier != (id != "own") {
			t.Errorf("%s: Earlier = %v, %v; want %v (first ran at %v, after JOB's making at %v)", id, earlier, err, id != "own", rec.FirstAt, created)
		}
		// The very message the record is of, delivered again, is its job.
		if earlier, err := l.Earlier(ctx, id, stored, rec); err != nil || earlier {
			t.Errorf("%s: Earlier for its own message = %v, %v; want false", id, earlier, err)
		}
	}
}

// A wall clock set back after JOB was created (an appliance that booted
// with its clock ahead, set right by NTP; a store carried to a machine
// whose clock is behind) stores every later job "before" JOB's creation.
// Here JOB's creation is a minute after the job's stored time. The job
// (seq-1, no Nats-Msg-Id) runs and is recorded done; its ack is lost and it
// is delivered again: done means done, it is acked unrun. Its own done
// record was taken for an earlier JOB's job's, and it ran again; the sweep
// wrote over it.
func TestLedgerDoneSeqIDJobIsDoneAfterTheClockWasSetBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := data.NewLedger(newKV(t), time.Minute, nil)
	stored := time.Now().UTC()         // the server's clock when it stored the job
	created := stored.Add(time.Minute) // JOB was created before the clock went back a minute
	l.SetJobStreamCreated(func(context.Context) (time.Time, error) { return created, nil })

	c, err := l.Claim(ctx, &data.Job{ID: data.SeqID(1), Subject: "job.x", Seq: 1, Attempt: 1, EnqueuedAt: stored}, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Done(ctx, &c, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	again := &data.Job{ID: data.SeqID(1), Subject: "job.x", Seq: 1, Attempt: 2, EnqueuedAt: stored}
	if c2, err := l.Claim(ctx, again, "w2"); !errors.Is(err, data.ErrAlreadyDone) {
		t.Errorf("the same message delivered again after it was recorded done: got %v (state %s), want ErrAlreadyDone", err, c2.Record.State)
	}
	// The sweep leaves its done record as it is.
	if err := l.FailUnclaimed(ctx, again, "deliveries exhausted"); err != nil {
		t.Fatal(err)
	}
	if rec, err := l.Get(ctx, data.SeqID(1)); err != nil || rec.State != data.StateDone {
		t.Errorf("after the sweep: %+v, %v; want the done record kept", rec, err)
	}
}

// madeAnewNow tells l that JOB was made anew now, between the records
// written before and those written after, and returns when.
func madeAnewNow(l *data.Ledger) time.Time {
	time.Sleep(5 * time.Millisecond)
	created := time.Now()
	l.SetJobStreamCreated(func(context.Context) (time.Time, error) { return created, nil })
	time.Sleep(5 * time.Millisecond)
	return created
}
