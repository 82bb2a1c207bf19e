package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// hookKV calls after once, with the key, when a call to op (get, create
// or update) on key returns; the sweeping pool's ledger goes through it.
type hookKV struct {
	jetstream.KeyValue
	key, op string
	once    *sync.Once
	after   func()
}

func (kv hookKV) hook(key, op string) {
	if key == kv.key && op == kv.op {
		kv.once.Do(kv.after)
	}
}

func (kv hookKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := kv.KeyValue.Get(ctx, key)
	kv.hook(key, "get")
	return e, err
}

func (kv hookKV) Create(ctx context.Context, key string, v []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := kv.KeyValue.Create(ctx, key, v, opts...)
	kv.hook(key, "create")
	return rev, err
}

func (kv hookKV) Update(ctx context.Context, key string, v []byte, last uint64) (uint64, error) {
	rev, err := kv.KeyValue.Update(ctx, key, v, last)
	kv.hook(key, "update")
	return rev, err
}

// On a replicated bucket (pools claim each job), a job whose last delivery
// a pool still holds, unclaimed (waiting in its claim queue), when the
// server gives up on it: a change of WORKER's leader went by an older
// time than the pool's InProgress (see
// TestWorkerLeaderChangeRedeliversAJobThatWaitedInJOB), and under leader
// step-downs every 400ms a job's three deliveries went so within a second
// (TestLeaderStepDownsOnAClusterKeepEveryJobOnce). Here the holder sends
// no InProgress at all, which the server takes the same way. The sweep of
// another pool moves the job to DLQ, while the holder claims it at some
// moment:
//
//   - claimed right after the sweep read the ledger (no record then): the
//     holder runs the job and records it done. The sweep must leave it to
//     the holder. It stored the dead letter and removed the job from JOB
//     before: the job was done and in DLQ, a failure that never happened.
//   - claimed after the sweep decided: the holder must not run it.
func TestSweepAndAHolderOfAnExhaustedJobAgreeOnItsFate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		op     string // the sweep's ledger call on the job's key after which the holder claims
		runs   bool   // whether the holder's claim wins
		inDLQ  int
		record data.State
	}{
		{name: "claimed after the sweep's read", op: "get", runs: true, inDLQ: 0, record: data.StateDone},
		{name: "claimed after the sweep's write", op: "create", runs: false, inDLQ: 1, record: data.StateFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cfg := queue.Config{Replicas: 3, MaxDeliver: 1, AckWait: time.Second}
			objs := onCluster(t, servertest.StartCluster(t, 3), cfg)
			b := &testBundle{js: objs[0].JS, obj: objs[0], prod: queue.NewProducer(objs[0].JS, objs[0].Config), cfg: objs[0].Config}
			b.enqueue(t, "job.x", "E", "e")

			// The holder: a pool on node 1 that fetched E, its one delivery,
			// which the server gives up on.
			msg, job := fetchAndOutlive(t, objs[1].Worker, "E")

			holder := data.NewLedger(objs[1].Ledger, cfg.AckWait*2/3, nil)
			// The sweeper: a pool on node 2, which sweeps at start.
			claim, claimErr := sweepAsHolderClaims(t, objs[2], tc.op, holder, job)
			if tc.runs {
				if claimErr != nil {
					t.Fatalf("holder's claim: %v", claimErr)
				}
				// It runs the job (its effect happens) and records it done.
				if err := holder.Done(ctx, &claim, time.Millisecond); err != nil {
					t.Fatalf("holder's done record: %v", err)
				}
				_ = msg.Ack()
			} else if !errors.Is(claimErr, data.ErrAwaitingDeadLetter) && !errors.Is(claimErr, data.ErrDeadLettered) {
				t.Fatalf("holder's claim after the sweep's decision: got %v, want it refused (awaiting its dead letter, or dead-lettered)", claimErr)
			}

			// Once E is out of JOB (the sweep that leaves it to its holder
			// removes it at a later sweep, done), E is in DLQ only if it failed.
			waitFor(t, 20*time.Second, func() error {
				st, err := queue.ReadStatus(ctx, b.obj)
				if err != nil {
					return err
				}
				if st.Stream.Messages != 0 {
					return fmt.Errorf("JOB holds %d jobs", st.Stream.Messages)
				}
				return nil
			})
			di, err := objs[0].Dead.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rec := b.record(t, "E")
			if int(di.State.Msgs) != tc.inDLQ || rec.State != tc.record {
				t.Errorf("E is %s, with %d dead letter(s) in DLQ; want %s and %d (the holder's claim: %v)", rec.State, di.State.Msgs, tc.record, tc.inDLQ, claimErr)
			}
		})
	}
}

