package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// maxErrorHeader bounds the error text kept in a dead letter's header.
const maxErrorHeader = 1024

// maxHeaderBytes is the most header bytes nats-server's JetStream stores
// in a message.
const maxHeaderBytes = math.MaxUint16

// deadLetter copies a job, whose headers are h, to DLQ with why it failed,
// and waits for the stream to confirm. Only then may the caller remove it
// from JOB. Moving the same job twice stores it once (see deadLetterID). A
// DLQ that is gone is created again first (see makeDLQAnew).
func (p *Pool) deadLetter(ctx context.Context, job *data.Job, h nats.Header, cause string) error {
	err := deadLetter(ctx, p.obj.JS, job, h, cause)
	if errors.Is(err, jetstream.ErrNoStreamResponse) && p.makeDLQAnew(ctx) {
		err = deadLetter(ctx, p.obj.JS, job, h, cause)
	}
	return err
}

// makeDLQAnew creates DLQ again, as Provision does, once someone deleted it
// (nats stream rm DLQ): every dead letter would fail otherwise, and each
// failed job stay in JOB, for the sweep to try again and again. It reports
// whether DLQ is there now, for the dead letter to be published again: made
// here, or by another worker or pool meanwhile (or there all along, the
// publish failing for another reason, which the next one meets again; a
// dead letter published twice is stored once).
func (p *Pool) makeDLQAnew(ctx context.Context) bool {
	_, err := p.obj.JS.Stream(ctx, StreamDLQ)
	if err == nil {
		return true
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return false
	}
	_, err = p.obj.JS.CreateStream(ctx, deadStreamConfig(p.cfg))
	switch {
	case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
		p.log.Warn().Msg("stream " + StreamDLQ + " was deleted: another pool created it again")
		return true
	case err != nil:
		p.log.Error().Err(err).Msg("stream " + StreamDLQ + " is gone and could not be created again; restart jobq")
		return false
	}
	p.log.Warn().Msg("stream " + StreamDLQ + " was deleted: created it again")
	return true
}

// errTooLargeForDLQ: a job whose dead letter the server would refuse as too
// large, every time. It stays in JOB; the sweep goes on past it.
var errTooLargeForDLQ = errors.New("job too large for its dead letter")

func deadLetter(ctx context.Context, js jetstream.JetStream, job *data.Job, h nats.Header, cause string) error {
	m := nats.NewMsg(SubjectDLQPrefix + job.Subject)
	m.Data = job.Payload
	for k, v := range h {
		// Nats- headers told the server how to store the job, such as a
		// Nats-Expected-Stream: JOB that DLQ would refuse every time.
		// Jobq- headers are jobq's own, set below; another client's, in
		// any case, would only ride along and take room.
		if hasPrefixFold(k, "Nats-") || hasPrefixFold(k, "Jobq-") {
			continue
		}
		// A name another client stored that nats.go will not send would
		// make the dead letter's publish fail, every time.
		if !headerName(k) {
			continue
		}
		m.Header[k] = append([]string(nil), v...)
	}
	cause = CutUTF8(strings.ReplaceAll(cause, "\n", " "), maxErrorHeader)
	m.Header.Set(HeaderJobID, job.ID)
	m.Header.Set(HeaderSubject, job.Subject)
	m.Header.Set(HeaderSeq, strconv.FormatUint(job.Seq, 10))
	m.Header.Set(HeaderAttempts, strconv.Itoa(job.Attempt))
	m.Header.Set(HeaderError, cause)
	m.Header.Set(HeaderFailedAt, time.Now().UTC().Format(time.RFC3339Nano))
	m.Header.Set(nats.MsgIdHdr, deadLetterID(job))
	limit := js.Conn().MaxPayload()
	if hl := headerLen(m.Header); hl > maxHeaderBytes || int64(len(m.Data)+hl) > limit {
		// The job's own headers with jobq's take more than the server
		// carries: its dead letter would be refused every time, and the
		// job stay in JOB. They are left out, and its error says so.
		for k := range h {
			if !hasPrefixFold(k, "Jobq-") && !hasPrefixFold(k, "Nats-") { // jobq's own stay
				delete(m.Header, k)
			}
		}
		const note = " (the job's own headers are left out of its dead letter: with jobq's they were over the server's limit)"
		m.Header.Set(HeaderError, cause+note)
		// A job stored by another client may fill the server's limit
		// (JOB leaves dlqRoom only since it was provisioned so): its
		// error is cut to what room there is.
		if over := int64(len(m.Data)+headerLen(m.Header)) - limit; over > 0 {
			m.Header.Set(HeaderError, CutUTF8(cause, max(len(cause)-int(over), 0))+note)
		}
		if size := int64(len(m.Data) + headerLen(m.Header)); size > limit {
			return fmt.Errorf("%w: job %s takes %d bytes with jobq's headers, the server carries at most %d; raise the server's max_payload (jobq serve --max-payload), or remove the job (nats stream rmm %s %d)",
				errTooLargeForDLQ, job.ID, size, limit, StreamJob, job.Seq)
		}
	}
	ack, err := js.PublishMsg(ctx, m)
	if isFull(err) {
		return fmt.Errorf("publish to %s: %w; the job stays in %s until there is room: re-drive dead letters (jobq dlq retry) or clear them (jobq dlq purge), or raise --max-store", StreamDLQ, err, StreamJob)
	}
	if err != nil {
		return fmt.Errorf("publish to %s: %w", StreamDLQ, err)
	}
	if ack.Stream != StreamDLQ {
		return fmt.Errorf("publish to %s: stored in stream %s; another stream captures %s", StreamDLQ, ack.Stream, m.Subject)
	}
	return nil
}

