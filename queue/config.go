package queue

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Config configures provisioning, the producer and the worker pool. Zero
// fields take their defaults in withDefaults.
type Config struct {
	// DedupeWindow is how long JOB remembers a Nats-Msg-Id to drop a
	// republished job. Defaults to 10m.
	DedupeWindow time.Duration
	// MaxDeliver is how many times a job is delivered before it is
	// dead-lettered. Defaults to 3.
	MaxDeliver int
	// AckWait is how long a delivered job may go without an ack or a
	// heartbeat before it is redelivered. Defaults to 60s.
	AckWait time.Duration
	// ProcessedTTL is how long a ledger record lives after its last write.
	// Defaults to 168h (7 days).
	ProcessedTTL time.Duration
	// Workers is how many jobs run at once. Defaults to 4.
	Workers int
	// Prefetch is how many more jobs than Workers the pool holds while
	// their ledger records are read and written, so that those round trips
	// overlap with running handlers; it also sizes the pulls. Jobs waiting
	// for a worker get heartbeats. The pool keeps up to Workers + Prefetch
	// payloads in memory, within PrefetchBytes; a job whose handler
	// succeeded leaves that room at once, to wait for its record and ack
	// (as many again at most). Defaults to 512.
	Prefetch int
	// PrefetchBytes bounds the payload bytes of the jobs the pool holds,
	// running and waiting: a pull asks for no more than the room left. A
	// job larger than the bound still runs, alone. Defaults to 32 MiB.
	PrefetchBytes int64
	// RetryBackoff is the delay before attempt n+1 after attempt n failed:
	// RetryBackoff[n-1], the last entry repeating. Defaults to 1s, 10s, 1m.
	RetryBackoff []time.Duration
	// JobTimeout bounds one attempt; 0 means no limit.
	JobTimeout time.Duration
	// MaxPayload is the largest payload Enqueue accepts. Defaults to 1 MiB.
	MaxPayload int
	// FetchWait is how long one pull waits for jobs: 10ms or more, 1s by
	// default. Stop waits at most FetchWait + 1s for the fetcher.
	FetchWait time.Duration
	// MaxBytes caps the bytes JOB stores; a full JOB refuses new jobs
	// rather than dropping stored ones. Set it below the server's storage
	// limit so the ledger and DLQ keep room to finish the stored jobs.
	// 0 means no cap of its own.
	MaxBytes int64
	// DeadMaxBytes caps the bytes DLQ stores; a full DLQ refuses dead
	// letters, whose jobs stay in JOB until there is room (jobq dlq retry
	// or purge), rather than take the ledger's room: without records no
	// job could finish. 0 means no cap of its own.
	DeadMaxBytes int64
	// Replicas is how many copies of JOB, DLQ and processed a cluster
	// keeps, when Provision creates them: 1 (the default), or up to 5 on a
	// cluster of as many nodes. A replicated processed bucket answers reads
	// from its leader alone (no direct gets), so its pools claim each job
	// with a ledger write before it runs rather than lease batches of them.
	// Existing objects must have as many (see Provision).
	Replicas int
	// NoLedger turns the ledger off: jobs are processed at least once, as
	// with a plain JetStream worker, and a redelivered or republished job
	// runs again. For throughput where handlers are idempotent.
	NoLedger bool
	// WorkerName identifies this process in ledger records. Defaults to
	// host name and process ID.
	WorkerName string
	// Metrics receives the producer's and the pool's counts (see
	// NewMetrics). nil means none.
	Metrics *Metrics
	// Observer is told how each job's attempt ended (see Observer). nil
	// means none.
	Observer Observer
}

// MaxReplicas is the most copies a NATS cluster keeps of a stream.
const MaxReplicas = 5

// StoreShares splits a store of maxStore bytes into JOB's MaxBytes and
// DLQ's DeadMaxBytes. JOB gets three quarters: a full JOB refuses new jobs
// while the ledger and DLQ keep room to finish the stored ones. DLQ gets an
// eighth: dead letters nobody clears would otherwise fill the ledger's
// room, and no job could be recorded. The ledger has the rest.
func StoreShares(maxStore int64) (jobs, dead int64) { return maxStore * 3 / 4, maxStore / 8 }

// deadShareOf is DLQ's share of the store that StoreShares gave JOB jobs
// bytes of: a sixth of them.
func deadShareOf(jobs int64) int64 { return jobs / 6 }