// The same on one node, where pools lease the jobs without a record but
// claim those with one: a job that failed once (its record says retrying),
// whose last delivery a pool still holds, unclaimed, when the server gives
// up on it. The holder claims it right after the sweep read its record,
// runs it and records it done: the sweep must leave it to the holder. It
// stored the dead letter and removed the job from JOB: the job was done
// and in DLQ.
func TestSweepLeavesAnExhaustedJobWithARecordToItsHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := queue.Config{MaxDeliver: 1, AckWait: time.Second}
	b := setup(t, cfg)
	b.enqueue(t, "job.x", "E", "e")
	msg, job := fetchAndOutlive(t, b.obj.Worker, "E")
	holder := data.NewLedger(b.obj.Ledger, cfg.AckWait*2/3, nil)
	first, err := holder.Claim(ctx, job, "earlier")
	if err == nil {
		err = holder.Retry(ctx, &first, time.Millisecond, "boom") // an earlier attempt failed
	}
	if err != nil {
		t.Fatal(err)
	}
	claim, claimErr := sweepAsHolderClaims(t, b.obj, "get", holder, job)
	if claimErr != nil {
		t.Fatalf("holder's claim: %v", claimErr)
	}
	if err := holder.Done(ctx, &claim, time.Millisecond); err != nil {
		t.Fatalf("holder's done record: %v", err)
	}
	_ = msg.Ack()
	waitFor(t, 20*time.Second, func() error {
		st, err := queue.ReadStatus(ctx, b.obj)
		if err != nil {
			return err
		}
		if st.Stream.Messages != 0 {
			return fmt.Errorf("JOB holds %d jobs", st.Stream.Messages)
		}
		return nil
	})
	di, err := b.obj.Dead.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rec := b.record(t, "E"); di.State.Msgs != 0 || rec.State != data.StateDone {
		t.Errorf("E is %s, with %d dead letter(s) in DLQ; want done and 0", rec.State, di.State.Msgs)
	}
}

// fetchAndOutlive fetches job id's one delivery from worker (max deliver
// 1), and waits until the server gives up on it, unacked: worker holds it
// pending no more.
func fetchAndOutlive(t *testing.T, worker jetstream.Consumer, id string) (jetstream.Msg, *data.Job) {
	t.Helper()
	// A cluster just made may answer a first pull with no job (its
	// WORKER's leader still settling): pull again, for up to 20s.
	var msg jetstream.Msg
	var why []error
	for deadline := time.Now().Add(20 * time.Second); msg == nil && time.Now().Before(deadline); {
		batch, err := worker.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			why = append(why, err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for m := range batch.Messages() {
			msg = m
		}
		if msg == nil {
			why = append(why, fmt.Errorf("no job: %v", batch.Error()))
		}
	}
	if msg == nil {
		t.Fatalf("fetched no job in 20s: %v", why)
	}
	meta, err := msg.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() error {
		info, err := worker.Info(context.Background())
		if err != nil {
			return err
		}
		if info.NumAckPending != 0 {
			return fmt.Errorf("WORKER holds %d jobs pending", info.NumAckPending)
		}
		return nil
	})
	return msg, &data.Job{ID: id, Subject: msg.Subject(), Seq: meta.Sequence.Stream, Attempt: int(meta.NumDelivered), EnqueuedAt: meta.Timestamp, Payload: msg.Data()}
}

// sweepAsHolderClaims starts a pool on obj, which sweeps at start, and has
// holder claim job right after the sweep's op (get, create or update) on
// job's key; it returns the holder's claim.
func sweepAsHolderClaims(t *testing.T, obj *queue.Objects, op string, holder *data.Ledger, job *data.Job) (data.Claim, error) {
	t.Helper()
	var claim data.Claim
	var claimErr error
	claimed := make(chan struct{})
	o := *obj
	o.Ledger = hookKV{KeyValue: obj.Ledger, key: data.Key(job.ID), op: op, once: new(sync.Once), after: func() {
		defer close(claimed)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		claim, claimErr = holder.Claim(ctx, job, "holder")
	}}
	(&testBundle{obj: &o}).startPool(t, handlers.HandlerFunc(ok))
	select {
	case <-claimed:
	case <-time.After(20 * time.Second):
		t.Fatalf("the sweep never read %s's record", job.ID)
	}
	return claim, claimErr
}
