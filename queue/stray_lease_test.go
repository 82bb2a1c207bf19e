package queue_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// On a bucket without direct gets (every pool claims), a _claims.* key
// that jobq did not write stops every pool that would claim from starting,
// and every jobq next, since it could hide a running job: the error says
// to delete the key if no jobq worker wrote it, as the pools' ledger check
// does.
func TestStrayLeaseKeyOnAClaimingBucketSaysWhatToDo(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: 3 * time.Second})
	b.editLedger(t, func(c *jetstream.StreamConfig, _ jetstream.StreamState) { c.AllowDirect = false })
	ctx := context.Background()
	obj, err := b.obj.Bind(ctx, b.js)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obj.Ledger.Put(ctx, data.LeasePrefix+"junk", []byte("not a lease")); err != nil {
		t.Fatal(err)
	}
	p := queue.NewPool(obj, handlers.HandlerFunc(ok), servertest.Logger(t))
	err = p.Start(ctx)
	if err == nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p.Stop(ctx)
		})
		return
	}
	if !strings.Contains(err.Error(), "delete the key") {
		t.Errorf("claiming pool beside a stray %sjunk key: Start gave %q; want it to say what to do (delete the key), as the pools' ledger check does", data.LeasePrefix, err)
	}
	_, nerr := queue.Next(ctx, obj, handlers.HandlerFunc(ok), 100*time.Millisecond, servertest.Logger(t))
	t.Logf("jobq next meanwhile: %v", nerr)
}
