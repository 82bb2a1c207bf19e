package queue

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
)

// A job whose handler succeeded gives its room in the pool back at once,
// and lets its payload go: it no longer needs a worker or its payload, only
// its record and its ack, so the next jobs are pulled meanwhile. It stays in the lease until its
// record is stored, and its release once acked gives no room back twice.
func TestRoomIsGivenBackWhenTheHandlerSucceeds(t *testing.T) {
	t.Parallel()
	p := leasingPool(t, leasingObjects(t))
	ctx := context.Background()
	it := stubJob("R", 1)
	if leased, _, _ := p.admitBatch(ctx, checkOf(t, p, []*inflight{it})); len(leased) != 1 {
		t.Fatal("R not leased")
	}
	payload := []byte("a payload the pool lets go once the handler succeeded")
	jm := &jobMsg{msg: &nats.Msg{Data: payload}}
	it.msg, it.job.Payload, it.size = jm, payload, int64(len(payload))
	p.bytes.Add(it.size) // as admit counts it; the fetcher took its token

	p.work <- it
	close(p.work)
	p.runAll(ctx, new(*inflight))
	if len(p.dones) != 1 {
		t.Fatalf("R not handed to the acker: %d waiting", len(p.dones))
	}
	if got := len(p.tokens); got != 1 || p.bytes.Load() != 0 {
		t.Fatalf("after R's handler: %d tokens back, %d bytes held; want its token and bytes back", got, p.bytes.Load())
	}
	if _, held, _ := p.lease.find("R"); !held {
		t.Fatal("R left the lease before its record was stored")
	}
	if it.job.Payload != nil || jm.msg.Data != nil {
		t.Error("R's payload still held after its room was given back: PrefetchBytes would not bound the payloads in memory")
	}

	<-p.dones
	if err := it.write.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	p.release(it) // as the acker does once R is acked
	if got := len(p.tokens); got != 1 || p.bytes.Load() != 0 {
		t.Errorf("after R's release: %d tokens, %d bytes held; want no second token back", got, p.bytes.Load())
	}
	if _, held, _ := p.lease.find("R"); held {
		t.Error("R still in the lease after its record was stored")
	}
}