// deadLetterID is the Nats-Msg-Id of job's dead letter: its JOB sequence,
// so that moving the same job twice (the answer to the first lost) stores
// it once, and when it was stored, so that a job of a JOB made anew, whose
// sequences start over, is never taken for a duplicate of another's within
// DLQ's dedupe window, to be removed from JOB with no dead letter.
func deadLetterID(job *data.Job) string {
	return "dlq-" + strconv.FormatUint(job.Seq, 10) + "-" + strconv.FormatInt(job.EnqueuedAt.UnixMilli(), 10)
}

// CutUTF8 returns s cut to at most n bytes, at a character's start: never
// inside a UTF-8 character.
func CutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// DeadLetter is a job in DLQ.
type DeadLetter struct {
	// Seq is the dead letter's sequence in DLQ, what dlq show and retry take.
	Seq      uint64              `json:"dlq_seq"`
	ID       string              `json:"id"`
	Subject  string              `json:"subject"`
	JobSeq   uint64              `json:"job_seq"`
	Attempts int                 `json:"attempts"`
	Error    string              `json:"error"`
	FailedAt time.Time           `json:"failed_at"`
	Header   map[string][]string `json:"headers,omitempty"`
	Payload  []byte              `json:"payload,omitempty"`
	// at is when DLQ stored it: with Seq, it tells this dead letter from
	// another at Seq, of a DLQ made anew.
	at time.Time
	// storedAt is when its job was stored in JOB, from its Nats-Msg-Id
	// (see deadLetterID), to the millisecond; zero if unknown.
	storedAt time.Time
}

// Stored is when DLQ stored d: with Seq, it names d, and no dead letter of
// a DLQ made anew since d was read.
func (d DeadLetter) Stored() time.Time { return d.at }

