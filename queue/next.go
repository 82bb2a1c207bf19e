package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// Next fetches one job from WORKER, waiting up to wait, and runs h on it
// under the same exactly-once protocol as a pool worker: a job recorded done
// is acked without running and Next fetches again. It reports whether h ran.
func Next(ctx context.Context, obj *Objects, h handlers.Handler, wait time.Duration, log zerolog.Logger) (bool, error) {
	cfg := obj.Config
	cfg.Workers = 1
	o := *obj
	o.Config = cfg
	p := NewPool(&o, h, log)
	defer p.ledger.Close()
	ran := false
	counted := handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		ran = true
		return h.Process(ctx, job)
	})
	p.handler = counted
	deadline := time.Now().Add(wait)
	for !ran {
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		msg, err := fetchOne(ctx, obj, left)
		if err != nil || msg == nil {
			return false, err
		}
		p.processOne(ctx, msg)
	}
	return true, nil
}

// Peek fetches one job, shows it to f and releases it for redelivery without
// touching the ledger. It reports whether there was a job.
func Peek(ctx context.Context, obj *Objects, wait time.Duration, f func(*data.Job) error) (bool, error) {
	msg, err := fetchOne(ctx, obj, wait)
	if err != nil || msg == nil {
		return false, err
	}
	job, err := decodeJob(msg)
	if err != nil {
		return true, err
	}
	ferr := f(job)
	if err := msg.Nak(); err != nil {
		return true, fmt.Errorf("release job %s: %w", job.ID, err)
	}
	return true, ferr
}

// fetchOne pulls one job, waiting up to wait: nil if none came. It makes
// its pull as the pool does, so a job with a Status header of its own is
// not taken for the server's word (nats.go's Fetch would).
func fetchOne(ctx context.Context, obj *Objects, wait time.Duration) (jetstream.Msg, error) {
	var msg jetstream.Msg
	if _, err := pullJobs(ctx, obj.JS.Conn(), 1, 0, wait, func(m jetstream.Msg) { msg = m }); err != nil {
		return nil, fmt.Errorf("fetch from %s: %w", ConsumerWorker, err)
	}
	if msg == nil && ctx.Err() != nil {
		return nil, fmt.Errorf("fetch from %s: %w", ConsumerWorker, ctx.Err())
	}
	return msg, nil
}
