package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// ErrPayloadTooLarge is returned by Enqueue for a payload over MaxPayload.
var ErrPayloadTooLarge = errors.New("payload too large")

// ErrFull is returned by Enqueue when JOB or the server's store has no room:
// stored jobs are kept, new ones are refused until workers drain some.
var ErrFull = errors.New("job store is full")

// EnqueueOptions are the optional parts of a job.
type EnqueueOptions struct {
	// ID is the job's Nats-Msg-Id. Empty means a fresh unique ID, so that a
	// retried publish is still stored once.
	ID string
	// Header holds extra headers; Nats-Msg-Id in it is replaced by ID.
	Header nats.Header
}

// Producer publishes jobs to JOB. It is safe for concurrent use.
type Producer struct {
	js         jetstream.JetStream
	maxPayload int
	// jobLimit is JOB's own limit on a message, as last read (0: not
	// read); see JOBLimit.
	jobLimit int64
	metrics  *Metrics
	// attempts and attemptTimeout bound the retries of a lost ack.
	attempts       int
	attemptTimeout time.Duration
	// window is JOB's dedupe window: a lost ack is sent again only
	// within it, or JOB would store the job twice.
	window time.Duration
	// async is EnqueueAsync's publisher, started by its first call.
	async *asyncPublisher
}

// asyncPublisher is a Producer's publisher for EnqueueAsync.
type asyncPublisher struct {
	mu  sync.Mutex
	pub *data.Publisher
	err error
}

// maxAsyncPending bounds the jobs of EnqueueAsync waiting for their
// acknowledgement, as jetstream's async publishes are bounded by default.
const maxAsyncPending = 4000

// NewProducer returns a Producer that publishes through js, refuses
// payloads over cfg.MaxPayload and counts stored jobs in cfg.Metrics.
func NewProducer(js jetstream.JetStream, cfg Config) *Producer {
	cfg = cfg.withDefaults()
	return &Producer{js: js, maxPayload: cfg.MaxPayload, metrics: cfg.Metrics, attempts: 5, attemptTimeout: 5 * time.Second, window: cfg.DedupeWindow,
		async: &asyncPublisher{}}
}

// Close ends what EnqueueAsync started: jobs still waiting for their
// acknowledgement fail, and EnqueueAsync fails from then on, with
// data.ErrPublisherClosed. Enqueue works still. It does not close the
// connection.
func (p *Producer) Close() {
	p.async.mu.Lock()
	defer p.async.mu.Unlock()
	if p.async.pub != nil {
		p.async.pub.Close()
	}
	if p.async.err == nil {
		p.async.err = data.ErrPublisherClosed
	}
}

// publisher returns EnqueueAsync's publisher, started on first use.
func (p *Producer) publisher() (*data.Publisher, error) {
	p.async.mu.Lock()
	defer p.async.mu.Unlock()
	if p.async.pub == nil && p.async.err == nil {
		p.async.pub, p.async.err = data.NewPublisher(p.js.Conn(), data.PublisherOptions{
			Timeout: p.attemptTimeout, MaxPending: maxAsyncPending, FailOnReconnect: true, NoResponderRetries: 2})
	}
	return p.async.pub, p.async.err
}

// Enqueue stores one job and returns the stream's acknowledgement. A publish
// whose ack is lost (timeout, no responders) is retried with the same ID, so
// the job is stored once; the retried ack then reports Duplicate.
func (p *Producer) Enqueue(ctx context.Context, subject string, payload []byte, opts EnqueueOptions) (*jetstream.PubAck, error) {
	return p.enqueueSince(ctx, subject, payload, opts, time.Time{})
}

