package queue

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// ErrMalformed is returned by Import in strict mode for the first line that
// is not a valid job.
var ErrMalformed = errors.New("malformed line")

// Defaults of ImportOptions.
const (
	DefaultImportWindow    = 256
	DefaultImportMaxErrors = 20
)

// ImportOptions configures Import. Zero fields take their defaults.
type ImportOptions struct {
	// Window bounds the publishes waiting for their ack. Defaults to 256.
	Window int
	// Strict stops at the first malformed line, before anything after it is
	// published, and returns an error wrapping ErrMalformed. Otherwise
	// malformed lines are counted, listed and skipped.
	Strict bool
	// AckTimeout bounds the wait for one publish's ack; a publish whose ack
	// did not come is retried with the same ID, so it is stored once.
	// Defaults to 5s.
	AckTimeout time.Duration
	// MaxErrors is how many failed lines ImportSummary.Errors lists, those
	// with the lowest line numbers. Defaults to 20.
	MaxErrors int
	// Progress, if set, is called with the counts so far at most every
	// ProgressInterval, and once at the end. Its Errors are nil.
	Progress func(ImportSummary)
	// ProgressInterval defaults to 1s.
	ProgressInterval time.Duration
}

func (o ImportOptions) withDefaults() ImportOptions {
	if o.Window <= 0 {
		o.Window = DefaultImportWindow
	}
	if o.AckTimeout <= 0 {
		o.AckTimeout = 5 * time.Second
	}
	if o.MaxErrors <= 0 {
		o.MaxErrors = DefaultImportMaxErrors
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = time.Second
	}
	return o
}

// ImportSummary counts what Import did with its input's lines. Blank lines
// are not counted.
type ImportSummary struct {
	// Lines is how many job lines were read.
	Lines int `json:"lines"`
	// Stored jobs are new in JOB; Duplicates were stored before under the
	// same ID, inside the dedupe window.
	Stored     int `json:"stored"`
	Duplicates int `json:"duplicates"`
	// Malformed lines were skipped; Failed lines were valid jobs whose
	// publish failed (JOB full, server gone).
	Malformed int `json:"malformed"`
	Failed    int `json:"failed"`
	// Errors lists the failed lines with the lowest line numbers, at most
	// ImportOptions.MaxErrors.
	Errors []LineError `json:"errors"`
}

// Done is how many lines are settled: stored, duplicate, malformed or
// failed.
func (s ImportSummary) Done() int { return s.Stored + s.Duplicates + s.Malformed + s.Failed }

// LineError is a line of the input that was not stored, and why.
type LineError struct {
	// Line is the line's number in the input, from 1, blank lines included.
	Line int `json:"line"`
	// Malformed is set for a line that is not a valid job, clear for a
	// publish that failed.
	Malformed bool   `json:"malformed"`
	Reason    string `json:"reason"`
}

