package queue_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server"
	"github.com/jobq/jobq/server/servertest"
)

func waitStatus(t *testing.T, nc *nats.Conn, want nats.Status) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); nc.Status() != want; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("connection is %v, want %v", nc.Status(), want)
		}
	}
}

// cutConnection connects to srv through a proxy that can cut the
// connection, which then reconnects for good once restored.
func cutConnection(t *testing.T, srv *server.Server) (*servertest.Proxy, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	px := servertest.NewProxy(t, srv.ClientURL()[len("nats://"):])
	nc, js := connectThrough(t, px)
	return px, nc, js
}

// connectThrough connects through px, for good: it reconnects at once
// whenever px takes connections again.
func connectThrough(t *testing.T, px *servertest.Proxy) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(px.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// poolOnCutConnection provisions cfg on a server of its own, b, and binds
// the objects again over a connection that px can cut, bp, for a pool.
func poolOnCutConnection(t *testing.T, cfg queue.Config) (b, bp *testBundle, px *servertest.Proxy, pnc *nats.Conn) {
	t.Helper()
	srv := servertest.StartListening(t)
	b = setupOn(t, srv, cfg)
	px, pnc, pjs := cutConnection(t, srv)
	pobj, err := b.obj.Bind(context.Background(), pjs)
	if err != nil {
		t.Fatal(err)
	}
	c := *b
	c.obj = pobj
	return b, &c, px, pnc
}

// nextOnItsOwn opens JOB's objects over js, as jobq next does, and runs
// it on job a1, stored at sequence 1, with a held handler.
func nextOnItsOwn(t *testing.T, b *testBundle, js jetstream.JetStream, afterLookUp func()) (*heldRun, <-chan error) {
	t.Helper()
	obj, err := queue.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	obj.Config.NoLedger = b.cfg.NoLedger // jobq next --no-ledger
	if afterLookUp != nil {
		queue.AfterJOBLookUp(obj, afterLookUp)
	}
	b.enqueue(t, "job.a", "a1", "x") // seq 1
	return nextHeld(t, obj)
}

// A pool on a server of its own (jobq serve --server) loses its connection
// while JOB is deleted and made anew. The job it holds finishes meanwhile:
// its ack, checked against the JOB last looked up (the look-ups fail while
// the connection is down), goes into nats.go's reconnect buffer, and is
// sent once the connection is back, before any look-up: it takes the new
// JOB's job at its sequence from the worker that holds it.
func TestEarlierJOBsAckIsNotBufferedWhileDisconnected(t *testing.T) {
	t.Parallel()
	cfg := queue.Config{Workers: 1, Prefetch: 1, NoLedger: true}
	b, bp, px, pnc := poolOnCutConnection(t, cfg)
	h := newHeldRun()
	bp.startPool(t, h)
	b.enqueue(t, "job.a", "a1", "x") // seq 1
	<-h.started

	px.Cut()
	waitStatus(t, pnc, nats.RECONNECTING)
	b2 := remakeWithB1HeldElsewhere(t, b, cfg)
	close(h.release)
	<-h.returned
	time.Sleep(2500 * time.Millisecond) // the ack, and a few failed look-ups
	px.Restore()
	waitStatus(t, pnc, nats.CONNECTED)
	keptHeld(t, b2, 1)
}

// The same for jobq next, whose look-up before the ack fails while the
// connection is down: the ack is sent, into the reconnect buffer.
func TestNextsEarlierJOBsAckIsNotBufferedWhileDisconnected(t *testing.T) {
	t.Parallel()
	cfg := queue.Config{NoLedger: true}
	srv := servertest.StartListening(t)
	b := setupOn(t, srv, cfg)
	px, pnc, pjs := cutConnection(t, srv)
	h, done := nextOnItsOwn(t, b, pjs, nil)
	px.Cut()
	waitStatus(t, pnc, nats.RECONNECTING)
	b2 := remakeWithB1HeldElsewhere(t, b, cfg)
	close(h.release)
	if err := <-done; err != nil {
		t.Logf("next: %v", err)
	}
	px.Restore()
	waitStatus(t, pnc, nats.CONNECTED)
	keptHeld(t, b2, 1)
}

// The connection of jobq next goes down just after its look-up of JOB
// before the ack was answered, and JOB is made anew during the outage.
// Checked before the look-up alone, the connection was up: the ack went
// into the reconnect buffer, out on reconnect, and took the new JOB's job
// at its sequence from the worker that held it, while jobq next said it
// was acked.
func TestNextsAckIsNotBufferedWhenTheConnectionDropsAfterItsLookUp(t *testing.T) {
	for _, noLedger := range []bool{true, false} {
		t.Run(fmt.Sprintf("no ledger %v", noLedger), func(t *testing.T) {
			t.Parallel()
			cfg := queue.Config{NoLedger: noLedger}
			srv := servertest.StartListening(t)
			b := setupOn(t, srv, cfg)
			px := servertest.NewProxy(t, srv.ClientURL()[len("nats://"):])
			var armed atomic.Bool
			infoCut := make(chan struct{})
			px.Watch(nil, func(chunk []byte) { // once armed, cut after JOB's look-up is answered
				if bytes.Contains(chunk, []byte("stream_info_response")) && armed.CompareAndSwap(true, false) {
					px.Cut()
					close(infoCut)
				}
			})
			pnc, pjs := connectThrough(t, px)
			noticed := make(chan struct{}) // the client learned of the cut
			var once sync.Once
			pnc.SetDisconnectErrHandler(func(*nats.Conn, error) { once.Do(func() { close(noticed) }) })
			// The proxy cuts once the answer went through, so the
			// client may read it first: it waits for the cut, and to
			// learn of it, before it looks at its connection again,
			// which is what is tested. (Should the client learn of a
			// cut only after that look, the ack goes out into it; see
			// the README's list of what is left.)
			h, done := nextOnItsOwn(t, b, pjs, func() {
				for _, c := range []<-chan struct{}{infoCut, noticed} {
					select {
					case <-c:
					case <-time.After(20 * time.Second):
						t.Error("no cut after JOB's look-up, or the client did not learn of it")
						return
					}
				}
			})
			armed.Store(true)
			close(h.release)
			select {
			case <-infoCut:
			case <-time.After(20 * time.Second):
				t.Fatal("jobq next did not look JOB up before its ack")
			}
			b2 := remakeWithB1HeldElsewhere(t, b, cfg) // during the outage
			px.Restore()
			waitStatus(t, pnc, nats.CONNECTED)
			if err := <-done; err == nil || !strings.Contains(err.Error(), "not acknowledged") {
				t.Errorf("next: %v; want its job ran, and was not acknowledged", err)
			}
			keptHeld(t, b2, 1)
		})
	}
}

// A pool's connection goes down for most of the ack wait while a job runs.
// Its heartbeats go out still, into the reconnect buffer, to reset the ack
// wait once the connection is back; held back, they let the ack wait run
// out, and the server delivered the running job to another pool, which
// ran it beside the first.
func TestShortOutageDoesNotRedeliverARunningJob(t *testing.T) {
	t.Parallel()
	cfg := queue.Config{Workers: 1, Prefetch: 1, NoLedger: true, AckWait: 5 * time.Second}
	b, bp, px, pnc := poolOnCutConnection(t, cfg)
	beats := make(chan time.Time, 64)
	sub, err := b.nc.Subscribe("$JS.ACK.>", func(m *nats.Msg) {
		if string(m.Data) == "+WPI" {
			beats <- time.Now()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	c := newCounter()
	long := c.wrap(func(ctx context.Context, _ *data.Job) error {
		select {
		case <-time.After(10 * time.Second): // two ack waits
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	bp.startPool(t, long)
	b.enqueue(t, "job.long", "long-1", "x")
	waitFor(t, 10*time.Second, func() error {
		if c.get("long-1") == 0 {
			return context.DeadlineExceeded
		}
		return nil
	})
	b.startPool(t, long) // another process's pool: a redelivery reaches it
	for len(beats) > 0 {
		<-beats
	}
	<-beats // a heartbeat just went out: cut right after it
	px.Cut()
	time.Sleep(4 * time.Second) // 0.8 ack waits
	px.Restore()
	waitStatus(t, pnc, nats.CONNECTED)
	time.Sleep(10 * time.Second)
	if got := c.get("long-1"); got != 1 || c.overlap != 0 {
		t.Errorf("job ran %d times, %d overlapping, after an outage shorter than the ack wait; want 1 and 0", got, c.overlap)
	}
}

// jobq next's look-ups of JOB before its ack go unanswered, the connection
// up, while JOB is made anew: with nothing to tell whether its job is of the
// JOB there is now, its ack is not sent, and jobq next says so. Sent, by
// what it knew at its start, it took the new JOB's job at its sequence from
// the worker that holds it. Not sent, and not told, jobq next said that its
// job ran, as if acked.
func TestNextDoesNotAckWhenItCannotLookUpJOB(t *testing.T) {
	t.Parallel()
	cfg := queue.Config{NoLedger: true}
	srv := servertest.StartListening(t)
	b := setupOn(t, srv, cfg)
	px := servertest.NewProxy(t, srv.ClientURL()[len("nats://"):])
	var blackhole atomic.Bool
	px.Watch(func(chunk []byte) bool {
		return !blackhole.Load() || !bytes.Contains(chunk, []byte("$JS.API.STREAM.INFO.JOB"))
	}, nil)
	_, js := connectThrough(t, px)
	h, done := nextOnItsOwn(t, b, js, nil)
	b2 := remakeWithB1HeldElsewhere(t, b, cfg)
	blackhole.Store(true) // JOB's look-ups go unanswered from here
	close(h.release)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "was not acknowledged") {
		t.Errorf("next: %v; want its job reported not acknowledged", err)
	}
	keptHeld(t, b2, 1)
}
