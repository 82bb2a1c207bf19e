package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

// A lease write may rest on a check older than the pool's last write only
// if no check since saw more: here, another pool leases job a between an
// old check and a newer one that this pool wrote on, and the old check's
// batch, which holds a, must be checked again rather than leased.
func TestLeaseRefusesACheckOlderThanOneItWroteOn(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"a later batch", "a renewal"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			srv := servertest.Start(t)
			js, err := jetstream.New(servertest.Connect(t, srv))
			if err != nil {
				t.Fatal(err)
			}
			obj, err := Provision(ctx, js, Config{}, servertest.Logger(t))
			if err != nil {
				t.Fatal(err)
			}
			p := NewPool(obj, handlers.HandlerFunc(nil), servertest.Logger(t))
			t.Cleanup(p.ledger.Close)
			it := func(id string, seq uint64) *inflight {
				return &inflight{job: &data.Job{ID: id, Seq: seq, Attempt: 1}}
			}
			a, b := []*inflight{it("a", 1)}, []*inflight{it("b", 2)}

			old, err := p.check(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			other := data.Lease{Worker: "w", Until: time.Now().Add(time.Minute), Jobs: []data.LeasedJob{{Key: "a", Seq: 1}}}
			switch via {
			case "a later batch":
				foreign, err := p.ledger.WriteLease(ctx, "other", other, old.LeaseSeq)
				if err != nil {
					t.Fatal(err)
				}
				newer, err := p.check(ctx, b)
				if err != nil || newer.LeaseSeq != foreign {
					t.Fatalf("newer check: got %+v, %v; want the other pool's lease at %d", newer, err, foreign)
				}
				if err := p.lease.add(ctx, p, b, newer.LeaseSeq); err != nil {
					t.Fatalf("lease b: %v", err)
				}
			case "a renewal":
				// The pool holds b, and its last write is the one
				// before the other pool's: the renewal races, checks
				// again and writes on that check.
				if err := p.lease.add(ctx, p, b, old.LeaseSeq); err != nil {
					t.Fatalf("lease b: %v", err)
				}
				if _, err := p.ledger.WriteLease(ctx, "other", other, p.lease.last); err != nil {
					t.Fatal(err)
				}
				p.lease.wrote = time.Time{}
				last := p.lease.last
				p.lease.renew(ctx, p)
				if p.lease.last == last {
					t.Fatal("renewal: the lease was not written")
				}
			}
			if err := p.lease.add(ctx, p, a, old.LeaseSeq); !errors.Is(err, data.ErrLeaseRaced) {
				t.Fatalf("lease a on the old check: got %v, want ErrLeaseRaced", err)
			}
			fresh, err := p.check(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			if ls, _, ok := fresh.Leased("a"); !ok || ls.Owner != "other" {
				t.Fatalf("check again: got %+v, want a in the other pool's lease", fresh)
			}
		})
	}
}