// Import publishes one job per line of r, NDJSON: a JSON object with
// "subject" (required), "id" (the job ID; default a fresh one), "payload" (a
// string stored as is, or an object or array stored as compact JSON),
// "payload_base64" instead of payload for binary data, and "headers" (an
// object of strings or arrays of strings). Blank lines are skipped.
//
// Publishes are asynchronous, at most Window waiting for their ack; a lost
// ack is retried with the same ID. Import returns when every publish is
// settled. The error is nil unless reading r failed, ctx ended, or a line is
// malformed in strict mode; failed lines are in the summary.
func Import(ctx context.Context, p *Producer, r io.Reader, opts ImportOptions) (ImportSummary, error) {
	opts = opts.withDefaults()
	// A publisher of its own whose futures time out after AckTimeout, so
	// that waiting for one never hangs.
	async, err := data.NewPublisher(p.js.Conn(), data.PublisherOptions{Timeout: opts.AckTimeout, MaxPending: opts.Window + 1, FailOnReconnect: true, NoResponderRetries: 2})
	if err != nil {
		return ImportSummary{}, fmt.Errorf("start publishing: %w", err)
	}
	defer async.Close()
	im := &importer{p: p, opts: opts, ring: make([]published, opts.Window), last: time.Now()}
	defer func() {
		if im.endSettling != nil {
			im.endSettling()
		}
	}()

	// While the input keeps Import waiting, the publishes whose acks were
	// lost are re-sent still, before JOB's dedupe window forgets their
	// first send: a re-send after it would store the job again.
	in := &ctxReader{ctx: ctx, r: r, done: make(chan struct{}), idle: func() { im.settleReady(ctx) }, every: max(min(opts.AckTimeout, time.Second), 10*time.Millisecond)}
	defer close(in.done)
	br := bufio.NewReaderSize(in, 64<<10)
	// A line holds at most the payload JSON-escaped (\u0000 is six bytes
	// for one) and its headers.
	limit := 6*min(p.maxPayload, 64<<20) + 64<<10
	var buf []byte
	var stop error
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			stop = fmt.Errorf("import stopped at line %d: %w", n, err)
			break
		}
		if p.js.Conn().IsClosed() {
			// Every line from here on would fail the same way, one by one.
			stop = fmt.Errorf("import stopped at line %d: %w; the lines from there on were not sent: once the server is back, run the same input again (lines with an id are stored once)", n, nats.ErrConnectionClosed)
			break
		}
		if im.silent != nil {
			// So would every line from here on, each after its own
			// retries: hours for a large input.
			stop = fmt.Errorf("import stopped at line %d: %w; the lines from there on were not sent: once %s answers, run the same input again (lines with an id are stored once)", n, im.silent, StreamJob)
			if errors.As(im.silent, new(pastWindowError)) {
				// Run again, that line would be sent past its window.
				stop = fmt.Errorf("import stopped at line %d: %w; the lines from there on were not sent: once %s answers, send the input from line %d on, not the lines before it", n, im.silent, StreamJob, n)
			}
			break
		}
		im.settleReady(ctx)
		line, tooLong, err := readLine(br, buf[:0], limit)
		buf = line
		if n == 1 {
			// A byte order mark, as Windows tools write: not part of
			// the first line's JSON.
			line = bytes.TrimPrefix(line, []byte("\uFEFF"))
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && ctx.Err() != nil {
			stop = fmt.Errorf("import stopped at line %d: %w", n, ctx.Err())
			break
		}
		if err != nil {
			stop = fmt.Errorf("read line %d: %w", n, err)
			break
		}
		if blank(line) && !tooLong {
			continue
		}
		im.sum.Lines++
		var job importJob
		var f jetstream.PubAckFuture
		var sent time.Time
		malformed := true // unless the publish failed, as below
		if tooLong {
			err = fmt.Errorf("line too long: over %d bytes", limit)
		} else if job, err = p.parseImportLine(line); err == nil {
			if im.count == len(im.ring) {
				im.settleOldest(ctx)
			}
			sent = time.Now()
			f, err = p.enqueueAsyncOn(async, job.subject, job.payload, job.opts)
			malformed = lineRefused(err)
		}
		if err != nil && !malformed {
			im.sum.Failed++
			im.addError(LineError{Line: n, Reason: err.Error()})
			continue
		}
		if err != nil {
			im.sum.Malformed++
			im.addError(LineError{Line: n, Malformed: true, Reason: err.Error()})
			if opts.Strict {
				stop = fmt.Errorf("%w: line %d: %w; nothing after it was published (--strict)", ErrMalformed, n, err)
				break
			}
			im.progress(false)
			continue
		}
		im.ring[(im.head+im.count)%len(im.ring)] = published{line: n, f: f, sent: sent}
		im.count++
		im.progress(false)
	}
	for im.count > 0 {
		im.settleOldest(ctx)
	}
	im.progress(true)
	return im.sum, stop
}