func deadLetterFrom(m *jetstream.RawStreamMsg) DeadLetter {
	h := m.Header
	d := DeadLetter{
		Seq: m.Sequence, ID: h.Get(HeaderJobID), Subject: h.Get(HeaderSubject),
		Error: h.Get(HeaderError), Payload: m.Data, Header: map[string][]string{}, at: m.Time.UTC(),
	}
	d.JobSeq, _ = strconv.ParseUint(h.Get(HeaderSeq), 10, 64)
	d.Attempts, _ = strconv.Atoi(h.Get(HeaderAttempts))
	d.FailedAt, _ = time.Parse(time.RFC3339Nano, h.Get(HeaderFailedAt))
	if rest, ok := strings.CutPrefix(h.Get(nats.MsgIdHdr), "dlq-"); ok {
		if _, ms, ok := strings.Cut(rest, "-"); ok {
			if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
				d.storedAt = time.UnixMilli(n)
			}
		}
	}
	d.Header = jobHeaders(h)
	if d.Subject == "" {
		d.Subject = strings.TrimPrefix(m.Subject, SubjectDLQPrefix)
	}
	return d
}

// ListDeadLetters returns up to limit of the dead letters stored when it
// began, oldest first (limit <= 0: all), payloads included.
func ListDeadLetters(ctx context.Context, obj *Objects, limit int) ([]DeadLetter, error) {
	var out []DeadLetter
	err := EachDeadLetter(ctx, obj, func(d DeadLetter) error {
		if out = append(out, d); limit > 0 && len(out) >= limit {
			return errEnough
		}
		return nil
	})
	if errors.Is(err, errEnough) {
		err = nil
	}
	return out, err
}

// errEnough ends an EachDeadLetter that found what it looked for.
var errEnough = errors.New("enough")

// ListDeadLetterSummaries is ListDeadLetters without the payloads, which it
// does not read: the server sends the dead letters' headers only. For views
// of the list, such as the dashboard's, which a DLQ of large payloads would
// otherwise slow down with every load.
func ListDeadLetterSummaries(ctx context.Context, obj *Objects, limit int) ([]DeadLetter, error) {
	var out []DeadLetter
	err := eachDeadLetterSummary(ctx, obj, limit, func(d DeadLetter) error {
		out = append(out, d)
		return nil
	})
	return out, err
}

// summaryBatch is how many dead letters' headers eachDeadLetterSummary
// holds at a time.
const summaryBatch = 1000

// eachDeadLetterSummary calls f with each of up to limit (<= 0: all) dead
// letters stored when it began, oldest first, without its payload, reading
// summaryBatch at a time; it stops at f's first error and returns it.
func eachDeadLetterSummary(ctx context.Context, obj *Objects, limit int, f func(DeadLetter) error) error {
	dead, info, err := deadLetterInfo(ctx, obj)
	if err != nil || info == nil || info.State.Msgs == 0 {
		return err
	}
	left := int(min(info.State.Msgs, math.MaxInt32))
	if limit > 0 {
		left = min(left, limit)
	}
	// A plain ephemeral consumer, removed once read: an ordered consumer
	// creates two per read, keeps one for its InactiveThreshold and retries
	// its second creation without end, outside ctx.
	c, err := dead.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     SubjectDLQPrefix + ">",
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		HeadersOnly:       true,
		MemoryStorage:     true,
		Replicas:          1,
		InactiveThreshold: 10 * time.Second, // if the delete below is lost
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", StreamDLQ, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		dead.DeleteConsumer(dctx, c.CachedInfo().Name)
	}()
	for left > 0 {
		batch, err := c.FetchNoWait(min(left, summaryBatch))
		if err != nil {
			return fmt.Errorf("read %s: %w", StreamDLQ, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			meta, err := m.Metadata()
			if err != nil {
				return fmt.Errorf("read %s: %w", StreamDLQ, err)
			}
			if meta.Sequence.Stream > info.State.LastSeq {
				return nil // stored since it began
			}
			d := deadLetterFrom(&jetstream.RawStreamMsg{Subject: m.Subject(), Sequence: meta.Sequence.Stream, Header: m.Headers(), Time: meta.Timestamp})
			d.Payload = nil
			if err := f(d); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("read %s: %w", StreamDLQ, err)
		}
		if got == 0 {
			return nil // the rest went meanwhile (re-driven, removed)
		}
		left -= got
	}
	return nil
}

