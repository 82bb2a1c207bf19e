package queue_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// benchPayload is the payload size of the pipeline benchmarks, jobq bench's
// default.
const benchPayload = 128

func benchObjects(b *testing.B, cfg queue.Config) *queue.Objects {
	obj, _ := benchClients(b, cfg)
	return obj
}

// benchClients provisions the objects over one connection and binds them
// over a second, for the workers, as jobq serve and jobq bench do.
func benchClients(b *testing.B, cfg queue.Config) (producer, workers *queue.Objects) {
	b.Helper()
	srv := servertest.Start(b)
	js, err := jetstream.New(servertest.Connect(b, srv))
	if err != nil {
		b.Fatal(err)
	}
	producer, err = queue.Provision(context.Background(), js, cfg, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	wjs, err := jetstream.New(servertest.Connect(b, srv))
	if err != nil {
		b.Fatal(err)
	}
	if workers, err = producer.Bind(context.Background(), wjs); err != nil {
		b.Fatal(err)
	}
	return producer, workers
}

// cpuMeter reports the CPU time the whole process (clients, pool and the
// embedded server) spent per job while the timer ran, how many cores that
// kept busy on average, and the page faults per job (see
// queue.BenchResult.ProcessFaults): on a shared machine the jobs per second
// move with the neighbours' load, the CPU per job much less.
type cpuMeter struct {
	start  time.Duration
	faults int64
	ok     bool
}

func startCPU() cpuMeter {
	t, faults, ok := queue.ProcessUsage()
	return cpuMeter{start: t, faults: faults, ok: ok}
}

func (m cpuMeter) report(b *testing.B) {
	end, faults, ok := queue.ProcessUsage()
	if !m.ok || !ok || b.Elapsed() <= 0 {
		return
	}
	used := end - m.start
	b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu-ns/job")
	b.ReportMetric(used.Seconds()/b.Elapsed().Seconds(), "cores")
	b.ReportMetric(float64(faults-m.faults)/float64(b.N), "faults/job")
}

// BenchmarkLedgerClaimDone is one job's ledger writes, one after another.
func BenchmarkLedgerClaimDone(b *testing.B) {
	obj := benchObjects(b, queue.Config{})
	l := data.NewLedger(obj.Ledger, time.Minute, nil)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		job := &data.Job{ID: "bench-" + strconv.Itoa(i), Subject: "job.bench", Seq: uint64(i + 1)}
		i++
		c, err := l.Claim(ctx, job, "w")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Done(ctx, &c, time.Millisecond); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPipeline is the whole worker pool: jobs per second from a
// pre-filled queue through claim, handler, completion and ack.
//
// As in jobq bench and jobq serve, the producer and the workers have
// connections of their own, and payloads are benchPayload bytes. With one
// connection for both, as this benchmark had before, jobq without its
// ledger measured as fast as the baseline; with a connection each it
// measures 0.75-0.84 of it (medians of eight interleaved runs of 20,000
// jobs), as jobq bench finds too.
func BenchmarkPipeline(b *testing.B) {
	for _, tt := range []struct {
		name     string
		noLedger bool
	}{{"baseline", true}, {"ledger", false}, {"no_ledger", true}} {
		b.Run(tt.name, func(b *testing.B) {
			pobj, obj := benchClients(b, queue.Config{Workers: 8, NoLedger: tt.noLedger})
			p := queue.NewProducer(pobj.JS, pobj.Config)
			defer p.Close()
			futures := make([]jetstream.PubAckFuture, b.N)
			for i := range b.N {
				f, err := p.EnqueueAsync("job.bench", make([]byte, benchPayload), queue.EnqueueOptions{ID: "b-" + strconv.Itoa(i)})
				if err != nil {
					b.Fatal(err)
				}
				futures[i] = f
			}
			// A job not stored would leave the pool waiting for it for good.
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					b.Fatalf("fill the queue: %v", err)
				}
			}
			var handled atomic.Int64
			done := make(chan struct{})
			if tt.name == "baseline" {
				b.ReportAllocs()
				b.ResetTimer()
				cpu := startCPU()
				cc, err := obj.Worker.Consume(func(m jetstream.Msg) {
					if handled.Add(1) == int64(b.N) {
						close(done)
					}
					m.Ack()
				}, jetstream.PullMaxMessages(500))
				if err != nil {
					b.Fatal(err)
				}
				<-done
				b.StopTimer()
				cpu.report(b)
				cc.Stop()
				return
			}
			pool := queue.NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
				if handled.Add(1) == int64(b.N) {
					close(done)
				}
				return nil
			}), zerolog.Nop())
			b.ReportAllocs()
			b.ResetTimer()
			cpu := startCPU()
			if err := pool.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			<-done
			b.StopTimer()
			cpu.report(b)
			reportLedgerWrites(b, obj)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pool.Stop(ctx)
		})
	}
}

