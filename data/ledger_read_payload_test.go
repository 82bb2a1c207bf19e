package data_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/server"
	"github.com/jobq/jobq/server/servertest"
)

// The ledger's batched reads fit the server's max payload: 256 long IDs
// (500 bytes, not plain, so their keys are longer still) took one request
// of about 180 KB, which a server of jobq serve --max-payload 65536 (128
// KiB) refused every time, and the pool's check before running its jobs
// retried without end.
func TestLedgerReadsOfLongKeysFitTheServersMaxPayload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := servertest.StartConfig(t, server.Config{Logger: servertest.Logger(t), MaxPayload: 65536 + 64<<10})
	js, err := jetstream.New(servertest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "processed", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	l := data.NewLedger(kv, time.Minute, js)
	t.Cleanup(l.Close)
	var jobs []*data.Job
	for i := range 256 {
		id := fmt.Sprintf("order %03d ", i) + strings.Repeat("x", 490)
		jobs = append(jobs, &data.Job{ID: id, Subject: "job.x", Seq: uint64(i + 1), Attempt: 1})
	}
	// Every other job has a record, which the reads must find.
	keys := make([]string, len(jobs))
	ls := &data.Lease{}
	for i, j := range jobs {
		keys[i] = data.Key(j.ID)
		ls.Jobs = append(ls.Jobs, data.LeasedJob{Key: keys[i], Seq: j.Seq})
		if i%2 == 0 {
			if _, err := l.Claim(ctx, j, "w"); err != nil {
				t.Fatal(err)
			}
		}
	}
	snap, err := l.Check(ctx, jobs, "p")
	if err != nil {
		t.Fatalf("check of 256 jobs: %v", err)
	}
	found, err := l.Recorded(ctx, keys)
	if err != nil {
		t.Fatalf("recorded of 256 jobs: %v", err)
	}
	for i := range jobs {
		if snap.Found[i] != (i%2 == 0) || found[i] != (i%2 == 0) {
			t.Errorf("job %d: check found %v, recorded %v; want %v", i, snap.Found[i], found[i], i%2 == 0)
		}
	}
	if settled, err := l.Settled(ctx, ls); err != nil || settled {
		t.Errorf("settled of a lease of 256 jobs, half recorded: %v, %v; want false", settled, err)
	}
}
