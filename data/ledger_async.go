package data

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
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
	fut    jetstream.PubAckFuture
}

// ClaimAsync starts claiming job for worker, assuming it has no record yet.
// Wait returns what Claim would.
func (l *Ledger) ClaimAsync(job *Job, worker string) (*PendingClaim, error) {
	rec := l.newClaimRecord(job, worker)
	pc := &PendingClaim{l: l, job: job, worker: worker, claim: Claim{Key: Key(job.ID), Record: rec}}
	if l.js == nil {
		return pc, nil
	}
	fut, err := l.js.PublishMsgAsync(l.casMsg(pc.claim.Key, rec, 0))
	if err != nil {
		return nil, fmt.Errorf("claim job %s: %w", job.ID, err)
	}
	pc.fut = fut
	return pc, nil
}

// Wait waits for the claim's outcome, falling back to Claim when the job
// already has a record.
func (pc *PendingClaim) Wait(ctx context.Context) (Claim, error) {
	if pc.fut == nil {
		return pc.l.Claim(ctx, pc.job, pc.worker)
	}
	ack, err := waitFuture(ctx, pc.fut)
	if err == nil {
		pc.claim.Revision = ack.Sequence
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
	l     *Ledger
	c     *Claim
	next  Record
	fut   jetstream.PubAckFuture
	fails func(context.Context) error
}

// DoneAsync starts recording the job's completion. Wait returns what Done
// would; on success it advances c.
func (l *Ledger) DoneAsync(c *Claim, took time.Duration) (*PendingWrite, error) {
	next := c.Record
	next.State, next.Took, next.LastError = StateDone, took, ""
	next.FinishedAt = time.Now().UTC()
	next.LeaseUntil = time.Time{}
	pw := &PendingWrite{l: l, c: c, next: next}
	if l.js == nil {
		return pw, nil
	}
	fut, err := l.js.PublishMsgAsync(l.casMsg(c.Key, next, c.Revision))
	if err != nil {
		return nil, fmt.Errorf("record job %s done: %w", next.ID, err)
	}
	pw.fut = fut
	return pw, nil
}

// Wait waits for the write; ErrClaimLost means another worker holds the job.
func (pw *PendingWrite) Wait(ctx context.Context) error {
	if pw.fut == nil {
		return pw.l.update(ctx, pw.c, pw.next)
	}
	ack, err := waitFuture(ctx, pw.fut)
	switch {
	case err == nil:
		pw.c.Revision, pw.c.Record = ack.Sequence, pw.next
		return nil
	case isWrongLastSeq(err):
		return fmt.Errorf("record job %s %s: %w: %w", pw.next.ID, pw.next.State, ErrClaimLost, err)
	default:
		// Lost on the way or refused: try once more, synchronously.
		return pw.l.update(ctx, pw.c, pw.next)
	}
}

func (l *Ledger) casMsg(key string, rec Record, revision uint64) *nats.Msg {
	m := nats.NewMsg(l.prefix + key)
	m.Data = rec.encode()
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(revision, 10))
	return m
}

func waitFuture(ctx context.Context, f jetstream.PubAckFuture) (*jetstream.PubAck, error) {
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// isWrongLastSeq reports a compare-and-set that found another revision.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}
