package data_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/server/servertest"
)

func newKV(t *testing.T) jetstream.KeyValue {
	_, kv := newBucket(t)
	return kv
}

// newBucket starts a server and creates the processed bucket on it.
func newBucket(t *testing.T) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	js, err := jetstream.New(servertest.Connect(t, servertest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "processed", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
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
	// So does one cut off by its pool's lease lapsing, recorded as such
	// rather than as a shutdown's, which it is not.
	l.Retry(ctx, &c4, 0, data.CauseLeaseLost)
	c5, _ := l.Claim(ctx, &data.Job{ID: "r", Subject: "job.x", Seq: 3}, "w")
	if !c5.Record.Resumed || c5.Record.LastError != data.CauseLeaseLost {
		t.Errorf("claim after an attempt cut off by a lapsed lease: got %+v, want resumed, its last error saying so", c5.Record)
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

// A job whose deliveries ran out is recorded awaiting its dead letter
// before it is dead-lettered, by a write that a worker's claim of it
// cannot pass unseen: a claim first keeps the job (ErrClaimed); a claim
// after does not run it (ErrAwaitingDeadLetter), nor after Fail
// (ErrDeadLettered).
func TestLedgerAwaitDeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kv := newKV(t)
	l := data.NewLedger(kv, time.Minute, nil)
	stored := time.Now().Add(-time.Minute)
	copyOf := func(id string) *data.Job {
		return &data.Job{ID: id, Subject: "job.x", Seq: 7, Attempt: 3, EnqueuedAt: stored}
	}

	// No record: created awaiting, and a claim of this copy is refused.
	c, err := l.AwaitDeadLetter(ctx, copyOf("n"), "boom")
	if err != nil || c.Record.State != data.StateRetrying || c.Record.LastError != data.AwaitingDeadLetter+"boom" {
		t.Fatalf("await with no record: got %+v, %v; want retrying, awaiting its dead letter", c.Record, err)
	}
	if _, err := l.Claim(ctx, copyOf("n"), "w"); !errors.Is(err, data.ErrAwaitingDeadLetter) {
		t.Errorf("claim while awaiting: got %v, want ErrAwaitingDeadLetter", err)
	}
	if again, err := l.AwaitDeadLetter(ctx, copyOf("n"), "boom"); err != nil || again.Revision != c.Revision {
		t.Errorf("await again: got revision %d, %v; want %d, the record as it is", again.Revision, err, c.Revision)
	}
	if err := l.Fail(ctx, &c, 0, "exhausted: boom"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, copyOf("n"), "w"); !errors.Is(err, data.ErrDeadLettered) {
		t.Errorf("claim after fail: got %v, want ErrDeadLettered", err)
	}

	// A live claim: left to its holder.
	held, err := l.Claim(ctx, copyOf("c"), "w")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.AwaitDeadLetter(ctx, copyOf("c"), "boom"); !errors.Is(err, data.ErrClaimed) {
		t.Errorf("await over a live claim: got %v, want ErrClaimed", err)
	}
	// Done: kept.
	if err := l.Done(ctx, &held, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := l.AwaitDeadLetter(ctx, copyOf("c"), "boom"); !errors.Is(err, data.ErrAlreadyDone) {
		t.Errorf("await over done: got %v, want ErrAlreadyDone", err)
	}
	if rec, _ := l.Get(ctx, "c"); rec.State != data.StateDone {
		t.Errorf("record after await over done: got %s, want done", rec.State)
	}

	// A lapsed claim: its attempt may have run, so the job is resumed.
	lapsed := data.NewLedger(kv, 50*time.Millisecond, nil)
	if _, err := lapsed.Claim(ctx, copyOf("l"), "w"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond) // let the claim lapse
	c, err = l.AwaitDeadLetter(ctx, copyOf("l"), "boom")
	if err != nil || !c.Record.Resumed || c.Record.Attempts != 3 {
		t.Errorf("await over a lapsed claim: got %+v, %v; want resumed, its 3 attempts kept", c.Record, err)
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

func newLedgerJS(t *testing.T) *data.Ledger {
	js, kv := newBucket(t)
	l := data.NewLedger(kv, time.Minute, js)
	t.Cleanup(l.Close)
	return l
}

func TestLedgerCheckReadsManyKeysAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLedgerJS(t)
	job := func(id string) *data.Job { return &data.Job{ID: id, Subject: "job.x", Seq: 1, Attempt: 1} }

	// An empty bucket has no record for anyone.
	snap, err := l.Check(ctx, []*data.Job{job("a"), job("b")}, "")
	if err != nil || len(snap.Found) != 2 || snap.Found[0] || snap.Found[1] || len(snap.Leases) != 0 || snap.LeaseSeq != 0 {
		t.Fatalf("empty bucket: got %+v, %v; want [false false] and no lease", snap, err)
	}

	// Plain and encoded keys, a done and a running record, a job listed twice.
	for _, id := range []string{"done-1", "ünïcode/id *"} {
		c, err := l.Claim(ctx, job(id), "w")
		if err != nil {
			t.Fatalf("claim %s: %v", id, err)
		}
		if id == "done-1" {
			if err := l.Done(ctx, &c, time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
	}
	jobs := []*data.Job{job("new-1"), job("done-1"), job("ünïcode/id *"), job("new-2"), job("done-1")}
	for i := range 300 { // more than one job per key, beyond one pull's worth
		jobs = append(jobs, job(fmt.Sprintf("more-%d", i)))
	}
	snap, err = l.Check(ctx, jobs, "")
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	want := make([]bool, len(jobs))
	want[1], want[2], want[4] = true, true, true
	if !slices.Equal(snap.Found, want) {
		t.Errorf("check: got %v for the first five, want %v", snap.Found[:5], want[:5])
	}
}

// A record written by another client may carry any header, a Status too:
// it is still a record, not the server's word.
func TestLedgerCheckTakesARecordWithAStatusHeaderForARecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	js, kv := newBucket(t)
	l := data.NewLedger(kv, time.Minute, js)
	t.Cleanup(l.Close)
	msg := nats.NewMsg("$KV." + kv.Bucket() + "." + data.Key("odd"))
	msg.Header.Set("Status", "404")
	msg.Data = []byte(`{"id":"odd","state":"done","attempts":1}`)
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	job := func(id string) *data.Job { return &data.Job{ID: id, Subject: "job.x", Seq: 1, Attempt: 1} }
	snap, err := l.Check(ctx, []*data.Job{job("odd"), job("new")}, "")
	if err != nil || !slices.Equal(snap.Found, []bool{true, false}) {
		t.Errorf("check: got %+v, %v; want [true false]", snap, err)
	}
}

func TestLedgerPreparedClaimIsWrittenByItsFirstWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLedgerJS(t)

	// Done through a prepared claim creates the record, in one write.
	job := &data.Job{ID: "p-1", Subject: "job.x", Seq: 7, Attempt: 1}
	c := l.Prepare(job, "w1", "")
	if c.Revision != 0 {
		t.Fatalf("prepared claim: got revision %d, want 0 (not written)", c.Revision)
	}
	if _, err := l.Get(ctx, "p-1"); !errors.Is(err, data.ErrNotFound) {
		t.Fatalf("after prepare: got %v, want no record", err)
	}
	w, err := l.DoneAsync(&c, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(ctx); err != nil {
		t.Fatalf("done: %v", err)
	}
	rec, err := l.Get(ctx, "p-1")
	if err != nil || rec.State != data.StateDone || rec.Attempts != 1 || rec.Resumed || rec.Seq != 7 || rec.Worker != "w1" {
		t.Errorf("record: got %+v, %v; want done, 1 attempt, not resumed, seq 7, by w1", rec, err)
	}
	if c.Revision != 1 {
		t.Errorf("claim after done: got revision %d, want 1 (one write)", c.Revision)
	}

	// A prepared claim whose key got a record meanwhile is lost, and the
	// record stays as it was.
	other := &data.Job{ID: "p-2", Subject: "job.x", Seq: 8, Attempt: 1}
	c = l.Prepare(other, "w1", "")
	if _, err := l.Claim(ctx, other, "w2"); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx, &c); !errors.Is(err, data.ErrClaimLost) {
		t.Errorf("lazy claim over another's: got %v, want ErrClaimLost", err)
	}
	if w, err := l.DoneAsync(&c, time.Millisecond); err != nil {
		t.Fatal(err)
	} else if err := w.Wait(ctx); !errors.Is(err, data.ErrClaimLost) {
		t.Errorf("done over another's claim: got %v, want ErrClaimLost", err)
	}
	if rec, err := l.Get(ctx, "p-2"); err != nil || rec.State != data.StateRunning || rec.Worker != "w2" {
		t.Errorf("record: got %+v, %v; want w2's claim untouched", rec, err)
	}

	// A redelivered job with no record: an earlier attempt may have run
	// without writing anything, so this one is resumed.
	again := &data.Job{ID: "p-3", Subject: "job.x", Seq: 9, Attempt: 2}
	c2, err := l.Claim(ctx, again, "w1")
	if err != nil || !c2.Record.Resumed || !again.Resumed || c2.Record.Attempts != 2 {
		t.Errorf("claim of attempt 2 without record: got %+v, %v; want resumed, 2 attempts", c2.Record, err)
	}
}

// churningKV loses every compare-and-set of a record, as under writers
// that never stop.
type churningKV struct{ jetstream.KeyValue }

func (churningKV) Update(context.Context, string, []byte, uint64) (uint64, error) {
	return 0, jetstream.ErrKeyRevisionMismatch
}

// A claim that keeps losing its compare-and-set gives up with an error that
// does not say that another run holds the job: no record was seen to, and
// a pool would take such an error for another run and drop the copy.
func TestLedgerClaimThatKeepsLosingIsNotClaimed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kv := newKV(t)
	job := &data.Job{ID: "churn", Subject: "job.x", Seq: 1, Attempt: 1}
	c, err := data.NewLedger(kv, time.Minute, nil).Claim(ctx, job, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if err := data.NewLedger(kv, time.Minute, nil).Retry(ctx, &c, time.Millisecond, "boom"); err != nil {
		t.Fatal(err)
	}
	_, err = data.NewLedger(churningKV{kv}, time.Minute, nil).Claim(ctx, job, "w2")
	if err == nil || errors.Is(err, data.ErrClaimed) || errors.Is(err, data.ErrAlreadyDone) {
		t.Errorf("claim that lost every compare-and-set: got %v, want an error that is neither ErrClaimed nor ErrAlreadyDone", err)
	}
}

// The very copy of a job that was dead-lettered (its stream sequence,
// stored before its record's first attempt), delivered again, is not
// claimed; a copy stored later under the same sequence, in a stream made
// anew, and a re-drive under a new sequence are.
func TestLedgerDoesNotClaimTheCopyThatWasDeadLettered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := data.NewLedger(newKV(t), time.Minute, nil)
	stored := time.Now().Add(-time.Minute)
	job := &data.Job{ID: "d", Subject: "job.x", Seq: 7, EnqueuedAt: stored}
	c, err := l.Claim(ctx, job, "w")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Fail(ctx, &c, time.Second, "card declined"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, &data.Job{ID: "d", Subject: "job.x", Seq: 7, EnqueuedAt: stored}, "w"); !errors.Is(err, data.ErrDeadLettered) {
		t.Errorf("claim of the dead-lettered copy again: got %v, want ErrDeadLettered", err)
	}
	later := &data.Job{ID: "d", Subject: "job.x", Seq: 7, EnqueuedAt: time.Now().Add(time.Hour)}
	if _, err := l.Claim(ctx, later, "w"); err != nil {
		t.Errorf("claim of a copy stored later under the same sequence: %v, want a claim", err)
	}
	redrive := &data.Job{ID: "d", Subject: "job.x", Seq: 9, EnqueuedAt: time.Now()}
	l2 := data.NewLedger(newKV(t), time.Minute, nil)
	c2, _ := l2.Claim(ctx, &data.Job{ID: "d", Subject: "job.x", Seq: 7, EnqueuedAt: stored}, "w")
	l2.Fail(ctx, &c2, time.Second, "boom")
	if _, err := l2.Claim(ctx, redrive, "w"); err != nil {
		t.Errorf("claim of a re-drive (a new sequence): %v, want a claim", err)
	}
}

// A done record under a SeqID is the job's only if it is not older than
// JOB: one from before JOB was made anew is another job's, which the claim
// takes the place of. Jobs with IDs of their own are not asked about, and a
// failed look-up fails the claim rather than take the job for done.
func TestLedgerTellsADoneRecordOfAnEarlierJobStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := data.NewLedger(newKV(t), time.Minute, nil)
	for _, id := range []string{data.SeqID(1), "own-id"} {
		c, err := l.Claim(ctx, &data.Job{ID: id, Subject: "job.x", Seq: 1, Attempt: 1}, "w1")
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Done(ctx, &c, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	created, lookErr, asked := time.Now(), error(nil), 0
	l.SetJobStreamCreated(func(context.Context) (time.Time, error) {
		asked++
		return created, lookErr
	})
	if _, err := l.Claim(ctx, &data.Job{ID: "own-id", Subject: "job.x", Seq: 1, Attempt: 1}, "w2"); !errors.Is(err, data.ErrAlreadyDone) || asked != 0 {
		t.Errorf("own-id: got %v after %d look-ups; want ErrAlreadyDone, none", err, asked)
	}
	lookErr = errors.New("no responders")
	if _, err := l.Claim(ctx, &data.Job{ID: data.SeqID(1), Subject: "job.x", Seq: 1, Attempt: 1}, "w2"); err == nil || errors.Is(err, data.ErrAlreadyDone) || !errors.Is(err, lookErr) {
		t.Errorf("look-up failing: got %v; want its error", err)
	}
	lookErr = nil
	c, err := l.Claim(ctx, &data.Job{ID: data.SeqID(1), Subject: "job.x", Seq: 1, Attempt: 1}, "w2")
	if err != nil || c.Record.State != data.StateRunning || c.Record.Attempts != 1 || c.Record.Worker != "w2" || c.Record.FirstAt.Before(created) {
		t.Errorf("record older than JOB: got %+v, %v; want a first claim of the new job", c.Record, err)
	}
	if err := l.Done(ctx, &c, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, &data.Job{ID: data.SeqID(1), Subject: "job.x", Seq: 1, Attempt: 2}, "w3"); !errors.Is(err, data.ErrAlreadyDone) {
		t.Errorf("its own done record: got %v, want ErrAlreadyDone", err)
	}
}
