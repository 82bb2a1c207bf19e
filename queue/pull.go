package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pullSubject is where pull requests for WORKER go.
const pullSubject = "$JS.API.CONSUMER.MSG.NEXT." + StreamJob + "." + ConsumerWorker

// pullRequest is the body of one pull request: up to Batch jobs of up to
// MaxBytes in all (0: any), waiting up to Expires nanoseconds for them.
type pullRequest struct {
	Batch    int   `json:"batch"`
	Expires  int64 `json:"expires"`
	MaxBytes int64 `json:"max_bytes,omitempty"`
}

// errWorkerDeleted: WORKER was deleted while a pull waited, on its own or
// with JOB.
var errWorkerDeleted = errors.New("409 Consumer Deleted")

// errPullRefused is a pull the server ended for a reason other than its
// wait or its byte budget running out, such as WORKER's limits on a pull.
var errPullRefused = errors.New("pull refused by the server")

// fetchBatch pulls up to n jobs, of at most maxBytes in all (0: any), and
// admits each. It returns how many it got and why the pull ended early, if
// it did for a reason other than its wait running out.
//
// The pull is jobq's own rather than nats.go's Fetch: the pull's
// subscription admits each job on the goroutine that delivers it, with no
// hand-off to a goroutine of Fetch's and no timer per message between.
// Once ctx ends (Stop), the pull takes no more jobs, and those already sent
// are admitted (see pullJobs).
func (p *Pool) fetchBatch(ctx context.Context, n int, maxBytes int64) (int, error) {
	// The JOB the pool knows of before the pull goes out: a job the pull
	// brings is of it or of a later one. Read as each job is admitted, it
	// could be a JOB made anew that a look-up found while an earlier
	// JOB's job, sent before, waited in the pull's subscription: that
	// job's ack would reach the new JOB's job at its sequence.
	of := p.stream.now()
	got, err := pullJobs(ctx, p.obj.JS.Conn(), n, maxBytes, p.fetchWait, func(m *nats.Msg) { p.admit(m, of) })
	if errors.Is(err, errWorkerDeleted) {
		// With JOB, maybe: the jobs of it that the pool holds get no ack
		// until a look-up tells (see jobStream).
		p.stream.mayBeGone()
	}
	if err != nil {
		p.log.Warn().Err(err).Msg("fetch jobs")
	}
	return got, err
}

// pullJobs makes one pull from WORKER of up to n jobs, of at most maxBytes
// in all (0: any), that waits up to wait for them, and admits each job as
// it arrives. It returns how many it got, and an error if the pull could
// not be made or the server refused it.
//
// ctx ending ends the pull: its subscription is drained, so the server,
// which looks for interest before it sends each job, sends no more, and
// the jobs it sent before are still admitted. Cut off instead, they would
// wait out the ack wait; left open, the pull would take in jobs, or the
// very jobs a stopping pool hands back, until its wait ran out, each
// handed back again at the cost of a delivery. A job that arrives after
// the pull ended is handed back (see receive).
func pullJobs(ctx context.Context, nc *nats.Conn, n int, maxBytes int64, wait time.Duration, admit func(*nats.Msg)) (int, error) {
	if ctx.Err() != nil {
		return 0, nil // no pull, to drain again, once ctx ended
	}
	pl := &pull{admit: admit, n: n, maxBytes: maxBytes, done: make(chan struct{})}
	inbox := nc.NewInbox()
	sub, err := nc.Subscribe(inbox, pl.receive)
	if err != nil {
		return 0, err
	}
	defer sub.Unsubscribe()
	// The pull's own batch and byte budget bound what it buffers; nats.go's
	// default limit (64 MiB) would drop jobs of a larger --prefetch-bytes as
	// a slow consumer, to wait out the ack wait.
	err = sub.SetPendingLimits(-1, -1)
	var body []byte
	if err == nil {
		body, err = json.Marshal(pullRequest{Batch: n, Expires: int64(wait), MaxBytes: maxBytes})
	}
	if err == nil {
		err = nc.PublishRequest(pullSubject, inbox, body)
	}
	if err != nil {
		return 0, err
	}
	// The server ends the pull when its wait runs out; a second more covers
	// a server that went away meanwhile.
	t := time.NewTimer(wait + time.Second)
	defer t.Stop()
	select {
	case <-pl.done:
	case <-t.C:
		pl.end(nil)
	case <-ctx.Done():
		drained := sub.StatusChanged(nats.SubscriptionClosed)
		if sub.Drain() == nil {
			select {
			case <-drained:
			case <-pl.done:
			case <-t.C:
			}
		}
		pl.end(nil)
	}
	return pl.result()
}