// EachDeadLetter calls f with each dead letter stored when it began, oldest
// first, reading one at a time, so that a DLQ of large payloads is never
// held in memory whole; it stops at f's first error and returns it. A dead
// letter stored meanwhile, say by a retried job that failed again, is left
// for the next call.
func EachDeadLetter(ctx context.Context, obj *Objects, f func(DeadLetter) error) error {
	dead, info, err := deadLetterInfo(ctx, obj)
	if err != nil || info == nil {
		return err
	}
	last := info.State.LastSeq
	for seq := uint64(1); seq <= last; {
		m, err := dead.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(SubjectDLQPrefix+">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", StreamDLQ, err)
		}
		if m.Sequence > last {
			return nil
		}
		if err := f(deadLetterFrom(m)); err != nil {
			return err
		}
		seq = m.Sequence + 1
	}
	return nil
}

// ErrNoDeadLetter is returned for a DLQ sequence or job ID with no dead letter.
var ErrNoDeadLetter = errors.New("no such dead letter")

// FindDeadLetter returns the dead letter whose DLQ sequence or job ID is ref.
// A number is taken for a DLQ sequence, unless no dead letter has it;
// DeadLetterOf takes a job ID alone, also one that is a number.
func FindDeadLetter(ctx context.Context, obj *Objects, ref string) (DeadLetter, error) {
	if _, err := deadStream(ctx, obj); errors.Is(err, errDLQGone) {
		return DeadLetter{}, fmt.Errorf("%w: %q (%w)", ErrNoDeadLetter, ref, err)
	}
	if seq, ok := DLQSeq(ref); ok {
		d, err := DeadLetterAt(ctx, obj, seq)
		if !errors.Is(err, ErrNoDeadLetter) {
			return d, err
		}
	}
	return DeadLetterOf(ctx, obj, ref)
}

// DLQSeq returns the DLQ sequence ref is, if it is one: a number greater
// than 0, written plainly. 0, and a number with leading zeros (007), are
// no sequence, but may be job IDs.
func DLQSeq(ref string) (uint64, bool) {
	seq, err := strconv.ParseUint(ref, 10, 64)
	return seq, err == nil && seq > 0 && strconv.FormatUint(seq, 10) == ref
}

// DeadLetterAt returns the dead letter at DLQ sequence seq.
func DeadLetterAt(ctx context.Context, obj *Objects, seq uint64) (DeadLetter, error) {
	dead, err := deadStream(ctx, obj)
	if errors.Is(err, errDLQGone) {
		return DeadLetter{}, fmt.Errorf("%w: DLQ seq %d (%w)", ErrNoDeadLetter, seq, err)
	}
	if err != nil {
		return DeadLetter{}, err
	}
	m, err := dead.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return DeadLetter{}, fmt.Errorf("%w: DLQ seq %d (see jobq dlq list)", ErrNoDeadLetter, seq)
	case err != nil:
		return DeadLetter{}, fmt.Errorf("read %s: %w", StreamDLQ, err)
	}
	return deadLetterFrom(m), nil
}

// DeadLetterOf returns the oldest dead letter of job id.
func DeadLetterOf(ctx context.Context, obj *Objects, id string) (DeadLetter, error) {
	// Found by the headers alone, then read whole.
	var found *DeadLetter
	err := eachDeadLetterSummary(ctx, obj, 0, func(d DeadLetter) error {
		if d.ID != id {
			return nil
		}
		found = &d
		return errEnough
	})
	switch {
	case found != nil:
		return DeadLetterAt(ctx, obj, found.Seq)
	case err != nil:
		return DeadLetter{}, err
	}
	return DeadLetter{}, fmt.Errorf("%w: %q (see jobq dlq list)", ErrNoDeadLetter, id)
}

