package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/server/servertest"
)

// trace keeps, for the stress test below, every ledger read and write and
// every consumer info that the pools made, and every step-down, so that a
// job that went wrong can be told by what each read returned.
type trace struct {
	mu     sync.Mutex
	start  time.Time
	events []event
}

type event struct {
	at   time.Duration
	key  string // the ledger key it names; "" for others
	what string
}

func (tr *trace) add(key, format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.events = append(tr.events, event{at: time.Since(tr.start), key: key, what: fmt.Sprintf(format, args...)})
}

// story returns the events that name key, with the step-downs and
// consumer infos from a second before the first to a second after the
// last.
func (tr *trace) story(key string) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var from, to time.Duration = -1, -1
	for _, e := range tr.events {
		if e.key == key {
			if from < 0 {
				from = e.at
			}
			to = e.at
		}
	}
	var out []string
	for _, e := range tr.events {
		if e.key == key || e.key == "" && from >= 0 && e.at >= from-time.Second && e.at <= to+time.Second {
			out = append(out, fmt.Sprintf("%8.3fs %s", e.at.Seconds(), e.what))
		}
	}
	return out
}

// count counts the events whose text holds s.
func (tr *trace) count(s string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, e := range tr.events {
		if strings.Contains(e.what, s) {
			n++
		}
	}
	return n
}

// tracedKV logs the ledger's reads through a pool's bucket handle.
type tracedKV struct {
	jetstream.KeyValue
	node string
	tr   *trace
}

func (kv tracedKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := kv.KeyValue.Get(ctx, key)
	if err != nil {
		kv.tr.add(key, "%s get %s -> %v", kv.node, key, err)
		return e, err
	}
	rec, _ := decodeRec(e.Value())
	kv.tr.add(key, "%s get %s -> rev %d state %s", kv.node, key, e.Revision(), rec.State)
	return e, err
}

func (kv tracedKV) Create(ctx context.Context, key string, v []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := kv.KeyValue.Create(ctx, key, v, opts...)
	rec, _ := decodeRec(v)
	kv.tr.add(key, "%s create %s state %s -> rev %d %v", kv.node, key, rec.State, rev, err)
	return rev, err
}

func (kv tracedKV) Update(ctx context.Context, key string, v []byte, last uint64) (uint64, error) {
	rev, err := kv.KeyValue.Update(ctx, key, v, last)
	rec, _ := decodeRec(v)
	kv.tr.add(key, "%s update %s state %s over rev %d -> rev %d %v", kv.node, key, rec.State, last, rev, err)
	return rev, err
}

// tracedConsumer logs the consumer infos a pool's sweep goes by.
type tracedConsumer struct {
	jetstream.Consumer
	node string
	tr   *trace
}

func (c tracedConsumer) Info(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	info, err := c.Consumer.Info(ctx)
	if err != nil {
		c.tr.add("", "%s consumer info -> %v", c.node, err)
		return info, err
	}
	c.tr.add("", "%s consumer info -> delivered %d ack floor %d ack pending %d (leader %s)", c.node, info.Delivered.Stream, info.AckFloor.Stream, info.NumAckPending, info.Cluster.Leader)
	return info, err
}

