package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errEarlierJOB is an ack, Nak or Term not sent for a job of a JOB that may
// have been deleted since the job was fetched, or while the connection is
// down, which could hide that (see jobStream.earlier); or a heartbeat not
// sent for a job of a JOB that was. The server matches each by its stream
// sequence alone, so once JOB is made anew it would reach the new JOB's
// job at that sequence: an ack would remove that job, held by another
// worker, from JOB, and lose it should that worker stop before it acks; a
// Nak would deliver it again while it runs.
var errEarlierJOB = errors.New(StreamJob + " may have been deleted and made anew since the job was delivered (or this cannot be told: the connection to the server is down, or " + StreamJob + " did not answer a look-up): an ack now could reach the job at its sequence in a " + StreamJob + " made anew")

// jobStreamWatchEvery is how often a pool looks JOB up, to learn of a JOB
// made anew whose deletion it was not told of: the server's advisory of a
// deleted stream does not always go out.
const jobStreamWatchEvery = time.Second

// mayBeGone is jobStream.created while JOB may have been deleted since it
// was last looked up.
const mayBeGone = math.MaxInt64

// jobStream tells whether a delivery is of the JOB there is now (see
// errEarlierJOB). It knows when JOB was created, as last looked up; a job
// fetched since is of that JOB. A job fetched while it knew another is of
// an earlier JOB if it was stored before the JOB there is now was created:
// one stored after is the new JOB's, fetched before the look-up.
type jobStream struct {
	js jetstream.JetStream
	// created is the UnixNano of JOB's creation, the server's time, as
	// last looked up; mayBeGone while JOB may have been deleted since.
	created atomic.Int64
	// told counts what said that JOB may be gone: a look-up sent before
	// one of them does not undo it.
	told atomic.Uint64
	// eager: look JOB up again before each check, for a single job (jobq
	// next), rather than keep watching it.
	eager       bool
	afterLookUp func() // Objects.afterJOBLookUp
}

// newJobStream tracks the JOB of obj, as looked up last (obj.Jobs).
func newJobStream(obj *Objects, eager bool) *jobStream {
	s := &jobStream{js: obj.JS, eager: eager, afterLookUp: obj.afterJOBLookUp}
	if info := obj.Jobs.CachedInfo(); info != nil {
		s.created.Store(info.Created.UnixNano())
	}
	return s
}

// mayBeGone marks JOB as possibly deleted, until a look-up sent after says.
func (s *jobStream) mayBeGone() {
	s.told.Add(1)
	s.created.Store(mayBeGone)
}

// lookUp reads when JOB was created, and reports whether it was told.
// Without an answer what it knew stays.
func (s *jobStream) lookUp(ctx context.Context) bool {
	told := s.told.Load()
	st, err := s.js.Stream(ctx, StreamJob)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) || s.told.Load() != told {
		return false // the next look-up tells
	}
	created := int64(mayBeGone)
	if err == nil {
		created = st.CachedInfo().Created.UnixNano()
	}
	s.created.Store(created)
	if s.told.Load() != told {
		s.created.Store(mayBeGone) // told meanwhile: the next look-up tells
	}
	return true
}

// lookUpTries looks JOB up until told, at most tries times, each waiting up
// to wait, and reports whether it was told.
func (s *jobStream) lookUpTries(tries int, wait time.Duration) bool {
	for range tries {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		told := s.lookUp(ctx)
		cancel()
		if told {
			return true
		}
	}
	return false
}

// now is the JOB there is now, as last looked up, for a job fetched now.
func (s *jobStream) now() int64 { return s.created.Load() }

// earlier reports whether a job stored at stored, and fetched while the JOB
// was of, may be of a JOB deleted since, for its ack, Nak or Term. While the
// connection is down it may: sent, they would wait in the client's
// reconnect buffer, to go out once JOB may have been made anew, unseen.
// An eager jobStream looks JOB up first, a few times if it must; with no
// answer, it may: such a jobStream watches nothing else that would tell.
func (s *jobStream) earlier(of int64, stored time.Time) bool {
	if !s.js.Conn().IsConnected() {
		return true
	}
	// The connection is looked at again after the look-ups: one lost
	// while they were answered would hold the ack in nats.go's reconnect
	// buffer, to go out once it is back, when JOB may be made anew.
	if s.eager {
		if !s.lookUpTries(3, opTimeout/3) {
			return true
		}
		if s.afterLookUp != nil {
			s.afterLookUp()
		}
		if !s.js.Conn().IsConnected() {
			return true
		}
	}
	now := s.created.Load()
	return now != of && stored.UnixNano() < now
}

// knownEarlier reports whether a job stored at stored, and fetched while
// the JOB was of, is of a JOB deleted since, as a look-up found: for its
// heartbeats, which go out still while JOB may be gone (the connection
// down, say), so that its ack wait is reset once the connection is back,
// not run out. Sent to a JOB made anew, one would only put off the
// redelivery of the job at its sequence.
func (s *jobStream) knownEarlier(of int64, stored time.Time) bool {
	now := s.created.Load()
	return now != of && now != mayBeGone && stored.UnixNano() < now
}

// watch keeps s up to date until ctx ends: JOB may be gone once the server
// says it was deleted, or that WORKER was (see errWorkerDeleted), or once
// the connection went down, until a look-up after says; it is looked up at
// once when the connection is back, and every jobStreamWatchEvery. It
// subscribes before it returns.
func (s *jobStream) watch(ctx context.Context) (stopped <-chan struct{}, err error) {
	nc := s.js.Conn()
	sub, err := nc.Subscribe(advisoryJobStreamDeleted, func(*nats.Msg) { s.mayBeGone() })
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", advisoryJobStreamDeleted, err)
	}
	status := nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CONNECTED)
	if !nc.IsConnected() {
		s.mayBeGone()
	}
	done := make(chan struct{})
	back := make(chan struct{}, 1) // the connection is back: look JOB up
	var statuses sync.WaitGroup
	// The connection's statuses have a goroutine of their own, so that a
	// look-up under way does not hold up the mark of JOB maybe gone.
	statuses.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case st := <-status:
				if st != nats.CONNECTED {
					s.mayBeGone()
					continue
				}
				select {
				case back <- struct{}{}:
				default:
				}
			}
		}
	})
	go func() {
		defer close(done)
		defer sub.Unsubscribe()
		defer nc.RemoveStatusListener(status)
		defer statuses.Wait()
		t := time.NewTicker(jobStreamWatchEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-back:
			case <-t.C:
			}
			opCtx, cancel := context.WithTimeout(ctx, jobStreamWatchEvery)
			s.lookUp(opCtx)
			cancel()
		}
	}()
	return done, nil
}
