package data

import (
	"strconv"
	"strings"
	"time"
)

// Job is one unit of work as a handler sees it. It is built from a stream
// message by the queue and carries no NATS types, so handlers can be tested
// without a server.
type Job struct {
	// ID identifies the job across deliveries and republishes: the message's
	// Nats-Msg-Id, or SeqID(Seq) when it was published without one.
	ID string
	// Subject is the subject the job was published on, under "job.".
	Subject string
	// Seq is the job's sequence in the JOB stream.
	Seq uint64
	// Attempt counts deliveries of this message, starting at 1.
	Attempt int
	// Resumed reports that an earlier attempt claimed this job and never
	// recorded an outcome: it may have had effects before it stopped.
	Resumed bool
	// Payload is the job's body as published.
	Payload []byte
	// Header holds the message headers as published.
	Header map[string][]string
	// EnqueuedAt is when the stream stored the job.
	EnqueuedAt time.Time
}

// State is where a job is in its life, as recorded in the ledger.
type State string

// The states a ledger record can hold. A job without a record is pending.
const (
	StatePending  State = "pending"  // stored, not yet claimed (no record)
	StateRunning  State = "running"  // claimed by a worker whose lease may be live
	StateRetrying State = "retrying" // an attempt failed; the job waits for redelivery
	StateDone     State = "done"     // completion recorded; never handed out again
	StateFailed   State = "failed"   // dead-lettered with its last error
)

// seqIDPrefix starts the ID of a job published without a Nats-Msg-Id.
const seqIDPrefix = "seq-"

// SeqID returns the ID of a job published without a Nats-Msg-Id: "seq-" and
// its stream sequence.
func SeqID(seq uint64) string { return seqIDPrefix + strconv.FormatUint(seq, 10) }

// IsSeqID reports whether id has the form of a SeqID: "seq-" and digits.
// Such IDs are not for jobs that carry one of their own.
func IsSeqID(id string) bool {
	digits, ok := strings.CutPrefix(id, seqIDPrefix)
	if !ok || digits == "" {
		return false
	}
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// HeaderValue returns the first value of header key, or "".
func (j *Job) HeaderValue(key string) string {
	if v := j.Header[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range j.Header {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}
