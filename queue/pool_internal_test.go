package queue

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/server/servertest"
)

func TestFreshnessKeepsTheShortestDedupeWindow(t *testing.T) {
	t.Parallel()
	// jobq's window is 10s and the ack wait 1s, so a job may run on a
	// prepared claim while JOB's oldest job is under 9s old. A window
	// changed in place outside jobq (no note in JOB's metadata) only ever
	// makes that stricter: lengthened, it is not trusted; shortened, the
	// short window holds for the rest of the run, since jobs stored
	// meanwhile were deduplicated over it.
	ctx := context.Background()
	srv := servertest.Start(t)
	js, err := jetstream.New(servertest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := Provision(ctx, js, Config{DedupeWindow: 10 * time.Second, AckWait: time.Second}, servertest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	prod := NewProducer(js, obj.Config)
	setWindow := func(d time.Duration) {
		t.Helper()
		cfg := obj.Jobs.CachedInfo().Config
		cfg.Duplicates = d
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatalf("set JOB's dedupe window to %s: %v", d, err)
		}
	}
	steps := []struct {
		name   string
		window time.Duration // set in place before the step
		age    time.Duration // how old JOB's oldest job is
		want   bool
	}{
		{"lengthened outside jobq before the first look", time.Hour, 10 * time.Second, false},
		{"jobq's window", 10 * time.Second, 8 * time.Second, true},
		{"jobq's window, an older job", 10 * time.Second, 10 * time.Second, false},
		{"lengthened outside jobq", time.Hour, 10 * time.Second, false},
		{"back to jobq's", 10 * time.Second, 8 * time.Second, true},
		{"shortened outside jobq", 3 * time.Second, 2500 * time.Millisecond, false},
		{"lengthened again", 10 * time.Second, 8 * time.Second, false},
	}
	p := NewPool(obj, handlers.HandlerFunc(nil), servertest.Logger(t))
	for _, s := range steps {
		setWindow(s.window)
		if err := obj.Jobs.Purge(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := prod.Enqueue(ctx, "job.f", []byte("x"), EnqueueOptions{}); err != nil {
			t.Fatal(err)
		}
		info, err := obj.Jobs.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p.fresh.checked = time.Time{} // read JOB again
		if got := p.fresh.allows(p, info.State.FirstTime.Add(s.age)); got != s.want {
			t.Errorf("%s (window %s, oldest job %s old): prepared claims allowed %v, want %v", s.name, s.window, s.age, got, s.want)
		}
	}
}
