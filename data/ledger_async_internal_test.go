package data

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/server/servertest"
)

// A completion write whose answer was lost may have landed: writing it again
// finds the record there, and Again takes it for its own, but not another
// holder's record.
func TestAgainTakesItsOwnLandedWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kv := bucket(t)
	l := NewLedger(kv, time.Minute, nil) // no async writes: DoneAsync only prepares
	for _, tt := range []struct {
		name   string
		landed func(pw *PendingWrite) []byte
		want   error
	}{
		{"its own write landed", func(pw *PendingWrite) []byte { return pw.next.encode() }, nil},
		{"another holder's record", func(pw *PendingWrite) []byte {
			other := pw.next
			other.Worker = "other"
			return other.encode()
		}, ErrClaimLost},
	} {
		t.Run(tt.name, func(t *testing.T) {
			job := &Job{ID: "J-" + tt.name[:3], Subject: "job.x", Seq: 1, Attempt: 1}
			c := l.Prepare(job, "w", "lease")
			pw, err := l.DoneAsync(&c, time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			rev, err := kv.Create(ctx, c.Key, tt.landed(pw))
			if err != nil {
				t.Fatal(err)
			}
			err = pw.Again(ctx)
			if !errors.Is(err, tt.want) || (tt.want != nil) == (err == nil) {
				t.Fatalf("Again: got %v, want %v", err, tt.want)
			}
			if tt.want == nil && (c.Revision != rev || c.Record.State != StateDone) {
				t.Errorf("claim after Again: revision %d, state %s; want %d, done", c.Revision, c.Record.State, rev)
			}
		})
	}
}

// A claim renewal whose answer was lost may have landed: the next renewal,
// or the done record, writes over it, rather than take it for another
// holder's claim. Also for an ID that is not UTF-8, which reads back with
// U+FFFD in place of its bytes: its record, so read, was once taken for
// another's, and the job cancelled, or run again after it succeeded.
func TestRenewWritesOverItsOwnLandedRenewal(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"J", "caf\xe9"} {
		t.Run(strconv.Quote(id), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			kv := bucket(t)
			l := NewLedger(kv, time.Minute, nil)
			c, err := l.Claim(ctx, &Job{ID: id, Subject: "job.x", Seq: 1, Attempt: 1}, "w")
			if err != nil {
				t.Fatal(err)
			}
			land := func() {
				t.Helper()
				landed := c.Record
				landed.LeaseUntil = landed.LeaseUntil.Add(time.Second)
				if _, err := kv.Update(ctx, c.Key, landed.encode(), c.Revision); err != nil {
					t.Fatal(err)
				}
			}
			land()
			if err := l.Renew(ctx, &c); err != nil {
				t.Fatalf("Renew after its own renewal landed unanswered: %v, want it written over", err)
			}
			land()
			if err := l.Done(ctx, &c, time.Millisecond); err != nil {
				t.Fatalf("Done after its own renewal landed unanswered: %v, want it written over", err)
			}
			c, err = l.Claim(ctx, &Job{ID: id, Subject: "job.x", Seq: 2, Attempt: 1}, "w")
			if !errors.Is(err, ErrAlreadyDone) {
				t.Fatalf("claim after done: %v, want ErrAlreadyDone", err)
			}
			if _, err := l.Get(ctx, id); err != nil {
				t.Fatal(err)
			}
		})
	}
	ctx := context.Background()
	kv := bucket(t)
	l := NewLedger(kv, time.Minute, nil)
	c, err := l.Claim(ctx, &Job{ID: "J", Subject: "job.x", Seq: 1, Attempt: 1}, "w")
	if err != nil {
		t.Fatal(err)
	}
	other := c.Record
	other.Worker = "other"
	if _, err := kv.Update(ctx, c.Key, other.encode(), c.Revision); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx, &c); !errors.Is(err, ErrClaimLost) {
		t.Errorf("Renew over another worker's claim: %v, want ErrClaimLost", err)
	}
}

// bucket starts a server and creates the processed bucket on it.
func bucket(t *testing.T) jetstream.KeyValue {
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
