package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Record is a job's entry in the processed bucket: one per job ID, rewritten
// at every step of the job's life. It holds no payload.
type Record struct {
	ID      string `json:"id"`
	State   State  `json:"state"`
	Subject string `json:"subject,omitempty"`
	// Seq is the stream sequence of the message last claimed under this ID.
	Seq uint64 `json:"seq,omitempty"`
	// Attempts counts the times a handler was started for this ID.
	Attempts int `json:"attempts"`
	// Worker names the worker holding or last holding the job.
	Worker string `json:"worker,omitempty"`
	// Lease names the pool lease (its owner) that the job ran on, on a
	// record written through the prepared claim of that run (see Prepare):
	// a record written after that lease's write says that the run is over,
	// even while the stored lease still lists the job (see
	// Snapshot.Holder).
	Lease string `json:"lease,omitempty"`
	// Resumed is set on a claim that took over from an attempt that never
	// recorded an outcome.
	Resumed bool `json:"resumed,omitempty"`
	// LeaseUntil is when a running claim expires unless renewed.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	FirstAt    time.Time `json:"first_at,omitzero"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Took is how long the last finished attempt ran.
	Took      time.Duration `json:"took_ns,omitempty"`
	LastError string        `json:"last_error,omitempty"`
	// StoredAt is when the copy of the job whose outcome the record
	// tells was stored in JOB (see Record.DeadLettered); for a job known
	// by its stream sequence (SeqID) alone it also tells the job's
	// records from those of an earlier JOB's job at the same sequence
	// (see Ledger.Earlier). Both it and JOB's creation are the server's
	// times. Records written before it was kept for every job have it
	// for SeqID jobs only.
	StoredAt time.Time `json:"stored_at,omitzero"`
}

// ErrCorruptRecord is returned for a ledger value that is not a Record.
var ErrCorruptRecord = errors.New("corrupt ledger record")

// encode writes r as the JSON that encoding/json would, without its
// reflection: a record is written twice per job, on the hot path.
func (r Record) encode() []byte { return r.appendTo(make([]byte, 0, 256)) }

// appendTo appends r's JSON encoding to b.
func (r Record) appendTo(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = appendString(b, r.ID)
	b = append(b, `,"state":`...)
	b = appendString(b, string(r.State))
	if r.Subject != "" {
		b = append(b, `,"subject":`...)
		b = appendString(b, r.Subject)
	}
	if r.Seq != 0 {
		b = append(b, `,"seq":`...)
		b = strconv.AppendUint(b, r.Seq, 10)
	}
	b = append(b, `,"attempts":`...)
	b = strconv.AppendInt(b, int64(r.Attempts), 10)
	if r.Worker != "" {
		b = append(b, `,"worker":`...)
		b = appendString(b, r.Worker)
	}
	if r.Lease != "" {
		b = append(b, `,"lease":`...)
		b = appendString(b, r.Lease)
	}
	if r.Resumed {
		b = append(b, `,"resumed":true`...)
	}
	b = appendTime(b, `,"lease_until":`, r.LeaseUntil)
	b = appendTime(b, `,"first_at":`, r.FirstAt)
	b = appendTime(b, `,"started_at":`, r.StartedAt)
	b = appendTime(b, `,"finished_at":`, r.FinishedAt)
	if r.Took != 0 {
		b = append(b, `,"took_ns":`...)
		b = strconv.AppendInt(b, int64(r.Took), 10)
	}
	if r.LastError != "" {
		b = append(b, `,"last_error":`...)
		b = appendString(b, r.LastError)
	}
	b = appendTime(b, `,"stored_at":`, r.StoredAt)
	return append(b, '}')
}

func appendTime(b []byte, field string, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	b = append(b, field...)
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendString appends s as a JSON string. Plain text is copied as is;
// anything that needs escaping goes through encoding/json.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func decodeRecord(b []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("%w: %w", ErrCorruptRecord, err)
	}
	switch r.State {
	case StateRunning, StateRetrying, StateDone, StateFailed:
		return r, nil
	}
	return Record{}, fmt.Errorf("%w: unknown state %q", ErrCorruptRecord, r.State)
}