// RetryDeadLetter publishes a dead letter to its original subject again and
// then removes it from DLQ. The new message gets a fresh Nats-Msg-Id, so the
// dedupe window does not drop it, and keeps the job ID in Jobq-Job-Id, so the
// ledger still guards it: a job recorded done does not run again. The job's
// ledger record is made sure of first (unless a lease holds the job), so
// that no copy of the job runs beside the re-driven one.
//
// It returns where JOB stored the re-drive and the ID it runs under, also
// when only the dead letter's removal failed.
func RetryDeadLetter(ctx context.Context, obj *Objects, d DeadLetter) (*Redrive, error) {
	// Its headers are what the client that stored it wrote: a subject
	// outside job.> would be published to as is, with this client's
	// rights ($JS.API.STREAM.PURGE.JOB purged every job).
	if err := handlers.ValidSubject(d.Subject); err != nil {
		return nil, fmt.Errorf("re-enqueue dead letter %d: its %s header: %w; it stays in %s (remove it with jobq dlq rm %d)", d.Seq, HeaderSubject, err, StreamDLQ, d.Seq)
	}
	if d.ID == "" {
		return nil, fmt.Errorf("re-enqueue dead letter %d: it has no %s header; it stays in %s (remove it with jobq dlq rm %d)", d.Seq, HeaderJobID, StreamDLQ, d.Seq)
	}
	anew, err := jobStreamAnewSince(ctx, obj, d)
	if err != nil {
		return nil, fmt.Errorf("re-enqueue dead letter %d: %w", d.Seq, err)
	}
	id := d.ID
	if anew && data.IsSeqID(d.ID) {
		id = retryID(d)
	}
	job := &data.Job{ID: id, Subject: d.Subject, Seq: d.JobSeq}
	if anew {
		// JOB was made anew since: no copy of the dead letter's job is
		// left in it, and the record keeps no sequence of the earlier
		// JOB, where the new JOB may store the re-drive itself, to be
		// taken for such a copy (see data.Ledger.Claim).
		job.Seq = 0
	}
	ledger := data.NewLedger(obj.Ledger, 0, obj.JS)
	defer ledger.Close()
	leases, err := takesLeases(obj)
	if err != nil {
		return nil, fmt.Errorf("re-enqueue dead letter %d: %w", d.Seq, err)
	}
	if err := ledger.KeepRecord(ctx, job, d.Error, leases); err != nil {
		return nil, fmt.Errorf("re-enqueue dead letter %d: %w", d.Seq, err)
	}
	if !anew {
		if err := removeDeadLetteredCopy(ctx, obj, d); err != nil {
			return nil, fmt.Errorf("re-enqueue dead letter %d: %w", d.Seq, err)
		}
	}
	// The re-drive's own ID, which no job may take (see ValidID): a
	// duplicate is this very dead letter re-enqueued before, whose answer
	// was lost, never another job that would be taken for it.
	m := jobCopy(d.Subject, d.Payload, d.Header, id, retryID(d))
	ack, err := obj.JS.PublishMsg(ctx, m)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum || errors.Is(err, nats.ErrMaxPayload) {
		// A job another client stored that fills JOB's limit: its
		// re-drive's headers take it over.
		return nil, fmt.Errorf("re-enqueue dead letter %d: %d bytes with its headers, more than %s takes; raise the server's max_payload (jobq serve --max-payload) and try again, or publish its payload anew", d.Seq, len(m.Data)+headerLen(m.Header), StreamJob)
	}
	if errors.Is(err, jetstream.ErrNoStreamResponse) {
		return nil, fmt.Errorf("re-enqueue dead letter %d: no stream took subject %s (%w); it stays in %s: see that %s takes it (nats stream info %s)", d.Seq, d.Subject, err, StreamDLQ, StreamJob, StreamJob)
	}
	if err != nil {
		return nil, fmt.Errorf("re-enqueue dead letter %d: %w", d.Seq, err)
	}
	if ack.Stream != StreamJob {
		return nil, fmt.Errorf("re-enqueue dead letter %d: stored in stream %s, not %s", d.Seq, ack.Stream, StreamJob)
	}
	r := &Redrive{PubAck: ack, ID: id}
	if rec, err := ledger.Get(ctx, id); err == nil && rec.State == data.StateDone {
		r.Done = true
	}
	// Removed as dlq rm removes it: what is at its sequence is looked at
	// first, so that a dead letter of a DLQ made anew since stays.
	err = RemoveDeadLetter(ctx, obj, d)
	if errors.Is(err, ErrNoDeadLetter) {
		err = nil // gone already, with DLQ or by another client's hand
	}
	if err != nil {
		return r, fmt.Errorf("remove dead letter %d after re-enqueue: %w", d.Seq, err)
	}
	return r, nil
}

