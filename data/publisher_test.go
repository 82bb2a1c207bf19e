package data_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/server/servertest"
)

// publisherSetup starts a server with a stream T on t.>, and a Publisher
// with opts on a connection of its own.
func publisherSetup(t *testing.T, opts data.PublisherOptions) (*nats.Conn, jetstream.JetStream, *data.Publisher) {
	t.Helper()
	srv := servertest.Start(t)
	nc := servertest.Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	pub, err := data.NewPublisher(nc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	return nc, js, pub
}

// publish publishes a message with a Nats-Msg-Id of id to subject.
func publish(t *testing.T, pub *data.Publisher, subject, id string) *data.Ack {
	t.Helper()
	f, err := pub.Publish(subject, []byte("payload of "+id), id, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// outcome waits for f's outcome on its channels, as a caller of a
// jetstream.PubAckFuture does.
func outcome(t *testing.T, f jetstream.PubAckFuture, within time.Duration) (*jetstream.PubAck, error) {
	t.Helper()
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		return nil, err
	case <-time.After(within):
		t.Fatalf("no outcome within %v", within)
		return nil, nil
	}
}

func TestPublisherReportsWhatTheStreamStored(t *testing.T) {
	t.Parallel()
	_, js, pub := publisherSetup(t, data.PublisherOptions{Timeout: 5 * time.Second})
	first := publish(t, pub, "t.a", "one")
	again := publish(t, pub, "t.a", "one")
	ack, err := outcome(t, first, 5*time.Second)
	if err != nil || ack.Stream != "T" || ack.Sequence != 1 || ack.Duplicate {
		t.Fatalf("first publish: %+v, %v; want stored in T at 1", ack, err)
	}
	// Asked for after its outcome is in: the channels are filled then.
	<-again.Done()
	ack, err = outcome(t, again, time.Second)
	if err != nil || ack.Stream != "T" || ack.Sequence != 1 || !ack.Duplicate {
		t.Fatalf("publish again with the same ID: %+v, %v; want a duplicate of 1", ack, err)
	}
	if m := again.Msg(); m.Subject != "t.a" || m.Header.Get(nats.MsgIdHdr) != "one" || m.Reply != "" {
		t.Errorf("Msg() = %+v, want the message as given", m)
	}
	stored, err := js.Stream(context.Background(), "T")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := stored.Info(context.Background()); err != nil || info.State.Msgs != 1 {
		t.Errorf("T holds %v messages (%v), want 1", info.State.Msgs, err)
	}
}

func TestPublisherReportsTheStreamsRefusal(t *testing.T) {
	t.Parallel()
	_, _, pub := publisherSetup(t, data.PublisherOptions{Timeout: 5 * time.Second})
	f, err := pub.Publish("t.a", nil, "", nats.Header{nats.MsgIdHdr: {"x"}, jetstream.ExpectedLastSeqHeader: {"5"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = outcome(t, f, 5*time.Second)
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("got %v, want the stream's refusal (wrong last sequence)", err)
	}
	select {
	case ack := <-f.Ok():
		t.Errorf("Ok() received %+v for a refused publish", ack)
	default:
	}
}

// silent makes subject a subject that a subscriber takes and never answers,
// as a stream without a leader is.
func silent(t *testing.T, nc *nats.Conn, subject string) {
	t.Helper()
	sub, err := nc.Subscribe(subject, func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestPublisherFailsAPublishThatWaitedItsTimeout(t *testing.T) {
	t.Parallel()
	nc, _, pub := publisherSetup(t, data.PublisherOptions{Timeout: 200 * time.Millisecond})
	silent(t, nc, "silent")
	f := publish(t, pub, "silent", "x")
	if _, err := outcome(t, f, 10*time.Second); !errors.Is(err, jetstream.ErrAsyncPublishTimeout) || !errors.Is(err, data.ErrNoAck) {
		t.Fatalf("got %v, want ErrNoAck, an ErrAsyncPublishTimeout", err)
	}
}

func TestPublisherSendsAgainWhatNoStreamAnswered(t *testing.T) {
	t.Parallel()
	t.Run("fails once its retries are spent", func(t *testing.T) {
		t.Parallel()
		_, _, pub := publisherSetup(t, data.PublisherOptions{Timeout: 5 * time.Second, NoResponderRetries: 2})
		start := time.Now()
		f := publish(t, pub, "nobody.here", "x")
		if _, err := outcome(t, f, 10*time.Second); !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("got %v, want ErrNoResponders", err)
		}
		// Two waits of 250ms between the three sends.
		if took := time.Since(start); took < 500*time.Millisecond {
			t.Errorf("failed after %v, before its two retries could be sent", took)
		}
	})
	t.Run("stored once a stream takes the subject", func(t *testing.T) {
		t.Parallel()
		// Retries for 5s, room for a slow stream create.
		_, js, pub := publisherSetup(t, data.PublisherOptions{Timeout: 10 * time.Second, NoResponderRetries: 20})
		f := publish(t, pub, "later.a", "x")
		if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "LATER", Subjects: []string{"later.>"}}); err != nil {
			t.Fatal(err)
		}
		if ack, err := outcome(t, f, 10*time.Second); err != nil || ack.Stream != "LATER" {
			t.Fatalf("got %+v, %v; want stored in LATER on a retry", ack, err)
		}
	})
	t.Run("not sent again unless asked", func(t *testing.T) {
		t.Parallel()
		_, _, pub := publisherSetup(t, data.PublisherOptions{Timeout: 5 * time.Second})
		f := publish(t, pub, "nobody.here", "x")
		if _, err := outcome(t, f, 200*time.Millisecond); !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("got %v, want ErrNoResponders at once", err)
		}
	})
}

func TestPublisherBoundsThePublishesWaiting(t *testing.T) {
	t.Parallel()
	nc, _, pub := publisherSetup(t, data.PublisherOptions{Timeout: 300 * time.Millisecond, MaxPending: 2})
	silent(t, nc, "silent")
	var waiting []jetstream.PubAckFuture
	for i := range 2 {
		f, err := pub.Publish("silent", nil, "s"+string(rune('0'+i)), nil)
		if err != nil {
			t.Fatal(err)
		}
		waiting = append(waiting, f)
	}
	// A third waits for a slot. The first two time out first, freeing
	// theirs (the timeout is checked a few times per timeout), unless the
	// third's own wait, of one timeout, ends sooner.
	start := time.Now()
	f, err := pub.Publish("t.a", nil, "third", nil)
	switch {
	case errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		if took := time.Since(start); took < 250*time.Millisecond {
			t.Fatalf("refused after %v, without waiting for a slot", took)
		}
	case err != nil:
		t.Fatalf("third publish: %v", err)
	default:
		if ack, err := outcome(t, f, 5*time.Second); err != nil || ack.Stream != "T" {
			t.Fatalf("third publish: %+v, %v; want stored", ack, err)
		}
	}
	for _, f := range waiting {
		if _, err := outcome(t, f, 5*time.Second); !errors.Is(err, data.ErrNoAck) {
			t.Errorf("a silent publish: %v, want ErrNoAck", err)
		}
	}
	// Their slots are free again.
	for i := range 2 {
		f, err := pub.Publish("t.a", nil, "after"+string(rune('0'+i)), nil)
		if err != nil {
			t.Fatalf("publish after the slots were freed: %v", err)
		}
		if _, err := outcome(t, f, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPublisherCloseFailsWhatWaits(t *testing.T) {
	t.Parallel()
	nc, _, pub := publisherSetup(t, data.PublisherOptions{Timeout: time.Minute, MaxPending: 10})
	silent(t, nc, "silent")
	f := publish(t, pub, "silent", "x")
	pub.Close()
	if _, err := outcome(t, f, time.Second); !errors.Is(err, data.ErrPublisherClosed) {
		t.Fatalf("waiting publish: %v, want publisher closed", err)
	}
	if _, err := pub.Publish("t.a", nil, "y", nil); !errors.Is(err, data.ErrPublisherClosed) {
		t.Fatalf("publish after Close: %v, want publisher closed", err)
	}
	pub.Close() // again: nothing
}

// The connection is lost: what waits fails at once with ErrDisconnected,
// not after its timeout, and what is published once it is back is stored.
func TestPublisherFailsWhatWaitsWhenTheConnectionIsLost(t *testing.T) {
	t.Parallel()
	srv := servertest.StartListening(t)
	px := servertest.NewProxy(t, srv.ClientURL()[len("nats://"):])
	nc, err := nats.Connect(px.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	pub, err := data.NewPublisher(nc, data.PublisherOptions{Timeout: time.Minute, FailOnReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	silent(t, nc, "silent")
	f := publish(t, pub, "silent", "x")
	px.Cut()
	if _, err := outcome(t, f, 10*time.Second); !errors.Is(err, nats.ErrDisconnected) {
		t.Fatalf("got %v, want ErrDisconnected", err)
	}
	px.Restore()
	for deadline := time.Now().Add(10 * time.Second); !nc.IsConnected(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not connected again")
		}
	}
	f = publish(t, pub, "t.a", "after")
	if ack, err := outcome(t, f, 10*time.Second); err != nil || ack.Stream != "T" {
		t.Fatalf("publish once connected again: %+v, %v; want stored", ack, err)
	}
}