// MaxWorkers and MaxPrefetch bound a pool: each worker is a goroutine, and
// WORKER lets twice workers and prefetch be delivered unacked, which only
// grows (see ensureConsumer).
const (
	MaxWorkers  = 10_000
	MaxPrefetch = 100_000
)

// Defaults of Config.
const (
	DefaultDedupeWindow  = 10 * time.Minute
	DefaultMaxDeliver    = 3
	DefaultAckWait       = 60 * time.Second
	DefaultProcessedTTL  = 7 * 24 * time.Hour
	DefaultWorkers       = 4
	DefaultPrefetch      = 512
	DefaultPrefetchBytes = 32 << 20
	DefaultMaxPayload    = 1 << 20
)

// DefaultRetryBackoff is the default of Config.RetryBackoff.
var DefaultRetryBackoff = []time.Duration{time.Second, 10 * time.Second, time.Minute}

func (c Config) withDefaults() Config {
	if c.DedupeWindow == 0 {
		c.DedupeWindow = DefaultDedupeWindow
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = DefaultMaxDeliver
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.ProcessedTTL == 0 {
		c.ProcessedTTL = DefaultProcessedTTL
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
	if c.PrefetchBytes == 0 {
		c.PrefetchBytes = DefaultPrefetchBytes
	}
	if len(c.RetryBackoff) == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = DefaultMaxPayload
	}
	if c.FetchWait == 0 {
		c.FetchWait = time.Second
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.WorkerName == "" {
		host, _ := os.Hostname()
		c.WorkerName = host + "-" + strconv.Itoa(os.Getpid())
	}
	return c
}

// Validate reports the first problem with c after defaults are applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.DedupeWindow < 0:
		return fmt.Errorf("dedupe window %s is negative", c.DedupeWindow)
	case c.MaxDeliver < 1:
		return fmt.Errorf("max deliver %d: want 1 or more", c.MaxDeliver)
	case c.AckWait < time.Second:
		return fmt.Errorf("ack wait %s: want 1s or more", c.AckWait)
	case c.ProcessedTTL < time.Second:
		return fmt.Errorf("processed ttl %s: want 1s or more", c.ProcessedTTL)
	case c.ProcessedTTL < c.DedupeWindow:
		return fmt.Errorf("processed ttl %s is shorter than the dedupe window %s: a republished job could run twice", c.ProcessedTTL, c.DedupeWindow)
	case c.Workers < 0 || c.Workers > MaxWorkers:
		return fmt.Errorf("workers %d: want 0 to %d", c.Workers, MaxWorkers)
	case c.Prefetch < 0 || c.Prefetch > MaxPrefetch:
		return fmt.Errorf("prefetch %d: want 0 to %d", c.Prefetch, MaxPrefetch)
	case c.PrefetchBytes < 0:
		return fmt.Errorf("prefetch bytes %d is negative", c.PrefetchBytes)
	case c.FetchWait < 10*time.Millisecond:
		return fmt.Errorf("fetch wait %s: want 10ms or more, or an idle pool pulls without pause", c.FetchWait)
	case c.JobTimeout < 0:
		return fmt.Errorf("job timeout %s is negative", c.JobTimeout)
	case c.MaxBytes < 0:
		return fmt.Errorf("max bytes %d is negative", c.MaxBytes)
	case c.DeadMaxBytes < 0:
		return fmt.Errorf("dead letter max bytes %d is negative", c.DeadMaxBytes)
	case c.MaxPayload < 0:
		return fmt.Errorf("max payload %d is negative", c.MaxPayload)
	case c.Replicas < 1 || c.Replicas > MaxReplicas:
		return fmt.Errorf("replicas %d: want 1 to %d", c.Replicas, MaxReplicas)
	}
	for _, d := range c.RetryBackoff {
		if d < 0 {
			return errors.New("retry backoff has a negative duration")
		}
	}
	return nil
}

// backoff returns the delay after failed attempt n (1-based).
func (c Config) backoff(attempt int) time.Duration {
	i := min(max(attempt-1, 0), len(c.RetryBackoff)-1)
	return c.RetryBackoff[i]
}

// lease is how long a claim stays live without renewal: two thirds of
// AckWait. Heartbeats renew it every AckWait/3, so a live worker never lets
// it lapse, and a job redelivered after its worker died (AckWait after the
// last heartbeat) always finds it expired.
func (c Config) lease() time.Duration { return c.AckWait * 2 / 3 }

// heartbeat is how often a running job's lease is renewed.
func (c Config) heartbeat() time.Duration { return c.AckWait / 3 }
