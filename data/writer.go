package data

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// writeTimeout bounds the wait for one async write's acknowledgement.
const writeTimeout = 10 * time.Second

// errWriteTimeout: no acknowledgement within writeTimeout. The write may
// or may not be stored; callers retry synchronously, which decides.
var errWriteTimeout = errors.New("no acknowledgement for the ledger write")

// writer publishes the ledger's compare-and-set writes without waiting and
// matches their acknowledgements: one reply subscription, a counter for
// reply subjects, and the acknowledgement read by hand. It does what
// jetstream's PublishMsgAsync does for these writes with a third of its
// allocations, and no timer or JSON decoding per write, which on the hot
// path (one write per job) shows in throughput.
type writer struct {
	nc     *nats.Conn
	prefix string // reply subjects are prefix + a counter
	sub    *nats.Subscription
	stop   chan struct{}

	mu     sync.Mutex
	closed bool
	next   uint64
	wait   map[uint64]*ack
	msg    nats.Msg // reused under mu: PublishMsg copies it out
	expect []string // the expected-sequence header's value, reused
	buf    []byte   // the record's encoding, reused
}

// ack is one write's acknowledgement, ready once done is closed.
type ack struct {
	done chan struct{}
	sent time.Time
	seq  uint64
	err  error
}

func newWriter(nc *nats.Conn) (*writer, error) {
	w := &writer{nc: nc, prefix: nc.NewInbox() + ".", wait: map[uint64]*ack{}, stop: make(chan struct{}), expect: make([]string, 1)}
	w.msg.Header = nats.Header{jetstream.ExpectedLastSubjSeqHeader: w.expect}
	sub, err := nc.Subscribe(w.prefix+"*", w.onAck)
	if err != nil {
		return nil, err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		sub.Unsubscribe()
		return nil, err
	}
	w.sub = sub
	go w.expire()
	return w, nil
}

// publish sends rec to subject if the subject's last sequence is expect.
func (w *writer) publish(subject string, rec Record, expect uint64) (*ack, error) {
	a := &ack{done: make(chan struct{}), sent: time.Now()}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, errors.New("ledger closed")
	}
	w.next++
	id := w.next
	w.buf = rec.appendTo(w.buf[:0])
	w.msg.Subject, w.msg.Data = subject, w.buf
	w.msg.Reply = w.prefix + strconv.FormatUint(id, 10)
	if expect == 0 {
		w.expect[0] = "0" // a new record, the common case
	} else {
		w.expect[0] = strconv.FormatUint(expect, 10)
	}
	if err := w.nc.PublishMsg(&w.msg); err != nil {
		return nil, err
	}
	w.wait[id] = a
	return a, nil
}

func (w *writer) onAck(m *nats.Msg) {
	id, err := strconv.ParseUint(m.Subject[len(w.prefix):], 10, 64)
	if err != nil {
		return
	}
	w.mu.Lock()
	a := w.wait[id]
	delete(w.wait, id)
	w.mu.Unlock()
	if a == nil {
		return // expired
	}
	a.seq, a.err = readAck(m)
	close(a.done)
}

// expire fails the writes that waited writeTimeout for their
// acknowledgement, once a second.
func (w *writer) expire() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case now := <-t.C:
			w.mu.Lock()
			for id, a := range w.wait {
				if now.Sub(a.sent) >= writeTimeout {
					delete(w.wait, id)
					a.err = errWriteTimeout
					close(a.done)
				}
			}
			w.mu.Unlock()
		}
	}
}

func (w *writer) close() {
	close(w.stop)
	w.sub.Unsubscribe()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for id, a := range w.wait {
		delete(w.wait, id)
		a.err = nats.ErrConnectionClosed
		close(a.done)
	}
}

var (
	ackSeq   = []byte(`"seq":`)
	ackError = []byte(`"error"`)
)

// readAck reads a JetStream publish acknowledgement: the stored sequence,
// or the server's error as a *jetstream.APIError.
func readAck(m *nats.Msg) (uint64, error) {
	if status := m.Header.Get("Status"); status == "503" {
		return 0, nats.ErrNoResponders
	} else if status != "" {
		return 0, fmt.Errorf("ledger write: server says %s %s", status, m.Header.Get("Description"))
	}
	if !bytes.Contains(m.Data, ackError) {
		if i := bytes.Index(m.Data, ackSeq); i >= 0 {
			rest := m.Data[i+len(ackSeq):]
			end := 0
			for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
				end++
			}
			if seq, err := strconv.ParseUint(string(rest[:end]), 10, 64); err == nil && seq > 0 {
				return seq, nil
			}
		}
	}
	var resp struct {
		Error *jetstream.APIError `json:"error"`
		Seq   uint64              `json:"seq"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return 0, fmt.Errorf("ledger write: unreadable acknowledgement %q: %w", m.Data, err)
	}
	if resp.Error != nil {
		return 0, resp.Error
	}
	if resp.Seq == 0 {
		return 0, fmt.Errorf("ledger write: acknowledgement without a sequence: %q", m.Data)
	}
	return resp.Seq, nil
}
