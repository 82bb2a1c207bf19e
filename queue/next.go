package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// minPullWait is the shortest wait of Next's pulls.
const minPullWait = 100 * time.Millisecond

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
	// The lease is deleted once Next is through, not after each job it
	// fetched: a deleted lease is closed for good, and a job taken into it
	// and then found done (see recheckTakenOver) is followed by another.
	defer p.lease.close(p, time.Time{})
	ran := false
	counted := handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
		ran = true
		return h.Process(ctx, job)
	})
	p.handler = counted
	if err := p.settleProtocol(ctx); err != nil {
		return false, err
	}
	// Its job's ack, Nak or Term each look JOB up first (see
	// errEarlierJOB).
	stream := newJobStream(obj, true)
	deadline := time.Now().Add(wait)
	// WORKER's limit on one pull's wait, if it has one (as the pool's
	// pulls keep to it, see keepPullLimits): a longer wait is made of
	// several pulls, rather than one that the server refuses.
	var limit time.Duration
	if info := obj.Worker.CachedInfo(); info != nil {
		limit = info.Config.MaxRequestExpires
	}
	for first := true; !ran; first = false {
		left := time.Until(deadline)
		if left <= 0 && !first {
			return false, nil
		}
		// A job that is waiting comes at once; a pull needs a wait of its
		// own, so one with no wait (--wait 0) takes it too.
		pullWait := max(left, minPullWait)
		if limit > 0 {
			pullWait = min(pullWait, limit)
		}
		msg, err := fetchOne(ctx, obj, stream, pullWait)
		if err != nil {
			return false, err
		}
		if msg == nil {
			continue // the deadline tells whether to pull again
		}
		if err := p.processOne(ctx, msg); err != nil {
			return false, err
		}
	}
	return true, nil
}

// Peek shows f the next job that WORKER would deliver for the first time,
// waiting up to wait for one, and reports whether there was one. It reads
// the job from JOB without delivering it: no delivery is counted against
// the job's MaxDeliver, and its first run is not taken for a resumed one.
// Jobs delivered already, running or waiting for a retry, are not shown.
func Peek(ctx context.Context, obj *Objects, wait time.Duration, f func(*data.Job) error) (bool, error) {
	deadline := time.Now().Add(wait)
	for {
		info, err := obj.Worker.Info(ctx)
		if err != nil {
			return false, fmt.Errorf("read %s: %w", ConsumerWorker, err)
		}
		raw, err := obj.Jobs.GetMsg(ctx, info.Delivered.Stream+1, jetstream.WithGetMsgSubject(SubjectJobs))
		switch {
		case err == nil:
			return true, f(&data.Job{
				ID:         jobID(raw.Header, raw.Sequence),
				Subject:    raw.Subject,
				Seq:        raw.Sequence,
				Attempt:    1, // its first delivery is still to come
				Payload:    raw.Data,
				Header:     raw.Header,
				EnqueuedAt: raw.Time,
			})
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			return false, fmt.Errorf("read %s: %w", StreamJob, err)
		case !time.Now().Before(deadline):
			return false, nil
		}
		select {
		case <-time.After(min(100*time.Millisecond, time.Until(deadline))):
		case <-ctx.Done():
			return false, fmt.Errorf("read %s: %w", StreamJob, ctx.Err())
		}
	}
}

// fetchOne pulls one job, waiting up to wait: nil if none came. It makes
// its pull as the pool does, so a job with a Status header of its own is
// not taken for the server's word (nats.go's Fetch would). stream, if not
// nil, keeps the job's ack from reaching a JOB made anew (see
// errEarlierJOB).
func fetchOne(ctx context.Context, obj *Objects, stream *jobStream, wait time.Duration) (jetstream.Msg, error) {
	var msg jetstream.Msg
	take := func(m *nats.Msg) {
		jm := newJobMsg(m)
		if stream != nil {
			jm.stream, jm.of = stream, stream.now()
		}
		msg = jm
	}
	if _, err := pullJobs(ctx, obj.JS.Conn(), 1, 0, wait, take); err != nil {
		return nil, fmt.Errorf("fetch from %s: %w", ConsumerWorker, err)
	}
	if err := ctx.Err(); err != nil {
		if msg != nil {
			_ = msg.Nak() // it came in as the pull ended; if lost, the ack wait redelivers it
		}
		return nil, fmt.Errorf("fetch from %s: %w", ConsumerWorker, err)
	}
	return msg, nil
}