// enqueueSince is Enqueue of a job first sent at first, whose ack was lost;
// or, if first is zero, of a job not sent before.
func (p *Producer) enqueueSince(ctx context.Context, subject string, payload []byte, opts EnqueueOptions, first time.Time) (*jetstream.PubAck, error) {
	resend := !first.IsZero()
	if !resend {
		first = time.Now()
	}
	msg, err := p.message(subject, payload, opts)
	if err != nil {
		return nil, err
	}
	id := msg.Header.Get(nats.MsgIdHdr)
	var last error = jetstream.ErrAsyncPublishTimeout
	for attempt := 1; attempt <= p.attempts; attempt++ {
		if (attempt > 1 || resend) && time.Since(first) >= p.window {
			// JOB may have stored it and forgotten its ID since: sent
			// again, it could be stored twice.
			return nil, p.pastWindow(id, subject, last)
		}
		actx, cancel := context.WithTimeout(ctx, p.attemptTimeout)
		ack, err := p.js.PublishMsg(actx, msg)
		cancel()
		if err == nil && ack.Stream != StreamJob {
			return nil, fmt.Errorf("enqueue job %s on %s: stored in stream %s, not %s; another stream captures this subject", id, subject, ack.Stream, StreamJob)
		}
		if err == nil {
			if !ack.Duplicate {
				p.metrics.jobEnqueued(subject)
			}
			return ack, nil
		}
		last = err
		if isFull(err) {
			return nil, fmt.Errorf("enqueue job %s on %s: %w (%w); stored jobs are kept: wait for workers to drain JOB, or raise --max-store", id, subject, ErrFull, err)
		}
		if ctx.Err() != nil || !retryable(err) {
			break
		}
		select {
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	if retryable(last) {
		left := p.window - time.Since(first)
		if left < time.Second {
			return nil, p.pastWindow(id, subject, last)
		}
		return nil, fmt.Errorf("enqueue job %s on %s: no acknowledgement from %s (%w); the store may be full or failing, see the jobq serve log; enqueueing again with the same ID within %s is safe (JOB's dedupe window)", id, subject, StreamJob, last, left.Round(time.Second))
	}
	return nil, fmt.Errorf("enqueue job %s on %s: %w", id, subject, last)
}

// AttemptTimeout sets how long each publish of Enqueue waits for its
// acknowledgement before it is sent again (5s unless set; jobq enqueue's
// --timeout), and returns p. It is also how long EnqueueAsync's futures
// wait, if set before its first call.
func (p *Producer) AttemptTimeout(d time.Duration) *Producer {
	if d > 0 {
		p.attemptTimeout = d
	}
	return p
}

// JOBLimit sets the limit on a message that JOB's config held when obj was
// opened (which jobq serve's --max-payload sets, and may put under this
// producer's MaxPayload), and returns p: a job over it is refused before
// it is sent, as ErrPayloadTooLarge, rather than by JOB once sent.
func (p *Producer) JOBLimit(obj *Objects) *Producer {
	if obj.Jobs != nil {
		cfg := obj.Jobs.CachedInfo().Config
		p.jobLimit = int64(max(cfg.MaxMsgSize, 0))
		if cfg.Duplicates > 0 {
			p.window = cfg.Duplicates
		}
	}
	return p
}

// EnqueueAsync checks a job and publishes it without waiting for the
// stream's acknowledgement; the future reports it. Use it for bulk work;
// Enqueue for one job.
//
// It publishes through a publisher of jobq's own, not js's
// PublishMsgAsync: js's async options (handlers, max pending, timeout) do
// not apply, and js.PublishAsyncPending and PublishAsyncComplete do not
// count these jobs; wait on the futures. The first call starts the
// publisher (a reply subscription and a goroutine), held until Close or
// until the connection closes: share one Producer, which is safe for
// concurrent use, rather than make one per job or per request.
//
// A lost acknowledgement is not retried: a future fails with
// jetstream.ErrAsyncPublishTimeout once it waited the attempt timeout
// (AttemptTimeout, as set before the first call), and with
// nats.ErrDisconnected if the connection is lost; the job may be stored
// then, and Enqueue with its ID, within JOB's dedupe window, stores it
// once. A job JOB did not answer is sent twice more, 250ms apart, then
// fails with nats.ErrNoResponders. At most 4000 jobs wait for their
// acknowledgement; one more waits for room, up to the attempt timeout,
// then fails with jetstream.ErrTooManyStalledMsgs. After Close, futures
// still waiting fail, and calls fail, with data.ErrPublisherClosed.
func (p *Producer) EnqueueAsync(subject string, payload []byte, opts EnqueueOptions) (jetstream.PubAckFuture, error) {
	pub, err := p.publisher()
	if err != nil {
		return nil, fmt.Errorf("enqueue job on %s: %w", subject, err)
	}
	return p.enqueueAsyncOn(pub, subject, payload, opts)
}

// enqueueAsyncOn is EnqueueAsync through pub.
func (p *Producer) enqueueAsyncOn(pub *data.Publisher, subject string, payload []byte, opts EnqueueOptions) (jetstream.PubAckFuture, error) {
	id, header, err := p.check(subject, payload, opts)
	if err != nil {
		return nil, err
	}
	f, err := pub.Publish(subject, payload, id, header)
	if err != nil {
		return nil, fmt.Errorf("enqueue job %s on %s: %w", id, subject, err)
	}
	return f, nil
}

// message checks a job and builds its message.
func (p *Producer) message(subject string, payload []byte, opts EnqueueOptions) (*nats.Msg, error) {
	id, header, err := p.check(subject, payload, opts)
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(subject)
	msg.Data = payload
	if header != nil {
		msg.Header = header
	} else {
		msg.Header.Set(nats.MsgIdHdr, id)
	}
	return msg, nil
}

// check checks a job, and returns its ID and its headers: a copy of
// opts.Header with the ID as Nats-Msg-Id, or nil if opts.Header is empty.
func (p *Producer) check(subject string, payload []byte, opts EnqueueOptions) (id string, header nats.Header, err error) {
	if err := handlers.ValidSubject(subject); err != nil {
		return "", nil, err
	}
	if len(payload) > p.maxPayload {
		return "", nil, fmt.Errorf("%w: %d bytes, the limit is %d (--max-payload)", ErrPayloadTooLarge, len(payload), p.maxPayload)
	}
	if err := ValidHeader(opts.Header); err != nil {
		return "", nil, err
	}
	if id = opts.ID; id == "" {
		id = nuid.Next()
	}
	if err := ValidID(id); err != nil {
		return "", nil, err
	}
	size := int64(len(payload) + len("NATS/1.0\r\n\r\n") + len(nats.MsgIdHdr+": \r\n") + len(id))
	if len(opts.Header) > 0 {
		header = make(nats.Header, len(opts.Header)+1)
		for k, v := range opts.Header {
			header[k] = append([]string(nil), v...)
		}
		header.Set(nats.MsgIdHdr, id)
		size = int64(len(payload) + headerLen(header))
	}
	// JOB's limit (see jobMaxMsgSize), less room for the headers of the
	// job's re-drive, which would be refused every time otherwise: the
	// server refuses a larger job with a bare "message size exceeds
	// maximum allowed". Checked for larger jobs only, as no server takes
	// less than that, unless JOB's own limit is known.
	if size > 32<<10 || p.jobLimit > 0 {
		limit := jobMaxMsgSize(p.maxPayload, p.js.Conn().MaxPayload())
		if p.jobLimit > 0 {
			limit = min(limit, p.jobLimit)
		}
		if size+redriveRoom > limit {
			return "", nil, fmt.Errorf("%w: %d bytes with its headers, %s takes at most %d less %d kept for its re-drive's headers (set by jobq serve --max-payload and the server's max_payload)", ErrPayloadTooLarge, size, StreamJob, limit, redriveRoom)
		}
	}
	return id, header, nil
}

// dlqRoom is what a job leaves of the server's limit on a message for the
// headers its dead letter adds: jobq's, and the error, up to maxErrorHeader.
// JOB holds every client to it (see jobStreamConfig).
const dlqRoom = 2 << 10

// redriveRoom is what a job from jobq's producer leaves of JOB's limit for
// what its re-drive (dlq retry) adds: Jobq-Job-Id, and a Nats-Msg-Id of the
// re-drive's own in place of the job's (see retryID).
const redriveRoom = 128

// headerName reports whether k is a header name NATS carries: a token of
// RFC 7230, as nats.go checks before it sends a message.
func headerName(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return true
}

// headerLen is the size of h on the wire.
func headerLen(h nats.Header) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// retryable reports whether a publish may have been lost on the way, so that
// sending it again with the same ID is the right move.
func retryable(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected)
}

// pastWindow is the error for job id on subject whose ack was lost (last)
// and which is not sent again, its dedupe window over.
func (p *Producer) pastWindow(id, subject string, last error) error {
	return pastWindowError{fmt.Errorf("enqueue job %s on %s: no acknowledgement from %s within its dedupe window of %s (%w); the job may be stored: check the jobq serve log and jobq status before enqueueing it again, as it could then be stored twice", id, subject, StreamJob, p.window, last)}
}

// pastWindowError: a job whose ack was lost, and that was not sent again
// since JOB's dedupe window had passed: it may be stored, and a re-send
// could store it twice.
type pastWindowError struct{ error }

func (e pastWindowError) Unwrap() error { return e.error }

// ErrBadID is returned for a job ID that a message header cannot carry.
var ErrBadID = errors.New("bad job id")

// ErrBadHeader is returned for a job header that jobq keeps for itself.
var ErrBadHeader = errors.New("bad job header")

// ValidID checks that id can travel as a Nats-Msg-Id header: any bytes but
// ASCII control characters (line breaks would end the header), at most 4 KiB;
// and that it is not of the form "seq-" and digits, which names the jobs
// published without an ID, so that a job can never take another's record.
func ValidID(id string) error {
	if len(id) > 4096 {
		return fmt.Errorf("%w: %d bytes, the limit is 4096", ErrBadID, len(id))
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] == 0x7f {
			return fmt.Errorf("%w: %q has a control character; use printable text", ErrBadID, id)
		}
	}
	if strings.Trim(id, " ") != id { // nats.go trims ASCII spaces (and tabs, refused above) off a header value, no other
		return fmt.Errorf("%w: %q starts or ends with a space, which headers drop", ErrBadID, id)
	}
	if data.IsSeqID(id) {
		return fmt.Errorf("%w: %q is the ID jobq gives the job at that stream sequence when it is published without one; use another", ErrBadID, id)
	}
	if strings.HasPrefix(id, retryIDPrefix) {
		return fmt.Errorf("%w: %q: IDs starting with %s are jobq's, for re-driven dead letters; use another", ErrBadID, id, retryIDPrefix)
	}
	return nil
}

