package data_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/server/servertest"
)

func newKV(t *testing.T) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(servertest.Connect(t, servertest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "processed", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func TestLedgerClaimDone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := data.NewLedger(newKV(t), time.Minute, nil)
	job := &data.Job{ID: "a b", Subject: "job.x", Seq: 1, Attempt: 1}

	c, err := l.Claim(ctx, job, "w1")
	if err != nil || c.Record.State != data.StateRunning || c.Record.Attempts != 1 {
		t.Fatalf("claim: got %+v, %v; want running, attempt 1", c.Record, err)
	}
	if _, err := l.Claim(ctx, job, "w2"); !errors.Is(err, data.ErrClaimed) {
		t.Errorf("second claim: got %v, want ErrClaimed", err)
	}
	if err := l.Renew(ctx, &c); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if err := l.Done(ctx, &c, time.Millisecond); err != nil {
		t.Fatalf("done: %v", err)
	}
	if _, err := l.Claim(ctx, job, "w2"); !errors.Is(err, data.ErrAlreadyDone) {
		t.Errorf("claim after done: got %v, want ErrAlreadyDone", err)
	}
	rec, err := l.Get(ctx, "a b")
	if err != nil || rec.State != data.StateDone || rec.Worker != "w1" || rec.FinishedAt.IsZero() {
		t.Errorf("get: got %+v, %v; want done by w1", rec, err)
	}
	if _, err := l.Get(ctx, "nope"); !errors.Is(err, data.ErrNotFound) {
		t.Errorf("get unknown: got %v, want ErrNotFound", err)
	}
}

func TestLedgerExpiredClaimIsTakenOverAsResumed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := data.NewLedger(newKV(t), 50*time.Millisecond, nil)
	job := &data.Job{ID: "j", Subject: "job.x", Seq: 1}
	old, err := l.Claim(ctx, job, "dead")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond) // let the lease lapse
	job2 := &data.Job{ID: "j", Subject: "job.x", Seq: 1, Attempt: 2}
	c, err := l.Claim(ctx, job2, "alive")
	if err != nil {
		t.Fatalf("take over: %v", err)
	}
	if !c.Record.Resumed || !job2.Resumed || c.Record.Attempts != 2 {
		t.Errorf("got %+v, want resumed attempt 2", c.Record)
	}
	// The old holder can no longer record anything.
	if err := l.Done(ctx, &old, 0); !errors.Is(err, data.ErrClaimLost) {
		t.Errorf("done by the old holder: got %v, want ErrClaimLost", err)
	}
	if err := l.Renew(ctx, &old); !errors.Is(err, data.ErrClaimLost) {
		t.Errorf("renew by the old holder: got %v, want ErrClaimLost", err)
	}
}

func TestLedgerRetryAndFail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := data.NewLedger(newKV(t), time.Minute, nil)
	job := &data.Job{ID: "r", Subject: "job.x", Seq: 3}
	c, _ := l.Claim(ctx, job, "w")
	if err := l.Retry(ctx, &c, time.Second, "boom"); err != nil {
		t.Fatal(err)
	}
	c2, err := l.Claim(ctx, job, "w")
	if err != nil || c2.Record.Attempts != 2 || c2.Record.Resumed || c2.Record.LastError != "boom" {
		t.Fatalf("claim after retry: got %+v, %v; want attempt 2, not resumed, last error kept", c2.Record, err)
	}
	if err := l.Fail(ctx, &c2, time.Second, "boom again"); err != nil {
		t.Fatal(err)
	}
	rec, _ := l.Get(ctx, "r")
	if rec.State != data.StateFailed || rec.LastError != "boom again" {
		t.Errorf("got %+v, want failed with the last error", rec)
	}
	// A cut-off attempt makes the next one resumed.
	c3, _ := l.Claim(ctx, job, "w")
	l.Retry(ctx, &c3, 0, data.CauseCutOff)
	c4, _ := l.Claim(ctx, job, "w")
	if !c4.Record.Resumed {
		t.Errorf("claim after a cut-off attempt: got %+v, want resumed", c4.Record)
	}
}

func TestLedgerFailUnclaimedKeepsDone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := data.NewLedger(newKV(t), time.Minute, nil)
	job := &data.Job{ID: "d", Subject: "job.x", Seq: 1}
	c, _ := l.Claim(ctx, job, "w")
	l.Done(ctx, &c, 0)
	if err := l.FailUnclaimed(ctx, job, "exhausted"); err != nil {
		t.Fatal(err)
	}
	if rec, _ := l.Get(ctx, "d"); rec.State != data.StateDone {
		t.Errorf("got %s, want done kept", rec.State)
	}
	if err := l.FailUnclaimed(ctx, &data.Job{ID: "new", Subject: "job.x", Seq: 2}, "exhausted"); err != nil {
		t.Fatal(err)
	}
	if rec, _ := l.Get(ctx, "new"); rec.State != data.StateFailed || rec.LastError != "exhausted" {
		t.Errorf("got %+v, want failed: exhausted", rec)
	}
}

func TestLedgerReplacesCorruptRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kv := newKV(t)
	kv.Put(ctx, data.Key("c"), []byte("garbage"))
	l := data.NewLedger(kv, time.Minute, nil)
	if _, err := l.Get(ctx, "c"); !errors.Is(err, data.ErrCorruptRecord) {
		t.Errorf("get: got %v, want ErrCorruptRecord", err)
	}
	c, err := l.Claim(ctx, &data.Job{ID: "c", Subject: "job.x", Seq: 1}, "w")
	if err != nil || c.Replaced == nil || !c.Record.Resumed {
		t.Errorf("claim: got %+v, %v; want a claim that reports the replaced record", c, err)
	}
}

func TestLedgerReleaseIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := data.NewLedger(newKV(t), time.Minute, nil)
	job := &data.Job{ID: "rel", Subject: "job.x", Seq: 1}
	c, _ := l.Claim(ctx, job, "w")
	if err := l.Release(ctx, &c); err != nil {
		t.Fatal(err)
	}
	c2, err := l.Claim(ctx, job, "w")
	if err != nil || c2.Record.Resumed || c2.Record.Attempts != 1 {
		t.Fatalf("claim after a release: got %+v, %v; want attempt 1, not resumed", c2.Record, err)
	}
	// A released claim that was itself resumed passes that on.
	l2 := data.NewLedger(newKV(t), 20*time.Millisecond, nil)
	l2.Claim(ctx, job, "dead")
	time.Sleep(30 * time.Millisecond)
	r, _ := l2.Claim(ctx, job, "w")
	if !r.Record.Resumed {
		t.Fatalf("takeover: got %+v, want resumed", r.Record)
	}
	l2.Release(ctx, &r)
	r2, _ := l2.Claim(ctx, job, "w")
	if !r2.Record.Resumed {
		t.Errorf("claim after releasing a resumed claim: got %+v, want still resumed", r2.Record)
	}
}
