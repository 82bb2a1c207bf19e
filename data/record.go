package data

import (
	"encoding/json"
	"errors"
	"fmt"
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
}

// ErrCorruptRecord is returned for a ledger value that is not a Record.
var ErrCorruptRecord = errors.New("corrupt ledger record")

func (r Record) encode() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic(fmt.Sprintf("encode ledger record: %v", err)) // only plain fields: cannot fail
	}
	return b
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
