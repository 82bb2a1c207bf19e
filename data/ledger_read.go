package data

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// Check reads, in one batched read of the bucket's last message per
// subject (a direct get with multi_last), which of jobs have a record and
// every lease, as of one moment: the server answers it isolated from
// writes. It is the check before jobs without a record go into a pool's
// lease (see WriteLease). Any doubt is an error: a server without batched
// reads, a response cut short.
//
// The lease of owner mine is left out of Snapshot.Leases: a pool knows its
// own.
func (l *Ledger) Check(ctx context.Context, jobs []*Job, mine string) (*Snapshot, error) {
	keys := make([]string, len(jobs))
	for i, job := range jobs {
		keys[i] = Key(job.ID)
	}
	return l.check(ctx, keys, mine)
}

// recordedBatch is the most keys one batched read asks for apart from the
// leases: the server answers at most maxReadResults subjects per read.
const (
	recordedBatch  = 512
	maxReadResults = 1024
)

// Recorded reports which of keys have a record, in batched reads of up to
// recordedBatch keys.
func (l *Ledger) Recorded(ctx context.Context, keys []string) ([]bool, error) {
	found := make([]bool, len(keys))
	for i := 0; i < len(keys); i += recordedBatch {
		chunk := keys[i:min(i+recordedBatch, len(keys))]
		if err := l.readRecords(ctx, chunk, func(j int, _ string, _ *nats.Msg) { found[i+j] = true }); err != nil {
			return nil, err
		}
	}
	return found, nil
}

// Settled reports whether every job in ls has a record, which wins over
// the lease: a lease that ended may then be deleted.
func (l *Ledger) Settled(ctx context.Context, ls *Lease) (bool, error) {
	keys := make([]string, len(ls.Jobs))
	for i, j := range ls.Jobs {
		keys[i] = j.Key
	}
	found, err := l.Recorded(ctx, keys)
	if err != nil {
		return false, err
	}
	return !slices.Contains(found, false), nil
}

// errTooManyResults: a batched read matched more subjects than the server
// answers in one (maxReadResults).
var errTooManyResults = errors.New("server says 413 Too Many Results")

// errRequestTooLarge: a batched read's request is over the server's max
// payload, as for many long job IDs on a server with a small one.
var errRequestTooLarge = errors.New("request over the server's max payload")

