package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/data"
)

// sweep moves jobs whose deliveries ran out from JOB to DLQ.
//
// In a work-queue stream such a job is never delivered again and never
// removed: the server only moves WORKER's ack floor past it and sends a
// MAX_DELIVERIES advisory, which is lost while jobq is down. So every job
// still stored at or below the ack floor is exhausted (acked jobs are
// deleted). For each: a done record means the ack was lost, so it is
// removed; a live claim is left to its holder; anything else is
// dead-lettered with the ledger's last error, recorded failed and removed.
func (p *Pool) sweep(ctx context.Context) (int, error) {
	info, err := p.obj.Worker.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("read consumer %s: %w", ConsumerWorker, err)
	}
	floor := info.AckFloor.Stream
	moved := 0
	for seq := uint64(1); seq <= floor; {
		m, err := p.obj.Jobs.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(SubjectJobs))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return moved, fmt.Errorf("read %s: %w", StreamJob, err)
		}
		if m.Sequence > floor {
			break
		}
		seq = m.Sequence + 1
		ok, err := p.sweepOne(ctx, m)
		if err != nil {
			return moved, err
		}
		if ok {
			moved++
		}
	}
	return moved, nil
}

func (p *Pool) sweepOne(ctx context.Context, m *jetstream.RawStreamMsg) (bool, error) {
	job := &data.Job{
		ID: jobID(m.Header, m.Sequence), Subject: m.Subject, Seq: m.Sequence,
		Attempt: p.cfg.MaxDeliver, Payload: m.Data, Header: m.Header, EnqueuedAt: m.Time,
	}
	log := p.log.With().Str("job_id", job.ID).Str("subject", job.Subject).Uint64("seq", job.Seq).Logger()
	rec, err := p.ledger.Get(ctx, job.ID)
	switch {
	case err == nil && rec.State == data.StateDone:
		if err := p.obj.Jobs.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, fmt.Errorf("remove done job %s: %w", job.ID, err)
		}
		return false, nil
	case err == nil && rec.State == data.StateRunning && time.Now().Before(rec.LeaseUntil):
		return false, nil // its holder is still running it
	case err != nil && !errors.Is(err, data.ErrNotFound) && !errors.Is(err, data.ErrCorruptRecord):
		return false, err
	}
	cause := fmt.Sprintf("deliveries exhausted (max deliver %d)", p.cfg.MaxDeliver)
	if rec.LastError != "" {
		cause += ": " + rec.LastError
	}
	if rec.Attempts > 0 {
		job.Attempt = rec.Attempts
	}
	if err := deadLetter(ctx, p.obj.JS, job, m.Header, cause); err != nil {
		return false, err
	}
	if err := p.ledger.FailUnclaimed(ctx, job, cause); err != nil {
		log.Error().Err(err).Msg("record dead-lettered job")
	}
	if err := p.obj.Jobs.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, fmt.Errorf("remove dead-lettered job %s from %s: %w", job.ID, StreamJob, err)
	}
	log.Error().Str("error", cause).Msg("job dead-lettered: deliveries exhausted")
	return true, nil
}

// sweeper runs sweep at start, after every MAX_DELIVERIES advisory and every
// AckWait, until ctx ends.
func (p *Pool) sweeper(ctx context.Context) {
	kick := make(chan struct{}, 1)
	sub, err := p.obj.JS.Conn().Subscribe(AdvisoryMaxDeliveries, func(m *nats.Msg) {
		var adv struct {
			StreamSeq uint64 `json:"stream_seq"`
		}
		if json.Unmarshal(m.Data, &adv) == nil {
			p.log.Debug().Uint64("seq", adv.StreamSeq).Msg("max deliveries advisory")
		}
		select {
		case kick <- struct{}{}:
		default:
		}
	})
	if err != nil {
		p.log.Warn().Err(err).Msg("subscribe to max deliveries advisories: sweeping on a timer only")
	} else {
		defer sub.Unsubscribe()
	}
	t := time.NewTicker(p.cfg.AckWait)
	defer t.Stop()
	for {
		opCtx, cancel := context.WithTimeout(ctx, time.Minute)
		n, err := p.sweep(opCtx)
		cancel()
		if err != nil && ctx.Err() == nil {
			p.log.Error().Err(err).Msg("sweep exhausted jobs")
		}
		if n > 0 {
			p.log.Warn().Int("jobs", n).Msg("exhausted jobs dead-lettered")
		}
		select {
		case <-ctx.Done():
			return
		case <-kick:
			// The advisory comes before the ack floor moves; give it a moment.
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return
			}
		case <-t.C:
		}
	}
}