// STRESS (bounded: 12s of step-downs, 25-50s in all; run by make soak,
// JOBQ_SOAK=1): pools on two nodes of a three-node cluster, everything
// replicated three times, while the leaders of the bucket's stream, WORKER
// and JOB each step down every 400ms, as a backlog and a steady flow of
// jobs run. Invariants 1-3 of DESIGN.md hold: every job ends done
// (nothing lost), none recorded done is dead-lettered, none is
// dead-lettered that never ran, none runs again but as resumed, no two runs
// of a job overlap.
//
// It logs what the step-downs cost: how many jobs first ran on a later
// delivery, and how many of those deliveries no pool ever got (the pools'
// acks and InProgress to WORKER are watched from node 0, which runs no
// pool). A delivery a pool got, and kept with InProgress, is delivered
// again all the same when WORKER's new leader goes by an older time for it:
// the time the job was stored, before its first InProgress is agreed on
// (see TestWorkerLeaderChangeRedeliversAJobThatWaitedInJOB), or an older
// InProgress's, when the last one reached the old leader as it stepped
// down, or no leader.
//
// Settings, for looking into it: JOBQ_STEPDOWN_SECONDS (12),
// JOBQ_STEPDOWN_JOBS (2000), JOBQ_STEPDOWN_ACKWAIT_MS (1000),
// JOBQ_STEPDOWN_MAXDELIVER (3), JOBQ_STEPDOWN_SET, which leaders step down
// each tick ("0,1,2": 0 the bucket's, 1 WORKER's, 2 JOB's; "none" for a
// control run), JOBQ_STEPDOWN_EXPLAIN_LATE (0): how many jobs that first
// ran on a later delivery to tell the story of.
func TestLeaderStepDownsOnAClusterKeepEveryJobOnce(t *testing.T) {
	if os.Getenv("JOBQ_SOAK") == "" {
		t.Skip("stress test: JOBQ_SOAK=1 runs it")
	}
	stepFor := time.Duration(envInt(t, "JOBQ_STEPDOWN_SECONDS", 12)) * time.Second
	nodes := servertest.StartCluster(t, 3)
	ackWait := time.Duration(envInt(t, "JOBQ_STEPDOWN_ACKWAIT_MS", 1000)) * time.Millisecond
	objs := onCluster(t, nodes, queue.Config{Workers: 4, Replicas: 3, AckWait: ackWait, MaxDeliver: envInt(t, "JOBQ_STEPDOWN_MAXDELIVER", 3)})
	tr := &trace{start: time.Now()}
	var logs servertest.LogBuffer
	log := zerolog.New(&logs).Level(zerolog.WarnLevel).With().Timestamp().Logger()

	b := &testBundle{js: objs[0].JS, obj: objs[0], prod: queue.NewProducer(objs[0].JS, objs[0].Config), cfg: objs[0].Config}
	c := newCounter()
	type run struct {
		attempt int
		resumed bool
		seq     uint64
	}
	var amu sync.Mutex
	runs := map[string][]run{} // each run's, by job ID
	h := c.wrap(func(_ context.Context, job *data.Job) error {
		amu.Lock()
		runs[job.ID] = append(runs[job.ID], run{job.Attempt, job.Resumed, job.Seq})
		amu.Unlock()
		time.Sleep(20 * time.Millisecond)
		return nil
	})
	for i, obj := range objs[1:] {
		o := *obj
		node := fmt.Sprintf("pool%d", i+1)
		o.Ledger = tracedKV{KeyValue: obj.Ledger, node: node, tr: tr}
		o.Worker = tracedConsumer{Consumer: obj.Worker, node: node, tr: tr}
		p := queue.NewPool(&o, h, log.With().Str("pool", node).Logger())
		if err := p.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.Stop(ctx); err != nil {
				t.Errorf("stop pool: %v", err)
			}
		})
	}

	// What the pools send WORKER about each job they hold: +WPI (in
	// progress), +ACK, -NAK, each on the ack subject of one delivery
	// ($JS.ACK.JOB.WORKER.<delivery count>.<stream seq>.…). Seen on node 0,
	// it takes no delivery: pulls go to the pools' own inboxes.
	sniff := servertest.ConnectNode(t, nodes[0])
	if _, err := sniff.Subscribe("$JS.ACK."+queue.StreamJob+"."+queue.ConsumerWorker+".>", func(m *nats.Msg) {
		tok := strings.Split(m.Subject, ".")
		if len(tok) < 7 {
			return
		}
		body := string(m.Data)
		if len(body) > 4 {
			body = body[:4]
		}
		tr.add("seq:"+tok[5], "pool -> WORKER %s for seq:%s delivery %s", body, tok[5], tok[4])
	}); err != nil {
		t.Fatal(err)
	}
	if err := sniff.Flush(); err != nil {
		t.Fatal(err)
	}

	// The step-downs, through node 0, which runs no pool.
	nc := objs[0].JS.Conn()
	set := os.Getenv("JOBQ_STEPDOWN_SET")
	if set == "" {
		set = "0,1,2"
	}
	stop := make(chan struct{})
	var stepping sync.WaitGroup
	stepping.Go(func() {
		subjects := []string{
			"$JS.API.STREAM.LEADER.STEPDOWN.KV_" + queue.BucketProcessed,
			"$JS.API.CONSUMER.LEADER.STEPDOWN." + queue.StreamJob + "." + queue.ConsumerWorker,
			"$JS.API.STREAM.LEADER.STEPDOWN." + queue.StreamJob,
		}
		tick := time.NewTicker(400 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var todo []string
			for _, k := range strings.Split(set, ",") {
				if j, err := strconv.Atoi(k); err == nil && j >= 0 && j < len(subjects) {
					todo = append(todo, subjects[j])
				}
			}
			for _, subj := range todo {
				m, err := nc.Request(subj, nil, 2*time.Second)
				if err != nil {
					tr.add("", "step down %s -> %v", subj, err)
					continue
				}
				tr.add("", "step down %s -> %s", subj, m.Data)
			}
		}
	})

	// Jobs enqueued while the leaders change: a backlog first, then a
	// steady flow.
	n := envInt(t, "JOBQ_STEPDOWN_JOBS", 2000)
	seqOf := map[string]uint64{}
	backlog := n / 2
	deadline := time.Now().Add(stepFor)
	for i := range n {
		id := fmt.Sprintf("job-%d", i)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ack, err := b.prod.Enqueue(ctx, "job.step", []byte("x"), queue.EnqueueOptions{ID: id})
			cancel()
			if err == nil {
				seqOf[id] = ack.Sequence
				break
			}
			if time.Now().After(deadline.Add(30 * time.Second)) {
				t.Fatalf("enqueue %s: %v", id, err)
			}
		}
		if i < backlog {
			continue
		}
		if wait := time.Until(deadline) / time.Duration(n-i); wait > 0 {
			time.Sleep(wait)
		}
	}
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	stepping.Wait()
	// As waitDrained, but a status read that fails (a leader just
	// elected) is read again.
	waitFor(t, time.Minute, func() error {
		st, err := queue.ReadStatus(context.Background(), b.obj)
		if err != nil {
			return err
		}
		if st.Stream.Messages != 0 || st.Consumer.AckPending != 0 {
			return fmt.Errorf("JOB holds %d jobs, %d ack pending; want 0 and 0", st.Stream.Messages, st.Consumer.AckPending)
		}
		return nil
	})
	// A sweep runs after the last dead letter could have come (every
	// ack wait): nothing to poll for, as none may come.
	time.Sleep(ackWait + time.Second)

	// Every dead letter, by job ID.
	dead := map[string][]string{}
	dlq, err := objs[0].JS.Stream(context.Background(), queue.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	info, err := dlq.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := dlq.GetMsg(context.Background(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		id := m.Header.Get(queue.HeaderJobID)
		dead[id] = append(dead[id], m.Header.Get(queue.HeaderError)+" attempts="+m.Header.Get(queue.HeaderAttempts))
	}

	// The invariants, job by job.
	var bad []string
	for i := range n {
		id := fmt.Sprintf("job-%d", i)
		rec, rerr := data.NewLedger(objs[0].Ledger, time.Minute, nil).Get(context.Background(), id)
		amu.Lock()
		ran := runs[id]
		amu.Unlock()
		var problem string
		switch {
		case len(dead[id]) > 0 && rerr == nil && rec.State == data.StateDone:
			problem = fmt.Sprintf("is recorded done and was dead-lettered: %v", dead[id])
		case len(dead[id]) > 0 && len(ran) == 0:
			problem = fmt.Sprintf("was dead-lettered and never ran: %v", dead[id])
		case len(dead[id]) > 0:
			problem = fmt.Sprintf("was dead-lettered, record %s %v: %v", rec.State, rerr, dead[id])
		case len(ran) == 0:
			problem = fmt.Sprintf("never ran, and is not in %s (record %s %v)", queue.StreamDLQ, rec.State, rerr)
		case rerr != nil || rec.State != data.StateDone:
			problem = fmt.Sprintf("ran, and is recorded %s %v", rec.State, rerr)
		}
		for _, r := range ran[min(len(ran), 1):] {
			if !r.resumed && problem == "" {
				problem = "ran again, not as resumed"
			}
		}
		if problem != "" {
			t.Errorf("job %s %s; its runs (attempt, resumed): %v", id, problem, ran)
			bad = append(bad, id)
		}
	}
	if c.overlap != 0 {
		t.Errorf("%d runs overlapped", c.overlap)
	}
	for _, id := range bad[:min(len(bad), 3)] {
		explain(t, objs[0].Ledger, tr, &logs, id, seqOf[id])
	}

	// How often the leaders' changes cost a job a delivery: of the
	// deliveries before a job's first run, those no pool said a word about
	// (it never got them), and those a pool kept with InProgress (WORKER
	// delivered the job again all the same).
	said := map[string]bool{}        // "seq:N delivery D" and "+WPI for seq:N delivery D"
	lastDelivery := map[string]int{} // by "seq:N": the last delivery a pool spoke of
	tr.mu.Lock()
	for _, e := range tr.events {
		if strings.HasPrefix(e.key, "seq:") {
			at := e.what[strings.Index(e.what, "seq:"):]
			said[at] = true
			if d, err := strconv.Atoi(at[strings.LastIndex(at, " ")+1:]); err == nil && d > lastDelivery[e.key] {
				lastDelivery[e.key] = d
			}
			if strings.Contains(e.what, "+WPI") {
				said["+WPI for "+at] = true
			}
		}
	}
	tr.mu.Unlock()
	first, again, unseen, kept := map[int]int{}, 0, 0, 0
	var late []string
	amu.Lock()
	for id, ran := range runs {
		first[ran[0].attempt]++
		again += len(ran) - 1
		if ran[0].attempt > 1 {
			late = append(late, id)
		}
		for d := 1; d < ran[0].attempt; d++ {
			at := fmt.Sprintf("seq:%d delivery %d", seqOf[id], d)
			switch {
			case !said[at]:
				unseen++
			case said["+WPI for "+at]:
				kept++
			}
		}
	}
	amu.Unlock()
	redelivered := 0
	for _, d := range lastDelivery {
		redelivered += d - 1
	}
	if k := envInt(t, "JOBQ_STEPDOWN_EXPLAIN_LATE", 0); k > 0 {
		slices.Sort(late)
		for _, id := range late[:min(len(late), k)] {
			explain(t, objs[0].Ledger, tr, &logs, id, seqOf[id])
		}
	}
	msgs := map[string]int{}
	for _, l := range strings.Split(logs.String(), "\n") {
		var e struct {
			Msg string `json:"message"`
		}
		if json.Unmarshal([]byte(l), &e) == nil && e.Msg != "" {
			msgs[e.Msg]++
		}
	}
	for m, k := range msgs {
		t.Logf("logged %5d x %s", k, m)
	}
	t.Logf("%d step-downs (%d refused or unanswered); %d jobs: first runs by delivery %v; of the deliveries before them, %d never reached a pool and %d were delivered again while a pool kept them with InProgress; %d deliveries after a job's first in all; %d runs again (resumed), %d dead letters; %d jobs with a defect",
		tr.count("step down"), tr.count("step down")-tr.count(`"success":true`), n, first, unseen, kept, redelivered, again, len(dead), len(bad))
}

// explain logs what is known about job id: its record's history, what the
// pools read and wrote, and the pools' log lines that name it.
func explain(t *testing.T, kv jetstream.KeyValue, tr *trace, logs *servertest.LogBuffer, id string, seq uint64) {
	t.Helper()
	t.Logf("---- job %s: its record's history", id)
	hist, err := kv.History(context.Background(), data.Key(id))
	if err != nil {
		t.Logf("  history: %v", err)
	}
	for _, e := range hist {
		rec, _ := decodeRec(e.Value())
		t.Logf("  rev %d at %s: %s worker %s attempts %d resumed %v err %q", e.Revision(), e.Created().Format("15:04:05.000"), rec.State, rec.Worker, rec.Attempts, rec.Resumed, rec.LastError)
	}
	t.Logf("---- job %s: what the pools read and wrote (with the step-downs and consumer infos around)", id)
	for _, e := range tr.story(data.Key(id)) {
		t.Log("  " + e)
	}
	t.Logf("---- job %s (seq %d): what the pools sent WORKER about it", id, seq)
	for _, e := range tr.story("seq:" + strconv.FormatUint(seq, 10)) {
		if !strings.Contains(e, "consumer info") {
			t.Log("  " + e)
		}
	}
	t.Logf("---- job %s: log lines", id)
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"`+id+`"`) {
			t.Log("  " + l)
		}
	}
}

// decodeRec decodes a ledger record, as much as it can.
func decodeRec(b []byte) (data.Record, error) {
	var r data.Record
	err := json.Unmarshal(b, &r)
	return r, err
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	var v int
	if _, err := fmt.Sscan(s, &v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// STRESS (bounded, about 15s; run by make soak, JOBQ_SOAK=1): is a read
// of the replicated bucket ever stale across a change of its leader? A
// writer on node 1 updates one key (a compare-and-set, as the ledger's
// writes are) as fast as it can; a reader on node 2 reads it (a get of the
// last message of its subject, as the ledger's reads are, which a bucket
// without direct gets has its leader answer), while the bucket's leader
// steps down every 150ms. No read that began after a write was
// acknowledged may return an older revision: one that did is what a new
// leader answering before it applied its log would return. (The same
// probe on a bucket with direct gets, which any replica answers, finds
// stale reads by the thousand.)
func TestBucketReadsStayCurrentAcrossLeaderStepDowns(t *testing.T) {
	if os.Getenv("JOBQ_SOAK") == "" {
		t.Skip("stress test: JOBQ_SOAK=1 runs it")
	}
	t.Parallel()
	nodes := servertest.StartCluster(t, 3)
	objs := onCluster(t, nodes, queue.Config{Replicas: 3})
	ctx := context.Background()
	w, r := objs[1].Ledger, objs[2].Ledger
	rev, err := w.Create(ctx, "probe", []byte("0"))
	if err != nil {
		t.Fatal(err)
	}
	var acked atomic.Uint64 // the last revision whose write was acknowledged
	acked.Store(rev)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writes, writeErrs, reads, readErrs, stale atomic.Int64
	var staleMu sync.Mutex
	var staleSeen []string
	wg.Go(func() {
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			last := acked.Load()
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			rev, err := w.Update(cctx, "probe", []byte(strconv.Itoa(i)), last)
			cancel()
			if err != nil {
				writeErrs.Add(1)
				// An update whose answer was lost may have landed: go on
				// from the revision there.
				if e, gerr := w.Get(ctx, "probe"); gerr == nil && e.Revision() > acked.Load() {
					acked.Store(e.Revision())
				}
				continue
			}
			writes.Add(1)
			acked.Store(rev)
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			before := acked.Load()
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			e, err := r.Get(cctx, "probe")
			cancel()
			if err != nil {
				readErrs.Add(1)
				continue
			}
			reads.Add(1)
			if e.Revision() < before {
				stale.Add(1)
				staleMu.Lock()
				staleSeen = append(staleSeen, fmt.Sprintf("read revision %d after revision %d was acknowledged", e.Revision(), before))
				staleMu.Unlock()
			}
		}
	})
	nc := objs[0].JS.Conn()
	steps := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(150 * time.Millisecond)
		if m, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN.KV_"+queue.BucketProcessed, nil, 2*time.Second); err == nil && strings.Contains(string(m.Data), `"success":true`) {
			steps++
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d step-downs; %d writes (%d failed), %d reads (%d failed), %d stale", steps, writes.Load(), writeErrs.Load(), reads.Load(), readErrs.Load(), stale.Load())
	if stale.Load() > 0 {
		t.Errorf("%d stale reads, e.g. %v", stale.Load(), staleSeen[:min(len(staleSeen), 5)])
	}
	if steps < 20 || reads.Load() < 100 {
		t.Errorf("%d step-downs and %d reads: too few to tell", steps, reads.Load())
	}
}