func (l *Ledger) check(ctx context.Context, keys []string, mine string) (*Snapshot, error) {
	s := &Snapshot{Found: make([]bool, len(keys))}
	subjects, index := l.keySubjects(keys)
	leases := l.prefix + LeasePrefix
	err := l.multiLast(ctx, append(subjects, leases+">"), func(subj, seq string, msg *nats.Msg) error {
		if owner, ok := strings.CutPrefix(subj, leases); ok {
			return s.addLease(owner, seq, owner == mine, msg)
		}
		for _, i := range index[subj] {
			s.addRecord(i, seq, msg)
		}
		return nil
	})
	if errors.Is(err, errTooManyResults) || errors.Is(err, errRequestTooLarge) {
		// Many leases, of pools that ran here and of pools still running,
		// or keys too long to ask for in one request: read the leases
		// apart from the records, which readRecords asks for in parts.
		return l.checkApart(ctx, keys, mine)
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// checkApart is Check in more than one read: every lease first, then the
// records, recordedBatch keys at a time. It is as safe as the one read: a
// record appears only for a job that a lease holds, or that was claimed
// first, which sees the record first; and a lease written after the first
// read makes the lease write that rests on this check fail (it expects
// Snapshot.LeaseSeq), so that the pool checks again. Reading the records
// first would not do: a job could be leased, run, recorded and dropped from
// its lease between the two reads.
func (l *Ledger) checkApart(ctx context.Context, keys []string, mine string) (*Snapshot, error) {
	s := &Snapshot{}
	leases := l.prefix + LeasePrefix
	err := l.multiLast(ctx, []string{leases + ">"}, func(subj, seq string, msg *nats.Msg) error {
		owner := strings.TrimPrefix(subj, leases)
		return s.addLease(owner, seq, owner == mine, msg)
	})
	if errors.Is(err, errTooManyResults) {
		return nil, fmt.Errorf("read leases: more than %d in bucket %s, which one read cannot return: %w (each is a pool that ran; delete the keys %s* of pools that no longer run)",
			maxReadResults, l.kv.Bucket(), err, LeasePrefix)
	}
	if err != nil {
		return nil, err
	}
	s.Found = make([]bool, len(keys))
	for i := 0; i < len(keys); i += recordedBatch {
		chunk := keys[i:min(i+recordedBatch, len(keys))]
		err := l.readRecords(ctx, chunk, func(j int, seq string, msg *nats.Msg) { s.addRecord(i+j, seq, msg) })
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

// readRecords calls found with the index in keys of each key that has a
// record, and the record. Keys too long to ask for in one request are
// asked for in halves.
func (l *Ledger) readRecords(ctx context.Context, keys []string, found func(i int, seq string, msg *nats.Msg)) error {
	subjects, index := l.keySubjects(keys)
	err := l.multiLast(ctx, subjects, func(subj, seq string, msg *nats.Msg) error {
		for _, i := range index[subj] {
			found(i, seq, msg)
		}
		return nil
	})
	if !errors.Is(err, errRequestTooLarge) || len(keys) < 2 {
		return err
	}
	half := len(keys) / 2
	if err := l.readRecords(ctx, keys[:half], found); err != nil {
		return err
	}
	return l.readRecords(ctx, keys[half:], func(i int, seq string, msg *nats.Msg) { found(half+i, seq, msg) })
}

// keySubjects returns keys' subjects, and where each subject is in keys.
func (l *Ledger) keySubjects(keys []string) ([]string, map[string][]int) {
	subjects := make([]string, 0, len(keys)+1)
	index := make(map[string][]int, len(keys))
	for i, key := range keys {
		subj := l.prefix + key
		subjects = append(subjects, subj)
		index[subj] = append(index[subj], i)
	}
	return subjects, index
}

// multiLast reads the last message of each subject (a filter may be a
// wildcard) in one batched read, isolated from writes, and calls each for
// every message found.
func (l *Ledger) multiLast(ctx context.Context, subjects []string, each func(subj, seq string, msg *nats.Msg) error) error {
	if l.js == nil {
		return errors.New("read records: no connection for batched reads")
	}
	body, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
	}{subjects})
	if err != nil {
		return err
	}
	if max := l.js.Conn().MaxPayload(); int64(len(body)) > max {
		return fmt.Errorf("read records: %d bytes, the server takes %d: %w", len(body), max, errRequestTooLarge)
	}

	// The wait for the read before ends with ctx: a caller bounded by a
	// deadline, such as a lease's renewal, is not held past it.
	select {
	case l.reads.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("read records: waiting for the read before: %w", ctx.Err())
	}
	defer func() { <-l.reads.turn }()
	if l.reads.closed {
		return errors.New("read records: ledger closed")
	}
	if l.reads.sub == nil {
		inbox := l.js.Conn().NewInbox()
		sub, err := l.js.Conn().SubscribeSync(inbox + ".*")
		if err != nil {
			return fmt.Errorf("read records: %w", err)
		}
		l.reads.sub, l.reads.inbox = sub, inbox
	}
	l.reads.n++
	reply := l.reads.inbox + "." + strconv.FormatUint(l.reads.n, 10)
	if err := l.js.Conn().PublishRequest("$JS.API.DIRECT.GET.KV_"+l.kv.Bucket(), reply, body); err != nil {
		return fmt.Errorf("read records: %w", err)
	}
	for {
		msg, err := l.reads.sub.NextMsgWithContext(ctx)
		if err != nil {
			return fmt.Errorf("read records: %w", err)
		}
		if msg.Subject != reply {
			continue // the rest of an earlier read that gave up
		}
		// A stored record comes with its sequence; only the server's word
		// has a Status without one (a record may carry any header).
		seq := msg.Header.Get(nats.JSSequence)
		status := ""
		if seq == "" {
			status = msg.Header.Get("Status")
		}
		switch status {
		case "":
			if err := each(msg.Header.Get(nats.JSSubject), seq, msg); err != nil {
				return fmt.Errorf("read leases: %w", err)
			}
		case "404": // none found
			return nil
		case "204": // end of the batch
			if np := msg.Header.Get(headerNumPending); np != "0" {
				return fmt.Errorf("read records: response cut short, %s left", np)
			}
			return nil
		case "413":
			return fmt.Errorf("read records: %w", errTooManyResults)
		default:
			return fmt.Errorf("read records: server says %s %s", status, strings.TrimSpace(msg.Header.Get("Description")))
		}
	}
}

// headerNumPending is the direct get header that says how many results
// are left.
const headerNumPending = "Nats-Num-Pending"

// reads is the ledger's subscription for batched reads, one read at a time:
// the one that holds turn.
type reads struct {
	turn   chan struct{}
	closed bool
	sub    *nats.Subscription
	inbox  string
	n      uint64
}

// Prepare returns a claim on job for worker that is not written yet: its
// Revision is 0, so the first write through it (Done, Retry, Fail, Release
// or Renew) creates the record and fails with ErrClaimLost if one appeared
// meanwhile. A worker may run a job on a prepared claim only while its
// pool's lease holds the job (see Leases); it saves the claim's write on the
// happy path. lease is that lease's owner, which the record names. Like
// Claim, it sets job.Resumed.
func (l *Ledger) Prepare(job *Job, worker, lease string) Claim {
	c := Claim{Key: Key(job.ID), Record: l.newClaimRecord(job, worker)}
	c.Record.Lease = lease
	job.Resumed = c.Record.Resumed
	return c
}

// Close releases the subscriptions of batched reads and async writes; a
// write still waiting fails.
func (l *Ledger) Close() {
	l.reads.turn <- struct{}{}
	l.reads.closed = true
	if l.reads.sub != nil {
		l.reads.sub.Unsubscribe()
		l.reads.sub = nil
	}
	<-l.reads.turn
	l.writes.once.Do(func() { l.writes.err = errors.New("ledger closed") })
	l.writes.closed.Do(func() {
		if l.writes.w != nil {
			l.writes.w.Close()
		}
	})
}