// jobHeaders is a job's headers, h, but jobq's own (Jobq-) and the
// server's (Nats-).
func jobHeaders(h nats.Header) map[string][]string {
	out := map[string][]string{}
	for k, v := range h {
		if !hasPrefixFold(k, "Jobq-") && !hasPrefixFold(k, "Nats-") {
			out[k] = v
		}
	}
	return out
}

// jobCopy is a job to publish to JOB again, as a re-drive or a requeue:
// its subject, payload and headers (see jobHeaders), under its job ID
// (Jobq-Job-Id) and a Nats-Msg-Id of the copy's own, which no job may take.
func jobCopy(subject string, payload []byte, header map[string][]string, id, msgID string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = payload
	for k, v := range header {
		m.Header[k] = v
	}
	m.Header.Set(HeaderJobID, id)
	m.Header.Set(nats.MsgIdHdr, msgID)
	return m
}

// removeDeadLetteredCopy deletes from JOB the very message d was made of,
// if it is still there: the pool or the sweep that stored d was stopped
// (kill -9) before it acked or deleted it. Left there, it was delivered
// again after the re-drive, whose record no longer named it as the copy
// dead-lettered already, and ran again. A message at d's sequence that is
// another job's is left alone, and so is a dead letter that does not say
// when its job was stored.
func removeDeadLetteredCopy(ctx context.Context, obj *Objects, d DeadLetter) error {
	if d.JobSeq == 0 || d.storedAt.IsZero() {
		return nil
	}
	m, err := obj.Jobs.GetMsg(ctx, d.JobSeq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("look for its dead-lettered copy in %s at sequence %d, which must not run again beside the re-drive: %w", StreamJob, d.JobSeq, err)
	}
	if jobID(m.Header, m.Sequence) != d.ID || !m.Time.Truncate(time.Millisecond).Equal(d.storedAt) {
		return nil
	}
	if err := deleteMsg(ctx, obj.Jobs, d.JobSeq); err != nil {
		return fmt.Errorf("remove its dead-lettered copy, still in %s at sequence %d: %w", StreamJob, d.JobSeq, err)
	}
	return nil
}

// Redrive is a dead letter re-enqueued: where JOB stored it, and the job ID
// it runs under. That is the dead letter's own, but for a job known by its
// JOB sequence (seq-N) of a JOB made anew since: its re-drive's own (see
// jobStreamAnewSince), jobq-retry-….
type Redrive struct {
	*jetstream.PubAck
	ID string
	// Done: the job's record said done when it was re-enqueued, so the
	// re-drive is acked without running.
	Done bool
}

