package data

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The async writes below are the ledger's hot path: a claim and a completion
// are published to the bucket's subject with the revision they expect
// (Nats-Expected-Last-Subject-Sequence), the same compare-and-set as
// KeyValue.Create and Update, but without waiting for the reply, so a worker
// pool keeps many jobs' writes in flight. Anything but the plain case (a
// record already there, a stale revision) falls back to the synchronous
// methods, which decide it.

// PendingClaim is a claim on its way to the bucket.
type PendingClaim struct {
	l      *Ledger
	job    *Job
	worker string
	claim  Claim
	ack    *Ack
}

// ClaimAsync starts claiming job for worker, assuming it has no record yet.
// Wait returns what Claim would.
func (l *Ledger) ClaimAsync(job *Job, worker string) (*PendingClaim, error) {
	rec := l.newClaimRecord(job, worker)
	pc := &PendingClaim{l: l, job: job, worker: worker, claim: Claim{Key: Key(job.ID), Record: rec}}
	if l.js == nil {
		return pc, nil
	}
	a, err := l.publish(pc.claim.Key, rec, 0)
	if err != nil {
		return nil, fmt.Errorf("claim job %s: %w", job.ID, err)
	}
	pc.ack = a
	return pc, nil
}

// Wait waits for the claim's outcome, falling back to Claim when the job
// already has a record.
func (pc *PendingClaim) Wait(ctx context.Context) (Claim, error) {
	if pc.ack == nil {
		return pc.l.Claim(ctx, pc.job, pc.worker)
	}
	seq, err := waitAck(ctx, pc.ack)
	if err == nil {
		pc.claim.Revision = seq
		pc.job.Resumed = pc.claim.Record.Resumed
		return pc.claim, nil
	}
	if isWrongLastSeq(err) {
		return pc.l.Claim(ctx, pc.job, pc.worker)
	}
	return pc.claim, fmt.Errorf("claim job %s: %w", pc.job.ID, err)
}

// PendingWrite is a record update on its way to the bucket.
type PendingWrite struct {
	l    *Ledger
	c    *Claim
	next Record
	ack  *Ack
}

// DoneAsync starts recording the job's completion. Wait returns what Done
// would; on success it advances c. A write that could not be sent is
// answered with why, as one the ledger refused (see Again).
func (l *Ledger) DoneAsync(c *Claim, took time.Duration) (*PendingWrite, error) {
	next := c.Record
	next.State, next.Took, next.LastError = StateDone, took, ""
	next.FinishedAt = time.Now().UTC()
	next.LeaseUntil = time.Time{}
	pw := &PendingWrite{l: l, c: c, next: next}
	if l.js == nil {
		return pw, nil
	}
	a, err := l.publish(c.Key, next, c.Revision)
	if err != nil {
		// Not sent (the connection's buffer full while it reconnects,
		// say): that is the write's answer, and the caller writes again
		// as for a write the ledger did not answer (see Again), rather
		// than give up the record of a job whose handler succeeded.
		a = &Ack{done: make(chan struct{})}
		a.resolve(jetstream.PubAck{}, err)
	}
	pw.ack = a
	return pw, nil
}

// Wait waits for the write; ErrClaimLost means another worker holds the job.
// A write the ledger refused or did not answer is tried once more (see
// Again).
func (pw *PendingWrite) Wait(ctx context.Context) error {
	err := pw.WaitOnce(ctx)
	if err == nil || errors.Is(err, ErrClaimLost) || pw.ack == nil {
		return err
	}
	// Lost on the way or refused: try once more, synchronously.
	return pw.Again(ctx)
}

// WaitOnce waits for the write's answer only. An error other than
// ErrClaimLost means that the ledger refused the write or did not answer;
// Again decides then.
func (pw *PendingWrite) WaitOnce(ctx context.Context) error {
	if pw.ack == nil {
		return pw.l.update(ctx, pw.c, pw.next)
	}
	seq, err := waitAck(ctx, pw.ack)
	switch {
	case err == nil:
		pw.c.Revision, pw.c.Record = seq, pw.next
		return nil
	case isWrongLastSeq(err):
		return fmt.Errorf("record job %s %s: %w: %w", pw.next.ID, pw.next.State, ErrClaimLost, err)
	}
	return fmt.Errorf("record job %s %s: %w", pw.next.ID, pw.next.State, err)
}

// Again writes the record once more, synchronously, after WaitOnce failed
// with an error other than ErrClaimLost: the ledger refused the write or
// did not answer. A write whose answer was lost may have landed (see
// Recheck).
func (pw *PendingWrite) Again(ctx context.Context) error {
	return pw.Recheck(ctx, pw.l.update(ctx, pw.c, pw.next))
}

// Recheck looks at the record that made the write fail with err, if err
// wraps ErrClaimLost: one that is this very write, whose answer was lost,
// counts as written; one that is the claim's own renewal, whose answer was
// lost, is written over. Any other record is another holder's: err stands.
func (pw *PendingWrite) Recheck(ctx context.Context, err error) error {
	if !errors.Is(err, ErrClaimLost) {
		return err
	}
	entry, gerr := pw.l.kv.Get(ctx, pw.c.Key)
	switch {
	case gerr != nil:
		return err
	case bytes.Equal(entry.Value(), pw.next.encode()):
		pw.c.Revision, pw.c.Record = entry.Revision(), pw.next
		return nil
	case !adoptRenewal(pw.c, entry):
		return err
	}
	return pw.l.update(ctx, pw.c, pw.next)
}

// adoptRenewal reports whether entry is c's own renewal, whose answer was
// lost, and if it is, takes its revision into c.
func adoptRenewal(c *Claim, entry jetstream.KeyValueEntry) bool {
	rec, err := decodeRecord(entry.Value())
	if err != nil || !renewalOf(rec, c.Record) {
		return false
	}
	c.Revision, c.Record = entry.Revision(), rec
	return true
}

// renewalOf reports whether rec is claim's record renewed: the same but for
// when it ends. claim is compared as it reads back once stored: bytes that
// are not UTF-8, as in an ID of any bytes, read back as U+FFFD.
func renewalOf(rec, claim Record) bool {
	if stored, err := decodeRecord(claim.encode()); err == nil {
		claim = stored
	}
	rec.LeaseUntil = claim.LeaseUntil
	return rec.State == StateRunning && bytes.Equal(rec.encode(), claim.encode())
}

// publish starts a compare-and-set write of rec under key, expecting the
// key's last revision to be revision (0: no record).
func (l *Ledger) publish(key string, rec Record, revision uint64) (*Ack, error) {
	l.writes.once.Do(func() { l.writes.w, l.writes.err = newWriter(l.js.Conn()) })
	if l.writes.err != nil {
		return nil, l.writes.err
	}
	return l.writes.w.publish(l.prefix+key, rec, revision)
}

// writes is the ledger's async writer, started by the first async write.
type writes struct {
	once   sync.Once
	closed sync.Once
	w      *writer
	err    error
}

func waitAck(ctx context.Context, a *Ack) (uint64, error) {
	select {
	case <-a.done:
		ack, err := a.Result()
		return ack.Sequence, err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// isWrongLastSeq reports a compare-and-set that found another revision. A
// replicated bucket reports it with a code of its own.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
