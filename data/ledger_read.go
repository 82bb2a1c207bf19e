package data

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
)

// Recorded reports which of jobs have a record in the bucket, in one batched
// read of the bucket's last message per key (a direct get with multi_last),
// whatever the number of jobs. It is the check before a job that has no
// record may run without a claim (see Prepare). Any doubt is an error: a
// server without batched reads, a response cut short; callers then take the
// claim path for every job.
func (l *Ledger) Recorded(ctx context.Context, jobs []*Job) ([]bool, error) {
	found := make([]bool, len(jobs))
	if len(jobs) == 0 {
		return found, nil
	}
	if l.js == nil {
		return nil, errors.New("read records: no connection for batched reads")
	}
	req := struct {
		MultiLast []string `json:"multi_last"`
	}{MultiLast: make([]string, len(jobs))}
	index := make(map[string][]int, len(jobs))
	for i, job := range jobs {
		subj := l.prefix + Key(job.ID)
		req.MultiLast[i] = subj
		index[subj] = append(index[subj], i)
	}
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
		status := ""
		if msg.Header.Get(nats.JSSequence) == "" {
			status = msg.Header.Get("Status")
		}
		switch status {
		case "":
			for _, i := range index[msg.Header.Get(nats.JSSubject)] {
				found[i] = true
			}
		case "404": // none of them has a record
			return found, nil
		case "204": // end of the batch
			if np := msg.Header.Get(headerNumPending); np != "0" {
				return nil, fmt.Errorf("read records: response cut short, %s left", np)
			}
			return found, nil
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
// meanwhile. A worker may run a job on a prepared claim only after Recorded
// found no record and when no other copy of the job can be in the stream
// (see queue.Pool); it saves the claim's write on the happy path.
func (l *Ledger) Prepare(job *Job, worker string) Claim {
	return Claim{Key: Key(job.ID), Record: l.newClaimRecord(job, worker)}
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
