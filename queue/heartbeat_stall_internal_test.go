package queue

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// hangingDeletes makes the ledger's key deletes hang until the caller gives
// up while hang is set, as when the client is cut off from the server or
// the answer is lost: collect's DeleteLease of an ended lease among them.
type hangingDeletes struct {
	jetstream.KeyValue
	hang *atomic.Bool
}

func (k hangingDeletes) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	if k.hang.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return k.KeyValue.Delete(ctx, key, opts...)
}

// hangingLeaseWrites makes the pool's lease writes hang until the caller
// gives up while hang is set (a write whose answer does not come). Each
// write that hangs is told on entered, if set and it has room.
type hangingLeaseWrites struct {
	jetstream.JetStream
	hang    *atomic.Bool
	entered chan struct{}
}

func (j hangingLeaseWrites) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if j.hang.Load() && strings.Contains(m.Subject, "."+data.LeasePrefix) {
		select {
		case j.entered <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return j.JetStream.PublishMsg(ctx, m, opts...)
}

// A running job keeps its lease or claim while the ledger hangs on other
// business: the heartbeat loop, which sends its InProgress and gives up a
// lease or claim a sixth of the ack wait before it ends, waits on nothing
// but its renewals, each bounded by that moment. Collecting ended leases
// runs beside it, and a new batch's lease write, which the renewal waits
// for, is bounded by the same moment. Otherwise the lease ran out while the
// handler still ran, and a second pool ran the job beside the first.
func TestHeartbeatsGoOnWhileTheLedgerHangs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		claimed bool // J has a record, so it runs on a claim of its own
		via     string
	}{
		{"lease/collect deletes an ended lease", false, "collect"},
		{"claim/collect deletes an ended lease", true, "collect"},
		{"lease/a new batch's lease write hangs", false, "add"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			obj := objectsWith(t, Config{AckWait: 3 * time.Second, MaxDeliver: 20, Workers: 1, Prefetch: 1,
				RetryBackoff: []time.Duration{10 * time.Millisecond}, FetchWait: 200 * time.Millisecond})
			if tt.claimed {
				failedBefore(t, obj, "J")
			}
			var hang atomic.Bool
			switch tt.via {
			case "collect":
				// A pool that crashed long ago left an empty lease: A's
				// collect deletes it, and that delete does not answer.
				l := data.NewLedger(obj.Ledger, obj.Config.lease(), obj.JS)
				t.Cleanup(l.Close)
				snap, err := l.Check(ctx, nil, "")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := l.WriteLease(ctx, "crashed", data.Lease{Worker: "gone", Until: time.Now().Add(-time.Hour)}, snap.LeaseSeq); err != nil {
					t.Fatal(err)
				}
			}

			var aRunning atomic.Bool
			aStarted := make(chan struct{})
			var startedOnce atomic.Bool
			a := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
				if job.ID != "J" {
					<-ctx.Done()
					return ctx.Err()
				}
				aRunning.Store(true)
				defer aRunning.Store(false)
				if startedOnce.CompareAndSwap(false, true) {
					close(aStarted)
				}
				select {
				case <-ctx.Done(): // a well-behaved handler: it stops when told
					return ctx.Err()
				case <-time.After(20 * time.Second):
					return nil
				}
			}), servertest.Logger(t))
			switch tt.via {
			case "collect":
				hang.Store(true)
				a.ledger = data.NewLedger(hangingDeletes{KeyValue: obj.Ledger, hang: &hang}, obj.Config.lease(), obj.JS)
			case "add":
				a.ledger = data.NewLedger(obj.Ledger, obj.Config.lease(), hangingLeaseWrites{JetStream: obj.JS, hang: &hang})
			}
			startPool(t, a)
			t.Cleanup(func() { hang.Store(false) }) // before A's Stop
			prod := NewProducer(obj.JS, obj.Config)
			if _, err := prod.Enqueue(ctx, "job.x", []byte("x"), EnqueueOptions{ID: "J"}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-aStarted:
			case <-time.After(10 * time.Second):
				t.Fatal("pool A never ran J")
			}
			switch tt.via {
			case "collect":
				a.fetchCancel() // A takes no more jobs: J's redelivery goes to B
			case "add":
				// A's next batch (K) is checked, and its lease write hangs.
				// With K, A has no room left: J's redelivery goes to B.
				hang.Store(true)
				if _, err := prod.Enqueue(ctx, "job.x", []byte("k"), EnqueueOptions{ID: "K"}); err != nil {
					t.Fatal(err)
				}
			}

			if bRunsJBesideA(t, obj, &aRunning) {
				t.Fatal("pool B ran J while pool A's handler of J still ran: A's heartbeat loop was stuck on ledger I/O that is not bounded by the give-up time, so J got no InProgress and its lease/claim ran out without A cancelling its handler")
			}
		})
	}
}

// bRunsJBesideA starts pool B on obj and reports whether it ran job J while
// pool A's handler of J still ran (aRunning); false if B did not run J in
// 14s, as when A kept J alive or gave it up in time.
func bRunsJBesideA(t *testing.T, obj *Objects, aRunning *atomic.Bool) bool {
	t.Helper()
	var overlap atomic.Bool
	bRan := make(chan struct{}, 16)
	b := NewPool(obj, handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		if job.ID != "J" {
			return nil
		}
		if aRunning.Load() {
			overlap.Store(true)
		}
		bRan <- struct{}{}
		return nil
	}), servertest.Logger(t))
	startPool(t, b)
	select {
	case <-bRan:
		return overlap.Load()
	case <-time.After(14 * time.Second):
		return false
	}
}