// pull is one pull request on its own subscription.
type pull struct {
	admit    func(*nats.Msg) // a job's message, whose reply subject is its ack subject
	n        int
	maxBytes int64

	mu    sync.Mutex
	got   int
	bytes int64 // as the server counts them for max_bytes
	// sent, once the server's word that ended the pull came ahead of some
	// of its jobs: how many it sent in all; endErr is what that word
	// meant. The pull ends once they are in (or its timer runs out).
	sent   int
	endErr error
	ended  bool
	err    error
	done   chan struct{} // closed when the pull ends
}

// receive takes one message of the pull: a job, or the server's word that
// the pull ended. A job that arrives after the end (the pull's timer ran out
// first) is handed back with a Nak, for redelivery now rather than after
// the ack wait.
func (pl *pull) receive(m *nats.Msg) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.ended {
		if m.Reply != "" {
			_ = m.Nak() // if lost, the ack wait redelivers it
		}
		return
	}
	// The server's word has no reply subject; every job has one, its ack
	// subject, so a job with a Status header and no payload is still a job.
	if code := m.Header.Get("Status"); m.Reply == "" && code != "" && len(m.Data) == 0 {
		var err error
		switch desc := m.Header.Get("Description"); {
		case code == "100": // idle heartbeat
			return
		case code == "404" || code == "408": // no jobs, or the wait ran out
		case code == "409" && desc == "Message Size Exceeds MaxBytes":
			// the next job does not fit; see fetch
		case code == "409" && desc == "Batch Completed":
		case code == "409" && desc == "Consumer Deleted":
			err = fmt.Errorf("%w: %w", errPullRefused, errWorkerDeleted)
		default:
			err = fmt.Errorf("%w: %s %s", errPullRefused, code, desc)
		}
		// A replicated WORKER sends each job once its delivery is agreed
		// on, but its word at once: the word can overtake the pull's
		// last jobs. It tells how many of the batch it did not send; the
		// pull waits for the others, or they would be handed back, a
		// delivery spent each time, till they were dead-lettered unrun.
		if left, perr := strconv.Atoi(m.Header.Get("Nats-Pending-Messages")); perr == nil && pl.n-left > pl.got {
			pl.sent, pl.endErr = pl.n-left, err
			return
		}
		pl.endLocked(err)
		return
	}
	pl.got++
	pl.bytes += int64(m.Size())
	pl.admit(m)
	switch {
	case pl.sent > 0 && pl.got >= pl.sent:
		pl.endLocked(pl.endErr)
	case pl.got >= pl.n || pl.maxBytes > 0 && pl.bytes >= pl.maxBytes:
		// The server ends the pull silently once its batch or its bytes
		// are used up.
		pl.endLocked(nil)
	}
}

func (pl *pull) end(err error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.endLocked(err)
}

func (pl *pull) endLocked(err error) {
	if !pl.ended {
		pl.ended, pl.err = true, err
		close(pl.done)
	}
}

func (pl *pull) result() (int, error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.got, pl.err
}

// jobMsg is a delivered job as a jetstream.Msg, with its metadata (from
// the ack subject) read once.
type jobMsg struct {
	msg  *nats.Msg
	meta jetstream.MsgMetadata // in the same allocation
	err  error
	// stream tells whether the job is of the JOB there is now, of says
	// which JOB was there when it was fetched (see jobStream).
	stream *jobStream
	of     int64
}

func newJobMsg(m *nats.Msg) *jobMsg {
	jm := new(jobMsg)
	jm.init(m)
	return jm
}

