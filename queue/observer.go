package queue

import (
	"time"

	"github.com/jobq/jobq/data"
)

// Observer is told how each job's attempt ended, for a live view such as
// jobq's dashboard. Set it as Config.Observer; nil means none.
//
// The pool calls it from its own goroutines (its workers, the one that acks
// done jobs, its sweeper), once per outcome and on the hot path: it must be
// safe for concurrent use, return quickly and never block, nor end the
// goroutine (runtime.Goexit, t.FailNow), which would stall the pool, nor
// call Stop but in a goroutine of its own (see Stop). It may
// keep job's ID and Subject, not job itself (its Payload is the delivered
// message's memory). A done job comes without its Payload: the pool lets it
// go once the handler succeeded, while the completion is recorded.
type Observer interface {
	// JobFinished reports that an attempt of job ended in state:
	// data.StateDone (its completion is recorded), data.StateRetrying (it
	// failed and is released for a retry) or data.StateFailed (it is in
	// DLQ). took is how long its handler ran, 0 when none ran (a job the
	// sweep dead-lettered); err is the cause of a retry or a failure, nil
	// when done.
	JobFinished(job *data.Job, state data.State, took time.Duration, err error)
}

// observe tells the configured Observer, if any, how an attempt ended.
func (p *Pool) observe(job *data.Job, state data.State, took time.Duration, err error) {
	if o := p.cfg.Observer; o != nil {
		o.JobFinished(job, state, took, err)
	}
}

// InFlight returns how many handlers of the pool are running now.
func (p *Pool) InFlight() int { return int(p.handling.Load()) }
