package queue_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// Rule 1 on a replicated bucket: a job whose deliveries ran out before any
// pool claimed it (a pool killed between its fetch and its claim, with
// --max-deliver 1) has no record, and is dead-lettered. Pools that claim
// run no job without a record, so the sweep asks no lease about it; on a
// bucket without direct gets it could not (the leases are read with a
// batched direct get), and the job stayed in JOB.
func TestExhaustedJobWithoutRecordIsDeadLetteredOnAReplicatedBucket(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 3} {
		t.Run(fmt.Sprintf("replicas_%d", replicas), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			objs := onCluster(t, servertest.StartCluster(t, 3), queue.Config{Replicas: replicas, MaxDeliver: 1, AckWait: time.Second})
			obj := objs[0]
			b := &testBundle{js: obj.JS, obj: obj, prod: queue.NewProducer(obj.JS, obj.Config), cfg: obj.Config}
			b.enqueue(t, "job.x", "E", "e")

			// A pool that fetched E and died before its claim.
			batch, err := obj.Worker.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for range batch.Messages() {
				got++
			}
			if got != 1 {
				t.Fatalf("fetched %d jobs, want 1", got)
			}
			time.Sleep(2 * time.Second) // its one delivery ran out

			(&testBundle{obj: objs[1]}).startPool(t, handlers.HandlerFunc(ok)) // sweeps at start
			waitFor(t, 15*time.Second, func() error {
				st := b.status(t)
				di, err := obj.Dead.Info(ctx)
				if err != nil {
					return err
				}
				if st.Stream.Messages != 0 || di.State.Msgs != 1 {
					return fmt.Errorf("JOB holds %d jobs, DLQ %d; want 0 and 1 (the exhausted job is neither done nor dead-lettered)", st.Stream.Messages, di.State.Msgs)
				}
				return nil
			})
		})
	}
}

// Provisioning is idempotent on a cluster too: jobq serve --replicas 3
// started again (or on a second machine) changes nothing.
func TestReprovisionOnAClusterChangesNothing(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 3} {
		t.Run(fmt.Sprintf("replicas_%d", replicas), func(t *testing.T) {
			t.Parallel()
			nodes := servertest.StartCluster(t, 3)
			cfg := queue.Config{Replicas: replicas}
			onCluster(t, nodes[:1], cfg)
			js, err := jetstream.New(servertest.ConnectNode(t, nodes[2]))
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := queue.Provision(ctx, js, cfg, zerolog.New(&logs)); err != nil {
				t.Fatal(err)
			}
			if logs.Len() != 0 {
				t.Errorf("second provision logged changes: %s", logs.String())
			}
		})
	}
}
