package queue

import (
	"context"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
)

// A lapsed lease gives its jobs up under the lease's lock (giveUpIfLapsed,
// from renew or add). loseLeased cancels the leased handlers at once, but
// then spins until every other job's lock is free: a job on a claim of its
// own holds its lock while its renewal waits for the ledger, up to its
// give-up time or opTimeout. Meanwhile the lease's lock stays held: no
// leased job can mark itself finishing or leave the lease (lease.finishing,
// done, letGo), no batch be sorted or admitted (find, generation, add), and
// the lapsed lease's own write waits. A claimed job is never given up by
// loseLeased; it need not wait for it.
func TestLapsedLeaseGiveUpDoesNotHoldTheLeaseForAClaimRenewal(t *testing.T) {
	t.Parallel()
	obj := leasingObjects(t)
	p := leasingPool(t, obj)
	ctx := context.Background()

	l := stubJob("L", 1)
	lctx, cancel := context.WithCancelCause(ctx)
	l.unclaimed, l.cancel = true, cancel
	p.beats.add(l)
	c := stubJob("C", 2)
	c.claim.Revision = 1 // a claim of its own
	p.beats.add(c)

	p.lease.mu.Lock()
	p.lease.putLocked(data.Key("L"), 1)
	p.lease.toks++
	p.lease.jobs[data.Key("L")].tok, l.leaseTok = p.lease.toks, p.lease.toks
	p.lease.until = time.Now().Add(-time.Second) // lapsed
	p.lease.mu.Unlock()

	const hang = 3 * time.Second
	c.mu.Lock() // C's renewal waits for the ledger
	go func() {
		time.Sleep(hang)
		c.mu.Unlock()
	}()
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		p.lease.renew(ctx, p)
	}()
	select {
	case <-lctx.Done():
	case <-time.After(hang / 2):
		t.Fatal("the leased job was not given up")
	}
	start := time.Now()
	p.lease.finishing(data.Key("L"), l) // L's handler returned
	if took := time.Since(start); took > hang/3 {
		t.Errorf("a leased job waited %s for the lease's lock, held while a claimed job's renewal hung", took.Round(time.Millisecond))
	}
	<-renewed
}
