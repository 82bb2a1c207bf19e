package data

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/server/servertest"
)

func TestReadPubAck(t *testing.T) {
	for _, tt := range []struct {
		name      string
		status    string
		data      string
		want      jetstream.PubAck
		wrongSeq  bool
		wantErr   error
		plainRead bool // read by hand, not as JSON
	}{
		{name: "stored", data: `{"stream":"KV_processed","seq":42}`, want: jetstream.PubAck{Stream: "KV_processed", Sequence: 42}, plainRead: true},
		{name: "duplicate, as the server writes it", data: `{"stream":"JOB","seq":9,"duplicate": true}`, want: jetstream.PubAck{Stream: "JOB", Sequence: 9, Duplicate: true}, plainRead: true},
		{name: "duplicate, other spacing", data: `{"stream":"JOB","seq":9,"duplicate":true}`, want: jetstream.PubAck{Stream: "JOB", Sequence: 9, Duplicate: true}},
		{name: "with domain", data: `{"stream":"KV_processed","domain":"hub","seq":7}`, want: jetstream.PubAck{Stream: "KV_processed", Domain: "hub", Sequence: 7}, plainRead: true},
		{name: "duplicate with domain", data: `{"stream":"JOB","domain":"hub","seq":7,"duplicate": true}`, want: jetstream.PubAck{Stream: "JOB", Domain: "hub", Sequence: 7, Duplicate: true}, plainRead: true},
		{name: "empty domain", data: `{"stream":"JOB","domain":"","seq":7}`, want: jetstream.PubAck{Stream: "JOB", Sequence: 7}, plainRead: true},
		{name: "escaped stream name", data: `{"stream":"A\u0026B","seq":3}`, want: jetstream.PubAck{Stream: "A&B", Sequence: 3}},
		{name: "fields in another order", data: `{"seq":5,"stream":"JOB"}`, want: jetstream.PubAck{Stream: "JOB", Sequence: 5}},
		{name: "batch", data: `{"stream":"JOB","seq":5,"batch":"b","count":2}`, want: jetstream.PubAck{Stream: "JOB", Sequence: 5}},
		{name: "wrong last sequence", data: `{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 5"},"stream":"KV_processed","seq":0}`, wrongSeq: true},
		{name: "an error with a sequence", data: `{"stream":"JOB","seq":4,"error":{"code":503,"err_code":10077,"description":"maximum bytes exceeded"}}`, wantErr: &jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum bytes exceeded"}},
		{name: "no responders", status: "503", wantErr: nats.ErrNoResponders},
		{name: "other status", status: "408"},
		{name: "garbage", data: `not json`},
		{name: "no sequence", data: `{"stream":"KV_processed"}`},
		{name: "sequence 0", data: `{"stream":"KV_processed","seq":0}`},
		{name: "no stream", data: `{"seq":3}`},
		{name: "cut short", data: `{"stream":"JOB","seq":3`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := &nats.Msg{Data: []byte(tt.data), Header: nats.Header{}}
			if tt.status != "" {
				m.Header.Set("Status", tt.status)
			}
			ack, err := readPubAck(m, "JOB")
			switch {
			case tt.want.Sequence != 0:
				if err != nil || ack != tt.want {
					t.Errorf("got %+v, %v; want %+v", ack, err, tt.want)
				}
				if _, ok := readPlainAck(m.Data, ""); ok != tt.plainRead {
					t.Errorf("read by hand: %v, want %v", ok, tt.plainRead)
				}
			case tt.wrongSeq:
				if !isWrongLastSeq(err) {
					t.Errorf("got %+v, %v; want a wrong last sequence error", ack, err)
				}
			case tt.wantErr != nil:
				var apiErr *jetstream.APIError
				if want, ok := tt.wantErr.(*jetstream.APIError); ok {
					if !errors.As(err, &apiErr) || *apiErr != *want {
						t.Errorf("got %+v, %v; want %v", ack, err, tt.wantErr)
					}
				} else if !errors.Is(err, tt.wantErr) {
					t.Errorf("got %v, want %v", err, tt.wantErr)
				}
			default:
				if err == nil || isWrongLastSeq(err) {
					t.Errorf("got %+v, %v; want a plain error", ack, err)
				}
			}
		})
	}
}

