package data

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

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

// recordedBatch is the most keys Recorded asks for in one read: the
// server returns at most 1024 records per batched read, leases included.
const recordedBatch = 512

// Recorded reports which of keys have a record, in batched reads of up to
// recordedBatch keys.
func (l *Ledger) Recorded(ctx context.Context, keys []string) ([]bool, error) {
	found := make([]bool, 0, len(keys))
	for chunk := range slices.Chunk(keys, recordedBatch) {
		s, err := l.check(ctx, chunk, "")
		if err != nil {
			return nil, err
		}
		found = append(found, s.Found...)
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

func (l *Ledger) check(ctx context.Context, keys []string, mine string) (*Snapshot, error) {
	s := &Snapshot{Found: make([]bool, len(keys))}
	if l.js == nil {
		return nil, errors.New("read records: no connection for batched reads")
	}
	req := struct {
		MultiLast []string `json:"multi_last"`
	}{MultiLast: make([]string, 0, len(keys)+1)}
	index := make(map[string][]int, len(keys))
	for i, key := range keys {
		subj := l.prefix + key
		req.MultiLast = append(req.MultiLast, subj)
		index[subj] = append(index[subj], i)
	}
	leases := l.prefix + LeasePrefix
	req.MultiLast = append(req.MultiLast, leases+">")
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}

	l.reads.mu.Lock()
	defer l.reads.mu.Unlock()
	if l.reads.closed {
		return nil, errors.New("read records: ledger closed")
	}
	if l.reads.sub == nil {
		inbox := l.js.Conn().NewInbox()
		sub, err := l.js.Conn().SubscribeSync(inbox + ".*")
		if err != nil {
			return nil, fmt.Errorf("read records: %w", err)
		}
		l.reads.sub, l.reads.inbox = sub, inbox
	}
	l.reads.n++
	reply := l.reads.inbox + "." + strconv.FormatUint(l.reads.n, 10)
	if err := l.js.Conn().PublishRequest("$JS.API.DIRECT.GET.KV_"+l.kv.Bucket(), reply, body); err != nil {
		return nil, fmt.Errorf("read records: %w", err)
	}
	for {
		msg, err := l.reads.sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("read records: %w", err)
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
			subj := msg.Header.Get(nats.JSSubject)
			if owner, ok := strings.CutPrefix(subj, leases); ok {
				if err := s.addLease(owner, seq, owner == mine, msg); err != nil {
					return nil, fmt.Errorf("read leases: %w", err)
				}
				continue
			}
			for _, i := range index[subj] {
				s.Found[i] = true
			}
		case "404": // no record and no lease
			return s, nil
		case "204": // end of the batch
			if np := msg.Header.Get(headerNumPending); np != "0" {
				return nil, fmt.Errorf("read records: response cut short, %s left", np)
			}
			return s, nil
		default:
			return nil, fmt.Errorf("read records: server says %s %s", status, strings.TrimSpace(msg.Header.Get("Description")))
		}
	}
}

// headerNumPending is the direct get header that says how many results
// are left.
const headerNumPending = "Nats-Num-Pending"

// reads is the ledger's subscription for batched reads, one read at a time.
type reads struct {
	mu     sync.Mutex
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
// happy path. Like Claim, it sets job.Resumed.
func (l *Ledger) Prepare(job *Job, worker string) Claim {
	c := Claim{Key: Key(job.ID), Record: l.newClaimRecord(job, worker)}
	job.Resumed = c.Record.Resumed
	return c
}

// Close releases the subscriptions of batched reads and async writes; a
// write still waiting fails.
func (l *Ledger) Close() {
	l.reads.mu.Lock()
	l.reads.closed = true
	if l.reads.sub != nil {
		l.reads.sub.Unsubscribe()
		l.reads.sub = nil
	}
	l.reads.mu.Unlock()
	l.writes.once.Do(func() { l.writes.err = errors.New("ledger closed") })
	l.writes.closed.Do(func() {
		if l.writes.w != nil {
			l.writes.w.close()
		}
	})
}