// jobStreamAnewSince reports whether JOB was made anew since d's job was
// stored in it. A job known by its JOB sequence alone (seq-N) of a JOB since
// made anew shares that ID with the new JOB's job at its sequence, whose
// record would make one of the two be taken for the other, done, and acked
// unrun: its re-drive is known by its own Nats-Msg-Id (see retryID), which
// no job may take. d keeps when its job was stored to the millisecond, cut
// down: it is compared with JOB's creation to the millisecond, or a job
// stored in the millisecond JOB was created in would look older than JOB.
func jobStreamAnewSince(ctx context.Context, obj *Objects, d DeadLetter) (bool, error) {
	stored := d.storedAt
	if stored.IsZero() {
		stored = d.FailedAt // a job fails after it was stored
	}
	s, err := obj.JS.Stream(ctx, StreamJob)
	if err != nil {
		return false, fmt.Errorf("look up stream %s, to tell whether job %s is one of it: %w", StreamJob, d.ID, err)
	}
	if !stored.IsZero() && !stored.Before(s.CachedInfo().Created.Truncate(time.Millisecond)) {
		return false, nil
	}
	// Its stored time is unknown, or says older than JOB: a dead letter
	// written before it kept one, its Jobq-Failed-At from a worker whose
	// clock is behind the server's, a clock set back. JOB that still
	// holds the dead letter's very job (a copy whose removal was lost) was
	// not made anew, whatever the clocks say: its record must keep that
	// copy's sequence, for the copy to be told dead-lettered (see
	// data.Ledger.Claim). A named job's copy is known by its ID; a seq-N
	// job's, which any job at that sequence shares, only by its stored time.
	if d.JobSeq == 0 {
		return true, nil
	}
	m, err := s.GetMsg(ctx, d.JobSeq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("read %s at %d, to tell whether job %s is one of it: %w", StreamJob, d.JobSeq, d.ID, err)
	}
	if jobID(m.Header, m.Sequence) != d.ID {
		return true, nil
	}
	if !d.storedAt.IsZero() {
		// The very job was stored when d says: a job under the same ID
		// stored since (a named job published again into a JOB made
		// anew) is another copy, never dead-lettered.
		return m.Time.UnixMilli() != d.storedAt.UnixMilli(), nil
	}
	return data.IsSeqID(d.ID), nil
}

// retryIDPrefix starts the Nats-Msg-Id of a dead letter's re-drive, which
// ValidID keeps from jobs.
const retryIDPrefix = "jobq-retry-"

// retryID is the Nats-Msg-Id of d's re-drive: its DLQ sequence, and when it
// failed, should DLQ have been made anew and its sequences start over.
func retryID(d DeadLetter) string {
	return retryIDPrefix + strconv.FormatUint(d.Seq, 10) + "-" + strconv.FormatInt(d.FailedAt.UnixNano(), 10)
}

// PurgeDeadLetters deletes the dead letters stored when it begins, and
// returns how many it deleted, as the server counted them. One that a
// running pool stores meanwhile stays, to be seen: purged with the rest, it
// was deleted unreported.
func PurgeDeadLetters(ctx context.Context, obj *Objects) (uint64, error) {
	_, info, err := deadLetterInfo(ctx, obj)
	if err != nil || info == nil || info.State.Msgs == 0 {
		return 0, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opTimeout)
		defer cancel()
	}
	// The API itself: nats.go's Purge does not return the count.
	req, err := json.Marshal(jetstream.StreamPurgeRequest{Sequence: info.State.LastSeq + 1})
	if err != nil {
		return 0, err
	}
	msg, err := obj.JS.Conn().RequestWithContext(ctx, "$JS.API.STREAM.PURGE."+StreamDLQ, req)
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", StreamDLQ, err)
	}
	var resp struct {
		Purged uint64              `json:"purged"`
		Error  *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("purge %s: unreadable answer: %w", StreamDLQ, err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("purge %s: %w", StreamDLQ, resp.Error)
	}
	return resp.Purged, nil
}

// RemoveDeadLetter deletes dead letter d from DLQ for good: its job does
// not run again, and its ledger record stays as it was (failed), as
// PurgeDeadLetters leaves the records of all of them. A dead letter gone
// since it was found (re-driven or removed by another client) is
// ErrNoDeadLetter; one whose delete the server took without an answer
// that came back is removed.
func RemoveDeadLetter(ctx context.Context, obj *Objects, d DeadLetter) error {
	dead, err := deadStream(ctx, obj)
	if errors.Is(err, errDLQGone) {
		return fmt.Errorf("%w: DLQ seq %d (%w)", ErrNoDeadLetter, d.Seq, err)
	}
	if err != nil {
		return err
	}
	if !d.at.IsZero() {
		// No delete is conditional: what is at d.Seq is looked at first,
		// which leaves a moment for DLQ to be made anew in.
		m, err := dead.GetMsg(ctx, d.Seq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return removedMeanwhile(d.Seq)
		case err != nil:
			return fmt.Errorf("read %s: %w", StreamDLQ, err)
		case !m.Time.Equal(d.at):
			return fmt.Errorf("%w: DLQ seq %d holds another dead letter now, %s made anew since it was looked up (see jobq dlq list)", ErrNoDeadLetter, d.Seq, StreamDLQ)
		}
	}
	err = dead.DeleteMsg(ctx, d.Seq)
	if err == nil {
		return nil
	}
	if _, gerr := dead.GetMsg(ctx, d.Seq); errors.Is(gerr, jetstream.ErrMsgNotFound) {
		if !errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
			return nil // the server took the delete, and its answer was lost
		}
		return removedMeanwhile(d.Seq)
	}
	return fmt.Errorf("remove dead letter %d: %w", d.Seq, err)
}