// The stream name read by hand is the last one's, not a new string per ack.
func TestReadPubAckKeepsTheStreamName(t *testing.T) {
	m := &nats.Msg{Data: []byte(`{"stream":"JOB","seq":12}`)}
	if allocs := testing.AllocsPerRun(100, func() {
		if _, err := readPubAck(m, "JOB"); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("%v allocations per ack, want 0", allocs)
	}
	if ack, err := readPubAck(m, "OTHER"); err != nil || ack.Stream != "JOB" {
		t.Errorf("got %+v, %v; want stream JOB", ack, err)
	}
}

func TestWrongLastSeqOfAnyBucket(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{&jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, true},
		{fmt.Errorf("claim: %w", &jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant}), true}, // a replicated bucket
		{&jetstream.APIError{ErrorCode: 10077}, false},
		{ErrNoAck, false},
	} {
		if got := isWrongLastSeq(tt.err); got != tt.want {
			t.Errorf("isWrongLastSeq(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// A Publisher left open on a connection that closes ends by itself: what
// waits fails, and its goroutine ends.
func TestPublisherEndsWithItsConnection(t *testing.T) {
	t.Parallel()
	nc := servertest.Connect(t, servertest.Start(t))
	p, err := NewPublisher(nc, PublisherOptions{Timeout: time.Minute, FailOnReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := nc.Subscribe("silent", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	a, err := p.Publish("silent", nil, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	select {
	case <-p.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the publisher still runs after its connection closed")
	}
	if _, err := a.Result(); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("waiting publish: %v, want ErrConnectionClosed", err)
	}
	if _, err := p.Publish("t.a", nil, "", nil); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("publish on a closed connection: %v, want ErrConnectionClosed", err)
	}
	p.Close() // after: nothing to end
}

// Many publishes to a stream, to nobody (503, sent again), and to a silent
// subscriber (timed out), from several goroutines, then Close or the
// connection closing in the middle: every Ack resolves, once (a second
// would panic), no slot is left taken, nothing waits.
func TestPublisherUnderLoadEndsCleanly(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"close", "conn"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			srv := servertest.Start(t)
			nc := servertest.Connect(t, srv)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
				t.Fatal(err)
			}
			sub, err := nc.Subscribe("silent", func(*nats.Msg) {})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			p, err := NewPublisher(nc, PublisherOptions{Timeout: 150 * time.Millisecond, MaxPending: 64, FailOnReconnect: true, NoResponderRetries: 2})
			if err != nil {
				t.Fatal(err)
			}
			var (
				mu   sync.Mutex
				acks []*Ack
				wg   sync.WaitGroup
			)
			subjects := []string{"t.a", "nobody", "silent"}
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 3000 {
						a, err := p.Publish(subjects[(g+i)%3], []byte("x"), strconv.Itoa(g)+"-"+strconv.Itoa(i), nil)
						if err != nil {
							continue
						}
						_ = a.Msg()
						mu.Lock()
						acks = append(acks, a)
						mu.Unlock()
					}
				}()
			}
			time.Sleep(1500 * time.Millisecond)
			if end == "close" {
				p.Close()
			} else {
				nc.Close()
			}
			wg.Wait()
			time.Sleep(600 * time.Millisecond) // any AfterFunc resends
			for _, a := range acks {
				select {
				case <-a.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("an Ack never resolved")
				}
			}
			p.mu.Lock()
			waiting, taken := len(p.wait), 0
			if p.slots != nil {
				taken = len(p.slots)
			}
			p.mu.Unlock()
			if waiting != 0 || taken != 0 {
				t.Errorf("after the end: %d waiting, %d slots taken; want 0, 0", waiting, taken)
			}
			p.Close()
			if len(acks) == 0 {
				t.Fatal("no publish was sent")
			}
		})
	}
}