// ValidHeader refuses a header NATS cannot carry as given (a name that is
// not a token, see headerName; a value with a line break, or one that
// starts or ends with a space or tab, which would be rewritten or trimmed),
// and the headers that jobq keeps for itself: those starting with Jobq-,
// such as the Jobq-Job-Id with which a dead letter's re-drive names its
// job, and which would name any job's record; and those starting with
// Nats-, which tell the server how to store the job (a Nats-TTL would
// expire it unrun), but for Nats-Msg-Id, which the job's ID replaces.
func ValidHeader(h map[string][]string) error {
	for k, vs := range h {
		switch {
		case !headerName(k):
			return fmt.Errorf("%w: %q: a header name is letters, digits and !#$%%&'*+-.^_`|~ only", ErrBadHeader, k)
		case slices.ContainsFunc(vs, func(v string) bool { return strings.ContainsAny(v, "\r\n") }):
			return fmt.Errorf("%w: %s: a value cannot hold a line break", ErrBadHeader, k)
		case slices.ContainsFunc(vs, func(v string) bool { return strings.Trim(v, " \t") != v }):
			// The server would store it trimmed: another value.
			return fmt.Errorf("%w: %s: a value cannot start or end with a space or tab", ErrBadHeader, k)
		case hasPrefixFold(k, "Jobq-"):
			return fmt.Errorf("%w: %s: headers starting with Jobq- are jobq's own; use another name", ErrBadHeader, k)
		case hasPrefixFold(k, "Nats-") && !strings.EqualFold(k, nats.MsgIdHdr):
			return fmt.Errorf("%w: %s: headers starting with Nats- tell the server how to store the job; use another name", ErrBadHeader, k)
		}
	}
	return nil
}

// hasPrefixFold reports whether header name k starts with prefix, in any
// case: header names compare so.
func hasPrefixFold(k, prefix string) bool {
	return len(k) >= len(prefix) && strings.EqualFold(k[:len(prefix)], prefix)
}

// isFull reports a publish refused for lack of room: the stream's MaxBytes
// (discard new) or the account's storage limit.
func isFull(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	// nats-server's codes: 10077 store failed (maximum bytes exceeded),
	// 10023 insufficient resources, 10047 storage resources exceeded.
	switch apiErr.ErrorCode {
	case 10077, 10023, 10047:
		// 10077 is also a message over the store's limit on one record.
		return !strings.Contains(apiErr.Description, "message too large")
	}
	return false
}
