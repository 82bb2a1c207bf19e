package queue

import (
	"sync"
	"time"
)

// ackHold bounds how long a job's ack waits behind an earlier job (see
// ackOrder).
const ackHold = 10 * time.Millisecond

// ackOrder sends the pool's acks in the order its jobs were fetched, which
// for jobs delivered the first time is their order in JOB.
//
// An ack deletes its job from JOB, a work-queue stream. The server deletes
// a block's first message by moving the block's start; any other, it marks
// deleted, and once half of a full block is deleted that way, it rewrites
// the block's live half there and then, on the path of every ack. Acks
// sent as workers finish come a little out of order, so every block was
// rewritten once: in order, none is. BenchmarkPipeline/no_ledger measured
// 8,953 ns and 15,106 CPU ns per job in order, against 9,849 and 17,265
// out of order (medians of eight interleaved pairs of 20,000 jobs).
//
// A job that is done (acked, or let go of without an ack: handed back,
// failed, or acked on its own, as when dead-lettered) waits while a job
// fetched before it is still in the pool, as one whose handler runs long,
// but at most hold: then every job before it loses its place, to be acked
// out of order when it is done. So no ack is held long enough to matter to
// a redelivery, whose wait is the ack wait, and the jobs the pool let go
// of are not kept behind one that stays.
//
// The acks go out of the lock, one goroutine at a time sending those due,
// in order (see sendOut): a send takes the connection's lock, and waits
// when its buffer is full, which need not hold up the pull that admits
// jobs.
type ackOrder struct {
	send func(*inflight) // sends the job's ack
	hold time.Duration   // ackHold
	now  func() time.Time

	mu    sync.Mutex
	queue ring   // the jobs in fetch order
	next  uint64 // the place of the next job added
	// waiting holds the done jobs that wait in queue, in the order they
	// were done, so oldest first; and jobs that no longer wait, which
	// flush and expire take off its front.
	waiting ring
	out     []*inflight // acks due, in order, for the sender
	spare   []*inflight // out's other buffer
	sending bool        // a goroutine sends out
	idle    *sync.Cond  // on mu: signalled when sending ends
	timer   *time.Timer
	armed   bool // timer runs
	closed  bool // acks go out at once
}

func newAckOrder(send func(*inflight), hold time.Duration) *ackOrder {
	a := &ackOrder{send: send, hold: hold, now: time.Now}
	a.idle = sync.NewCond(&a.mu)
	return a
}

// The place in an ackOrder of a job (inflight.ack).
const (
	ackDirect  uint8 = iota // not in the order: its ack goes out at once
	ackQueued               // in the order, not done
	ackWanted               // in the order, its ack waits for the jobs before it
	ackDropped              // in the order, let go of without an ack
)

// add puts a fetched job at the end of the order.
func (a *ackOrder) add(it *inflight) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	it.ack, it.ackPlace = ackQueued, a.next
	a.next++
	a.queue.push(it)
}

// ack sends it's ack once every job before it is done, or at most hold
// later. One with no place in the order goes out now, before ack returns.
func (a *ackOrder) ack(it *inflight) {
	a.mu.Lock()
	if it.ack != ackQueued {
		a.mu.Unlock()
		a.send(it)
		return
	}
	a.done(it, ackWanted)
	a.sendOut()
}

// drop gives up it's place in the order, if it has one and is not acked:
// the pool lets go of it without an ack.
func (a *ackOrder) drop(it *inflight) {
	a.mu.Lock()
	if it.ack != ackQueued {
		a.mu.Unlock()
		return
	}
	a.done(it, ackDropped)
	a.sendOut()
}

// done marks a job in the order done, as state, and moves on the front of
// the order. a.mu is held.
func (a *ackOrder) done(it *inflight, state uint8) {
	it.ack = state
	if a.queue.front() != it {
		it.ackAt = a.now()
		a.waiting.push(it)
	}
	a.flush()
}