// init makes jm m's job message.
func (jm *jobMsg) init(m *nats.Msg) {
	jm.msg = m
	if err := parseAckSubject(m.Reply, &jm.meta); err != nil {
		jm.err = fmt.Errorf("%w: %w", jetstream.ErrNotJSMessage, err)
	}
}

// errAckSubject is a reply subject that is not a JetStream ack subject.
var errAckSubject = errors.New("invalid format of ACK subject")

// parseAckSubject reads a delivered message's metadata from its ack subject
// into meta, as nats.go's Msg.Metadata does, without an allocation: the
// names are substrings of the subject. The subject is
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>
//
// or, from newer servers,
//
//	$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>[.<token>...]
//
// with the domain "_" for none.
func parseAckSubject(reply string, meta *jetstream.MsgMetadata) error {
	rest, ok := strings.CutPrefix(reply, "$JS.ACK.")
	if !ok {
		return fmt.Errorf("%w: %q does not start with $JS.ACK", errAckSubject, reply)
	}
	var tokens [11]string // domain, hash, stream, consumer, then five numbers
	n := strings.Count(rest, ".") + 1
	switch {
	case n == 7: // no domain and account hash
		for i := 2; i < 9; i++ {
			tokens[i], rest, _ = strings.Cut(rest, ".")
		}
	case n >= 9:
		for i := range tokens[:9] {
			tokens[i], rest, _ = strings.Cut(rest, ".")
		}
	default:
		return fmt.Errorf("%w: %q", errAckSubject, reply)
	}
	if tokens[0] == "_" {
		tokens[0] = ""
	}
	*meta = jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Stream: parseAckNum(tokens[5]), Consumer: parseAckNum(tokens[6])},
		NumDelivered: parseAckNum(tokens[4]),
		NumPending:   parseAckNum(tokens[8]),
		Timestamp:    time.Unix(0, int64(parseAckNum(tokens[7]))),
		Stream:       tokens[2],
		Consumer:     tokens[3],
		Domain:       tokens[0],
	}
	return nil
}

// parseAckNum reads a number of an ack subject: 0 if it is not one.
func parseAckNum(s string) uint64 {
	var n uint64
	for i := range len(s) {
		c := s[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + uint64(c-'0')
	}
	return n
}

func (m *jobMsg) Metadata() (*jetstream.MsgMetadata, error) {
	if m.err != nil {
		return nil, m.err
	}
	return &m.meta, nil
}
func (m *jobMsg) Data() []byte         { return m.msg.Data }
func (m *jobMsg) Headers() nats.Header { return m.msg.Header }
func (m *jobMsg) Subject() string      { return m.msg.Subject }
func (m *jobMsg) Reply() string        { return m.msg.Reply }

// earlierJOB is errEarlierJOB if m may be a job of a JOB deleted since it
// was fetched (see jobStream.earlier).
func (m *jobMsg) earlierJOB() error {
	if m.stream != nil && m.stream.earlier(m.of, m.meta.Timestamp) {
		return errEarlierJOB
	}
	return nil
}

func (m *jobMsg) Ack() error {
	if err := m.earlierJOB(); err != nil {
		return err
	}
	return m.msg.Ack()
}

func (m *jobMsg) DoubleAck(ctx context.Context) error {
	if err := m.earlierJOB(); err != nil {
		return err
	}
	return m.msg.AckSync(nats.Context(ctx))
}

func (m *jobMsg) Nak() error {
	if err := m.earlierJOB(); err != nil {
		return err
	}
	return m.msg.Nak()
}

func (m *jobMsg) NakWithDelay(d time.Duration) error {
	if err := m.earlierJOB(); err != nil {
		return err
	}
	return m.msg.NakWithDelay(d)
}

func (m *jobMsg) InProgress() error {
	if m.stream != nil && m.stream.knownEarlier(m.of, m.meta.Timestamp) {
		return errEarlierJOB
	}
	return m.msg.InProgress()
}

func (m *jobMsg) Term() error {
	if err := m.earlierJOB(); err != nil {
		return err
	}
	return m.msg.Term()
}

func (m *jobMsg) TermWithReason(reason string) error {
	if err := m.earlierJOB(); err != nil {
		return err
	}
	return m.msg.Respond([]byte("+TERM " + reason))
}