// lineRefused reports whether err refuses the line itself, however often
// it is sent: its payload too large for JOB (the server's limit may be
// under --max-payload), or a bad ID or header. Such a line is malformed,
// not failed.
func lineRefused(err error) bool {
	return errors.Is(err, ErrPayloadTooLarge) || errors.Is(err, ErrBadID) || errors.Is(err, ErrBadHeader)
}

// CountLines returns how many lines of r Import would read as jobs: those
// that are not blank.
func CountLines(r io.Reader) (int, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	n := 0
	content := false
	for {
		b, err := br.ReadByte()
		if err == io.EOF {
			if content {
				n++
			}
			return n, nil
		}
		if err != nil {
			return n, err
		}
		switch b {
		case '\n':
			if content {
				n++
			}
			content = false
		case ' ', '\t', '\r':
		default:
			content = true
		}
	}
}

// importer is the state of one Import.
type importer struct {
	p    *Producer
	opts ImportOptions
	sum  ImportSummary
	last time.Time // of the last progress call

	// ring holds the publishes waiting for their ack, oldest at head.
	ring        []published
	head, count int

	// settling bounds, once the import was stopped, the re-sends of the
	// lines whose acks are late, all of them together (see settleOldest).
	settling    context.Context
	endSettling context.CancelFunc
	// silent is the first line whose re-sends JOB did not acknowledge
	// either: the import stops there (see Import).
	silent error
}

type published struct {
	line int
	f    jetstream.PubAckFuture
	sent time.Time // when it was first sent
}

// settleOldest waits for the oldest publish's ack and counts it. A lost ack
// is retried with the same ID, synchronously, so the job is stored once.
func (im *importer) settleOldest(ctx context.Context) {
	pub := im.ring[im.head]
	var ack *jetstream.PubAck
	var err error
	select {
	case ack = <-pub.f.Ok():
	case err = <-pub.f.Err():
	}
	im.settle(ctx, ack, err)
}

// settleReady settles the oldest publishes whose outcome is in, without
// waiting for the others: a lost ack is re-sent as soon as it is known
// lost, not once the window is full or the input ends.
func (im *importer) settleReady(ctx context.Context) {
	for im.count > 0 && im.silent == nil {
		pub := im.ring[im.head]
		select {
		case ack := <-pub.f.Ok():
			im.settle(ctx, ack, nil)
		case err := <-pub.f.Err():
			im.settle(ctx, nil, err)
		default:
			return
		}
	}
}

// settle counts the oldest publish, whose outcome is ack or err.
func (im *importer) settle(ctx context.Context, ack *jetstream.PubAck, err error) {
	pub := im.ring[im.head]
	im.ring[im.head] = published{}
	im.head = (im.head + 1) % len(im.ring)
	im.count--
	msg := pub.f.Msg()
	id := msg.Header.Get(nats.MsgIdHdr)
	switch {
	case err == nil && ack.Stream != StreamJob:
		err = fmt.Errorf("enqueue job %s on %s: stored in stream %s, not %s; another stream captures this subject", id, msg.Subject, ack.Stream, StreamJob)
	case err == nil:
		if !ack.Duplicate {
			im.p.metrics.jobEnqueued(msg.Subject)
		}
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout) || retryable(err):
		// Enqueue retries, says what failed and counts its metrics. After
		// a stop (Ctrl-C) the lines are settled still, all within one
		// bound: with the stopped ctx the re-send would fail at once, and
		// a job JOB holds be summed up as failed.
		// So do the lines after one whose re-sends JOB did not answer.
		rctx := ctx
		if ctx.Err() != nil || im.silent != nil {
			if im.settling == nil {
				im.settling, im.endSettling = context.WithTimeout(context.WithoutCancel(ctx), max(im.opts.AckTimeout, time.Second))
			}
			rctx = im.settling
		}
		ack, err = im.p.enqueueSince(rctx, msg.Subject, msg.Data, EnqueueOptions{ID: id, Header: msg.Header}, pub.sent)
		if err != nil && retryable(err) && im.silent == nil {
			im.silent = fmt.Errorf("line %d: %w", pub.line, err)
		}
	case isFull(err):
		err = fmt.Errorf("enqueue job %s on %s: %w (%w); stored jobs are kept: wait for workers to drain %s, or raise --max-store", id, msg.Subject, ErrFull, err, StreamJob)
	default:
		err = fmt.Errorf("enqueue job %s on %s: %w", id, msg.Subject, err)
	}
	switch {
	case err != nil:
		im.sum.Failed++
		im.addError(LineError{Line: pub.line, Reason: err.Error()})
	case ack.Duplicate:
		// A re-sent line found stored may be its own first send, whose
		// ack was lost: JOB holds it once either way.
		im.sum.Duplicates++
	default:
		im.sum.Stored++
	}
	im.progress(false)
}