// flush moves the acks at the front of the order, up to the first job not
// done, to out, and arms the timer if done jobs wait behind it. a.mu is
// held.
func (a *ackOrder) flush() {
	for a.queue.len() > 0 {
		it := a.queue.front()
		if it.ack == ackQueued {
			break
		}
		a.queue.pop()
		if it.ack == ackWanted {
			a.out = append(a.out, it)
		}
		it.ack = ackDirect
	}
	a.trimWaiting()
	if a.waiting.len() > 0 && !a.armed && !a.closed {
		a.armed = true
		if a.timer == nil {
			a.timer = time.AfterFunc(a.hold, a.expire)
		} else {
			a.timer.Reset(a.hold)
		}
	}
}

// trimWaiting takes the jobs that no longer wait off the front of waiting.
func (a *ackOrder) trimWaiting() {
	for a.waiting.len() > 0 && a.waiting.front().ack == ackDirect {
		a.waiting.pop()
	}
}

// sendOut sends the acks due, unless another goroutine does: it sends them
// all, those due meanwhile too, in order. a.mu is held, and released.
func (a *ackOrder) sendOut() {
	if a.sending {
		a.mu.Unlock()
		return
	}
	a.sending = true
	for len(a.out) > 0 {
		batch := a.out
		a.out, a.spare = a.spare[:0], nil
		a.mu.Unlock()
		for _, it := range batch {
			a.send(it)
		}
		clear(batch)
		a.mu.Lock()
		a.spare = batch[:0]
	}
	a.sending = false
	a.idle.Broadcast()
	a.mu.Unlock()
}

// expire lets go the done jobs that waited hold: every job before them
// loses its place.
func (a *ackOrder) expire() {
	a.mu.Lock()
	a.armed = false
	if a.closed {
		a.mu.Unlock()
		return
	}
	now := a.now()
	var last uint64 // the place of the last job let go
	found := false
	for a.waiting.len() > 0 {
		it := a.waiting.front()
		if it.ack != ackDirect && now.Sub(it.ackAt) < a.hold {
			break
		}
		a.waiting.pop()
		if it.ack != ackDirect {
			last, found = max(last, it.ackPlace), true
		}
	}
	for found && a.queue.len() > 0 && a.queue.front().ackPlace <= last {
		it := a.queue.pop()
		if it.ack == ackWanted {
			a.out = append(a.out, it)
		}
		it.ack = ackDirect
	}
	a.flush()
	if a.armed { // by flush, for a hold from now: the first left waits less
		a.timer.Reset(a.hold - now.Sub(a.waiting.front().ackAt))
	}
	a.sendOut()
}

// close sends every ack that waits, and from then on each at once: the
// pool stops. It returns once they are sent.
func (a *ackOrder) close() {
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		if a.timer != nil {
			a.timer.Stop()
		}
		for a.queue.len() > 0 {
			it := a.queue.pop()
			if it.ack == ackWanted {
				a.out = append(a.out, it)
			}
			it.ack = ackDirect
		}
		a.waiting = ring{}
	}
	for a.sending {
		a.idle.Wait()
	}
	a.sendOut()
}

// ring is a queue of jobs that grows as needed.
type ring struct {
	buf  []*inflight
	head int
	n    int
}

func (r *ring) len() int { return r.n }

func (r *ring) at(i int) *inflight { return r.buf[(r.head+i)%len(r.buf)] }

func (r *ring) front() *inflight {
	if r.n == 0 {
		return nil
	}
	return r.buf[r.head]
}

func (r *ring) push(it *inflight) {
	if r.n == len(r.buf) {
		buf := make([]*inflight, max(2*len(r.buf), 64))
		for i := range r.n {
			buf[i] = r.at(i)
		}
		r.buf, r.head = buf, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = it
	r.n++
}

func (r *ring) pop() *inflight {
	it := r.buf[r.head]
	r.buf[r.head] = nil
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return it
}