// BenchmarkEndToEnd is producer and pool together: jobs per second from
// publishing (async, a window of 256) to handled.
//
// record_floor is the baseline loop plus what the ledger cannot do without:
// one compare-and-set write per job to the processed bucket, pipelined, the
// job acked once its write is confirmed. It is the floor under the ledger's
// cost on this substrate, without any of jobq's own work.
func BenchmarkEndToEnd(b *testing.B) {
	for _, tt := range []struct {
		name     string
		noLedger bool
	}{{"baseline", true}, {"record_floor", true}, {"ledger", false}, {"no_ledger", true}} {
		b.Run(tt.name, func(b *testing.B) {
			obj, wobj := benchClients(b, queue.Config{Workers: 8, NoLedger: tt.noLedger})
			var handled atomic.Int64
			done := make(chan struct{})
			count := func() {
				if handled.Add(1) == int64(b.N) {
					close(done)
				}
			}
			switch tt.name {
			case "baseline":
				cc, err := wobj.Worker.Consume(func(m jetstream.Msg) {
					count()
					m.Ack()
				}, jetstream.PullMaxMessages(500))
				if err != nil {
					b.Fatal(err)
				}
				defer cc.Stop()
			case "record_floor":
				stop := consumeWithRecords(b, wobj, count)
				defer stop()
			default:
				pool := queue.NewPool(wobj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
					count()
					return nil
				}), zerolog.Nop())
				if err := pool.Start(context.Background()); err != nil {
					b.Fatal(err)
				}
				defer func() {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					pool.Stop(ctx)
				}()
			}
			p := queue.NewProducer(obj.JS, obj.Config)
			defer p.Close()
			b.ReportAllocs()
			b.ResetTimer()
			cpu := startCPU()
			futures := make([]jetstream.PubAckFuture, 0, 256)
			for i := range b.N {
				f, err := p.EnqueueAsync("job.bench", make([]byte, benchPayload), queue.EnqueueOptions{ID: "e-" + strconv.Itoa(i)})
				if err != nil {
					b.Fatal(err)
				}
				if futures = append(futures, f); len(futures) == cap(futures) {
					for _, f := range futures {
						select {
						case <-f.Ok():
						case err := <-f.Err():
							b.Fatal(err)
						}
					}
					futures = futures[:0]
				}
			}
			<-done
			b.StopTimer()
			cpu.report(b)
			if tt.name == "ledger" {
				reportLedgerWrites(b, obj)
			}
		})
	}
}

// reportLedgerWrites reports the processed bucket's writes per job: one
// record per job, and the leases' share.
func reportLedgerWrites(b *testing.B, obj *queue.Objects) {
	b.Helper()
	s, err := obj.JS.Stream(context.Background(), "KV_"+queue.BucketProcessed)
	if err != nil {
		b.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(info.State.LastSeq)/float64(b.N), "writes/job")
}

// consumeWithRecords runs the record floor's loop: each delivered job gets
// a new record in the processed bucket (expecting none), and is acked once
// the bucket confirmed it. count is called per acked job.
func consumeWithRecords(b *testing.B, obj *queue.Objects, count func()) (stop func()) {
	b.Helper()
	type pending struct {
		f jetstream.PubAckFuture
		m jetstream.Msg
	}
	// About the size of a done record.
	record := []byte(`{"id":"e-0000000","state":"done","subject":"job.bench","seq":1234567,"attempts":1,"worker":"bench/0",` +
		`"first_at":"2026-12-01T12:00:00.123456789Z","started_at":"2026-12-01T12:00:00.123456789Z","finished_at":"2026-12-01T12:00:00.123556789Z","took_ns":100000}`)
	// A bounded window, as jobq's prefetch is: delivered and unacked jobs
	// stay under WORKER's MaxAckPending (1040), where nats.go's Consume
	// would stall until its heartbeat check gives up.
	acks := make(chan pending, 256)
	acked := make(chan struct{})
	go func() {
		defer close(acked)
		for p := range acks {
			select {
			case <-p.f.Ok():
			case err := <-p.f.Err():
				b.Error(err)
				return
			}
			p.m.Ack()
			count()
		}
	}()
	cc, err := obj.Worker.Consume(func(m jetstream.Msg) {
		rec := nats.NewMsg("$KV." + queue.BucketProcessed + "." + data.Key(m.Headers().Get(nats.MsgIdHdr)))
		rec.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		rec.Data = record
		f, err := obj.JS.PublishMsgAsync(rec)
		if err != nil {
			b.Error(err)
			return
		}
		acks <- pending{f, m}
	}, jetstream.PullMaxMessages(500))
	if err != nil {
		b.Fatal(err)
	}
	return func() {
		cc.Stop()
		close(acks)
		<-acked
	}
}