// addError keeps the failed lines with the lowest numbers.
func (im *importer) addError(e LineError) {
	errs := im.sum.Errors
	i, _ := slices.BinarySearchFunc(errs, e.Line, func(x LineError, line int) int { return x.Line - line })
	if i >= im.opts.MaxErrors {
		return
	}
	errs = slices.Insert(errs, i, e)
	if len(errs) > im.opts.MaxErrors {
		errs = errs[:im.opts.MaxErrors]
	}
	im.sum.Errors = errs
}

func (im *importer) progress(final bool) {
	if im.opts.Progress == nil {
		return
	}
	if now := time.Now(); final || now.Sub(im.last) >= im.opts.ProgressInterval {
		im.last = now
		s := im.sum
		s.Errors = nil
		im.opts.Progress(s)
	}
}

// importJob is one parsed line.
type importJob struct {
	subject string
	payload []byte
	opts    EnqueueOptions
}

// parseImportLine checks one line as Enqueue would and builds its job.
func (p *Producer) parseImportLine(line []byte) (importJob, error) {
	var job importJob
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return job, errors.New("not a JSON object")
	}
	// Go's JSON decoder turns each byte that is not UTF-8 into U+FFFD: two
	// IDs in another encoding would become one job, and a payload change.
	if !utf8.Valid(line) {
		return job, errors.New("not valid UTF-8: convert the line to UTF-8; binary data goes in payload_base64")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(line, &fields); err != nil {
		return job, fmt.Errorf("invalid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if k, twice := givenTwice(line, len(fields)); twice {
		return job, fmt.Errorf("field %q given twice: give each once", k)
	}
	str := func(name string, raw json.RawMessage) (string, error) {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("%s: want a string", name)
		}
		return s, keptAsIs(name, raw)
	}
	var err error
	var hasPayload, hasBase64 bool
	for _, name := range slices.Sorted(maps.Keys(fields)) { // the first problem, always the same
		raw := fields[name]
		switch name {
		case "subject":
			if job.subject, err = str(name, raw); err != nil {
				return job, err
			}
		case "id":
			if job.opts.ID, err = str(name, raw); err != nil {
				return job, err
			}
			// As enqueue's --id '': a fresh ID for it, on each run of the
			// same input, would store the job again each time.
			if job.opts.ID == "" {
				return job, errors.New("id is empty (or null); leave the field out for a fresh ID")
			}
		case "payload":
			hasPayload = true
			switch raw[0] {
			case '"':
				s, err := str(name, raw)
				if err != nil {
					return job, err
				}
				job.payload = []byte(s)
			case '{', '[':
				var b bytes.Buffer
				if err := json.Compact(&b, raw); err != nil {
					return job, fmt.Errorf("payload: %w", err)
				}
				job.payload = b.Bytes()
			case 'n': // null: no payload
			default:
				return job, errors.New("payload: want a string, an object or an array; binary data goes in payload_base64")
			}
		case "payload_base64":
			hasBase64 = true
			s, err := str(name, raw)
			if err != nil {
				return job, err
			}
			if job.payload, err = base64.StdEncoding.DecodeString(s); err != nil {
				return job, fmt.Errorf("payload_base64: not standard base64: %w", err)
			}
		case "headers":
			if job.opts.Header, err = parseHeaders(raw); err != nil {
				return job, err
			}
		default:
			return job, fmt.Errorf("unknown field %q: want subject, id, payload, payload_base64 or headers", name)
		}
	}
	switch {
	case hasPayload && hasBase64:
		return job, errors.New("give payload or payload_base64, not both")
	case job.subject == "":
		return job, errors.New("missing subject")
	}
	if err := handlers.ValidSubject(job.subject); err != nil {
		return job, err
	}
	if len(job.payload) > p.maxPayload {
		return job, fmt.Errorf("%w: %d bytes, the limit is %d (--max-payload)", ErrPayloadTooLarge, len(job.payload), p.maxPayload)
	}
	if job.opts.ID != "" {
		if err := ValidID(job.opts.ID); err != nil {
			return job, err
		}
	}
	if err := ValidHeader(job.opts.Header); err != nil {
		return job, err
	}
	return job, nil
}

