package dashboard

import (
	"sync"
	"time"

	"github.com/jobq/jobq/data"
)

// What the Recorder keeps.
const (
	// RecentJobs is how many finished attempts the Recorder keeps.
	RecentJobs = 50
	// BucketWidth is the span of one throughput bucket.
	BucketWidth = 10 * time.Second
	// Buckets is how many buckets the throughput history holds: 15 minutes.
	Buckets = 90
)

// Recorder is a queue.Observer that keeps what the dashboard shows of the
// pool's work: counts since it was made, the last RecentJobs attempts, and
// completed and failed attempts per BucketWidth over the last
// Buckets*BucketWidth. Set it as queue.Config.Observer. It is safe for
// concurrent use; JobFinished takes a short lock and allocates nothing.
type Recorder struct {
	mu     sync.Mutex
	counts Counts
	recent [RecentJobs]Attempt // a ring: next is the oldest once full
	next   int
	n      int
	slots  [Buckets]bucket // slot i holds the bucket whose number % Buckets == i
}

// Counts are the outcomes a Recorder saw.
type Counts struct {
	// Completed jobs had their completion recorded.
	Completed uint64
	// Retried attempts failed and were released for a retry.
	Retried uint64
	// Failed jobs were moved to the dead-letter stream.
	Failed uint64
}

// Attempt is one finished attempt of a job.
type Attempt struct {
	ID      string
	Subject string
	Attempt int
	State   data.State
	Took    time.Duration
	At      time.Time
	err     error // its Error() is taken when shown, not on the hot path
}

// Error is the cause of a retry or failure, or "".
func (a Attempt) Error() string {
	if a.err == nil {
		return ""
	}
	return a.err.Error()
}

// bucket counts the outcomes of one BucketWidth; num, its number since the
// Unix epoch, tells which one, so a slot left from an older lap reads as
// empty.
type bucket struct {
	num      int64
	ok, fail uint32
}

// Point is the throughput of one bucket.
type Point struct {
	// Start is when the bucket began.
	Start time.Time
	// Completed jobs and Failed attempts (retried or dead-lettered).
	Completed, Failed int
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{} }

// JobFinished implements queue.Observer.
func (r *Recorder) JobFinished(job *data.Job, state data.State, took time.Duration, err error) {
	now := time.Now()
	num := now.UnixNano() / int64(BucketWidth)
	r.mu.Lock()
	defer r.mu.Unlock()
	b := &r.slots[num%Buckets]
	if b.num != num {
		*b = bucket{num: num}
	}
	switch state {
	case data.StateDone:
		r.counts.Completed++
		b.ok++
	case data.StateRetrying:
		r.counts.Retried++
		b.fail++
	case data.StateFailed:
		r.counts.Failed++
		b.fail++
	}
	r.recent[r.next] = Attempt{ID: job.ID, Subject: job.Subject, Attempt: job.Attempt, State: state, Took: took, At: now, err: err}
	r.next = (r.next + 1) % RecentJobs
	r.n = min(r.n+1, RecentJobs)
}

// Counts returns the outcomes seen so far.
func (r *Recorder) Counts() Counts {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts
}

// Recent returns the last finished attempts, newest first.
func (r *Recorder) Recent() []Attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Attempt, 0, r.n)
	for i := 1; i <= r.n; i++ {
		out = append(out, r.recent[(r.next-i+RecentJobs)%RecentJobs])
	}
	return out
}

// Throughput returns the Buckets buckets up to the one holding now, oldest
// first.
func (r *Recorder) Throughput(now time.Time) []Point {
	last := now.UnixNano() / int64(BucketWidth)
	out := make([]Point, Buckets)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range out {
		num := last - Buckets + 1 + int64(i)
		out[i].Start = time.Unix(0, num*int64(BucketWidth))
		if b := r.slots[num%Buckets]; b.num == num {
			out[i].Completed, out[i].Failed = int(b.ok), int(b.fail)
		}
	}
	return out
}