// removedMeanwhile is the error for a dead letter at seq that another
// client removed (or re-drove) since it was looked up.
func removedMeanwhile(seq uint64) error {
	return fmt.Errorf("%w: DLQ seq %d was removed meanwhile, by another client (see jobq dlq list)", ErrNoDeadLetter, seq)
}

// RemoveDeadLettersOf deletes every dead letter of job id stored when it
// begins, as RemoveDeadLetter does, and returns those it deleted, read
// without their payloads. One that another client removed meanwhile is
// left out; none at all is ErrNoDeadLetter.
func RemoveDeadLettersOf(ctx context.Context, obj *Objects, id string) ([]DeadLetter, error) {
	if id == "" {
		return nil, fmt.Errorf("%w: the job ID is empty", ErrNoDeadLetter)
	}
	var found []DeadLetter
	err := eachDeadLetterSummary(ctx, obj, 0, func(d DeadLetter) error { // their headers only
		if d.ID == id {
			found = append(found, d)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	removed := []DeadLetter{}
	for _, d := range found {
		switch err := RemoveDeadLetter(ctx, obj, d); {
		case errors.Is(err, ErrNoDeadLetter):
		case err != nil:
			return removed, fmt.Errorf("%w; %d of job %s's %d dead letters were removed before it, the others are still in %s (see jobq dlq list)", err, len(removed), id, len(found), StreamDLQ)
		default:
			removed = append(removed, d)
		}
	}
	if len(removed) == 0 {
		return nil, fmt.Errorf("%w: %q (see jobq dlq list)", ErrNoDeadLetter, id)
	}
	return removed, nil
}

// errDLQGone: DLQ was deleted, and holds no dead letters until a pool makes
// it again.
var errDLQGone = errors.New("stream " + StreamDLQ + " was deleted: it holds no dead letters until jobq serve makes it again, with the next dead letter or at its next start")

// deadStream is obj's DLQ: Dead, or, if Open found DLQ deleted, DLQ looked
// up again, since a pool may have made it anew; errDLQGone while it is
// still gone.
func deadStream(ctx context.Context, obj *Objects) (jetstream.Stream, error) {
	if obj.Dead != nil {
		return obj.Dead, nil
	}
	s, err := obj.JS.Stream(ctx, StreamDLQ)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, errDLQGone
	case err != nil:
		return nil, fmt.Errorf("look up stream %s: %w", StreamDLQ, err)
	}
	return s, nil
}

// deadLetterInfo reads DLQ's info; both nil, and no error, if DLQ was
// deleted: it holds no dead letters.
func deadLetterInfo(ctx context.Context, obj *Objects) (jetstream.Stream, *jetstream.StreamInfo, error) {
	dead, err := deadStream(ctx, obj)
	if errors.Is(err, errDLQGone) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	info, err := dead.Info(ctx)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, nil, nil
	case err != nil:
		return nil, nil, fmt.Errorf("read %s: %w", StreamDLQ, err)
	}
	return dead, info, nil
}

// DeadLetterCount returns how many dead letters DLQ holds: none if it was
// deleted.
func DeadLetterCount(ctx context.Context, obj *Objects) (uint64, error) {
	_, info, err := deadLetterInfo(ctx, obj)
	if err != nil || info == nil {
		return 0, err
	}
	return info.State.Msgs, nil
}