// parseHeaders reads an object of strings or arrays of strings.
func parseHeaders(raw json.RawMessage) (nats.Header, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, errors.New("headers: want an object of strings or arrays of strings")
	}
	if k, twice := givenTwice(raw, len(fields)); twice {
		return nil, fmt.Errorf("headers: %q given twice: give its values once, as an array", k)
	}
	h := nats.Header{}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		v := fields[k]
		if !headerName(k) {
			return nil, fmt.Errorf("headers: invalid name %q: a header name is letters, digits and !#$%%&'*+-.^_`|~ only", k)
		}
		if hasPrefixFold(k, "Nats-") {
			return nil, fmt.Errorf("headers: %q is reserved for NATS; set the job ID with the id field", k)
		}
		var values []string
		var one string
		if err := json.Unmarshal(v, &one); err == nil {
			values = []string{one}
		} else if err := json.Unmarshal(v, &values); err != nil || values == nil {
			return nil, fmt.Errorf("headers: %s: want a string or an array of strings", k)
		}
		for _, s := range values {
			if err := keptAsIs("headers: "+k, v); err != nil {
				return nil, err
			}
			if strings.ContainsAny(s, "\r\n") {
				return nil, fmt.Errorf("headers: %s: a value cannot hold a line break", k)
			}
			h.Add(k, s)
		}
	}
	return h, nil
}

// ctxReader reads r on a goroutine of its own, one Read at a time as they
// are asked for, so that a Read waiting for input that does not come (a
// pipe, a terminal) ends when ctx does. That Read of r then returns in its
// own time, and its data goes unread; the goroutine ends after it, or once
// done is closed.
type ctxReader struct {
	ctx      context.Context
	r        io.Reader
	done     chan struct{}
	reqs     chan int       // a read of up to n bytes, asked for
	res      chan readChunk // its outcome, in the goroutine's own buffer
	inFlight bool           // a read was asked for and not answered
	// idle, if set, runs every so often while a read waits for input.
	idle  func()
	every time.Duration
}

type readChunk struct {
	data []byte
	err  error
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if c.reqs == nil {
		c.reqs, c.res = make(chan int), make(chan readChunk, 1)
		go c.pump()
	}
	if !c.inFlight {
		if err := c.ctx.Err(); err != nil {
			return 0, err // no read of r starts once ctx ended
		}
		select {
		case c.reqs <- len(p):
			c.inFlight = true
		case <-c.ctx.Done():
			return 0, c.ctx.Err()
		}
	}
	var tick <-chan time.Time
	if c.idle != nil {
		t := time.NewTicker(c.every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ch := <-c.res:
			c.inFlight = false
			return copy(p, ch.data), ch.err
		case <-c.ctx.Done():
			return 0, c.ctx.Err()
		case <-tick:
			c.idle()
		}
	}
}

// pump reads r when asked to, into a buffer it reuses: Read copies the
// data out before it asks for the next read.
func (c *ctxReader) pump() {
	var buf []byte
	for {
		select {
		case n := <-c.reqs:
			if cap(buf) < n {
				buf = make([]byte, n)
			}
			m, err := c.r.Read(buf[:n])
			c.res <- readChunk{buf[:m], err}
		case <-c.done:
			return
		}
	}
}

// givenTwice reports a key that the JSON object obj, which holds n distinct
// keys, gives twice: Go's decoder keeps the last value of such a key, so
// the job would silently be other than what one of them says.
func givenTwice(obj []byte, n int) (string, bool) {
	if topLevelKeys(obj) == n {
		return "", false
	}
	dec := json.NewDecoder(bytes.NewReader(obj))
	if _, err := dec.Token(); err != nil { // {
		return "", false
	}
	seen := make(map[string]bool, n)
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return "", false
		}
		k, _ := t.(string)
		if seen[k] {
			return k, true
		}
		seen[k] = true
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return "", false
		}
	}
	return "", false
}

// topLevelKeys counts the keys of the valid JSON object obj, as given: a
// key given twice counts twice.
func topLevelKeys(obj []byte) int {
	n, depth := 0, 0
	for i := 0; i < len(obj); i++ {
		switch obj[i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case '"':
			for i++; i < len(obj) && obj[i] != '"'; i++ {
				if obj[i] == '\\' {
					i++
				}
			}
			if depth != 1 {
				continue
			}
			j := i + 1
			for j < len(obj) && (obj[j] == ' ' || obj[j] == '\t' || obj[j] == '\n' || obj[j] == '\r') {
				j++
			}
			if j < len(obj) && obj[j] == ':' {
				n++
			}
		}
	}
	return n
}

// keptAsIs checks that the JSON string raw of field name holds no escaped
// half of a surrogate pair without its other half (\ud800): Go's JSON
// decoder turns one into U+FFFD rather than refuse it, so that two IDs
// would become one.
func keptAsIs(name string, raw json.RawMessage) error {
	for i := 0; i < len(raw)-1; i++ {
		if raw[i] != '\\' {
			continue
		}
		i++ // the escaped character
		if raw[i] != 'u' || i+4 >= len(raw) {
			continue
		}
		r := surrogate(raw[i+1 : i+5])
		switch {
		case r >= 0xd800 && r < 0xdc00 && i+10 < len(raw) && raw[i+5] == '\\' && raw[i+6] == 'u':
			if low := surrogate(raw[i+7 : i+11]); low >= 0xdc00 && low < 0xe000 {
				i += 10 // the pair
				continue
			}
			fallthrough
		case r >= 0xd800 && r < 0xe000:
			return fmt.Errorf("%s: an unpaired surrogate escape (\\uD800 to \\uDFFF), which would be stored as U+FFFD; binary data goes in payload_base64", name)
		}
		i += 4
	}
	return nil
}

// surrogate reads four hex digits; -1 if they are not.
func surrogate(hex []byte) int {
	r := 0
	for _, c := range hex {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | int(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | int(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | int(c-'A'+10)
		default:
			return -1
		}
	}
	return r
}

// readLine reads one line into buf, without its line end. A line longer
// than limit is read to its end and returned empty with tooLong set. It
// returns io.EOF only when no line is left.
func readLine(br *bufio.Reader, buf []byte, limit int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > limit+2 { // room for "\r\n"
				tooLong, buf = true, buf[:0]
			} else {
				buf = append(buf, chunk...)
			}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && (len(buf) > 0 || tooLong):
			return bytes.TrimRight(buf, "\r\n"), tooLong, nil
		case err != nil:
			return buf, tooLong, err
		}
		return bytes.TrimRight(buf, "\r\n"), tooLong, nil
	}
}

// blank reports a line of spaces and tabs only.
func blank(line []byte) bool {
	return len(bytes.Trim(line, " \t\r")) == 0
}
