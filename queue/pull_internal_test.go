package queue

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobq/jobq/server/servertest"
)

func TestPullEndsOnTheServersWord(t *testing.T) {
	status := func(code, desc string) *nats.Msg {
		return &nats.Msg{Header: nats.Header{"Status": {code}, "Description": {desc}}}
	}
	job := &nats.Msg{Subject: "job.x", Reply: "$JS.ACK.JOB.WORKER.1.1.1.1700000000000000000.0", Data: []byte("0123456789")}
	// A job may carry any header, a Status too, and no payload.
	statusJob := &nats.Msg{Subject: "job.x", Reply: "$JS.ACK.JOB.WORKER.1.2.2.1700000000000000000.0", Header: nats.Header{"Status": {"404"}, "Description": {"No Messages"}}}
	for _, tt := range []struct {
		name    string
		n       int
		bytes   int64
		msgs    []*nats.Msg
		got     int
		ended   bool
		refused bool
	}{
		{name: "heartbeat", n: 5, msgs: []*nats.Msg{status("100", "Idle Heartbeat"), job}, got: 1},
		{name: "wait ran out", n: 5, msgs: []*nats.Msg{job, status("408", "Request Timeout")}, got: 1, ended: true},
		{name: "no jobs", n: 5, msgs: []*nats.Msg{status("404", "No Messages")}, ended: true},
		{name: "next job too big", n: 5, msgs: []*nats.Msg{status("409", "Message Size Exceeds MaxBytes")}, ended: true},
		{name: "batch completed", n: 5, msgs: []*nats.Msg{job, status("409", "Batch Completed")}, got: 1, ended: true},
		{name: "over a limit of WORKER's", n: 5, msgs: []*nats.Msg{status("409", "Exceeded MaxRequestBatch of 3")}, ended: true, refused: true},
		{name: "batch used up", n: 2, msgs: []*nats.Msg{job, job, job}, got: 2, ended: true},
		{name: "bytes used up", n: 5, bytes: int64(job.Size()) * 2, msgs: []*nats.Msg{job, job, job}, got: 2, ended: true},
		{name: "a job with a Status header", n: 5, msgs: []*nats.Msg{statusJob, job}, got: 2},
		{name: "a job with a heartbeat's header", n: 5, msgs: []*nats.Msg{{Subject: "job.x", Reply: job.Reply, Header: nats.Header{"Status": {"100"}}}}, got: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			admitted := 0
			pl := &pull{admit: func(*nats.Msg) { admitted++ }, n: tt.n, maxBytes: tt.bytes, done: make(chan struct{})}
			for _, m := range tt.msgs {
				pl.receive(m)
			}
			got, err := pl.result()
			if got != tt.got || admitted != tt.got {
				t.Errorf("got %d jobs, admitted %d; want %d", got, admitted, tt.got)
			}
			if pl.ended != tt.ended || errors.Is(err, errPullRefused) != tt.refused {
				t.Errorf("ended %v with %v; want ended %v, refused %v", pl.ended, err, tt.ended, tt.refused)
			}
		})
	}
}

func TestJobMsgReadsItsMetadataFromTheAckSubject(t *testing.T) {
	m := newJobMsg(&nats.Msg{Subject: "job.x", Reply: "$JS.ACK.JOB.WORKER.2.17.9.1700000000000000000.4", Sub: &nats.Subscription{}})
	meta, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if meta.NumDelivered != 2 || meta.Sequence.Stream != 17 || meta.Sequence.Consumer != 9 || meta.NumPending != 4 || meta.Stream != "JOB" || meta.Consumer != "WORKER" || meta.Timestamp.UnixNano() != 1700000000000000000 {
		t.Errorf("got %+v", meta)
	}
	if _, err := newJobMsg(&nats.Msg{Subject: "job.x"}).Metadata(); !errors.Is(err, jetstream.ErrNotJSMessage) {
		t.Errorf("a message without an ack subject: got %v, want ErrNotJSMessage", err)
	}
}

// parseAckSubject reads what nats.go's Msg.Metadata reads, and refuses
// what it refuses, for both forms of the ack subject.
func FuzzParseAckSubjectAgreesWithNatsGo(f *testing.F) {
	for _, s := range []string{
		"$JS.ACK.JOB.WORKER.2.17.9.1700000000000000000.4",
		"$JS.ACK._.ACCHASH.JOB.WORKER.1.5.3.1700000000000000001.0.rand",
		"$JS.ACK.edge.ACCHASH.JOB.WORKER.3.18446744073709551615.3.1.7",
		"$JS.ACK.dom.h.JOB.WORKER.1.2.3.4.5.6.7",
		"$JS.ACK.JOB.WORKER.x.17.9.1.4",
		"$JS.ACK.JOB.WORKER.2.17.9.1",
		"$JS.ACK.a.b.JOB.WORKER.1.2.3.4",
		"$JS.ACK..........",
		"$JS.ACK",
		"$JS.NAK.JOB.WORKER.2.17.9.1.4",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, reply string) {
		want, werr := (&nats.Msg{Reply: reply, Sub: &nats.Subscription{}}).Metadata()
		var got jetstream.MsgMetadata
		gerr := parseAckSubject(reply, &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%q: nats.go says %v, parseAckSubject %v", reply, werr, gerr)
		}
		if werr != nil {
			return
		}
		if got.Sequence.Stream != want.Sequence.Stream || got.Sequence.Consumer != want.Sequence.Consumer ||
			got.NumDelivered != want.NumDelivered || got.NumPending != want.NumPending ||
			!got.Timestamp.Equal(want.Timestamp) || got.Stream != want.Stream || got.Consumer != want.Consumer || got.Domain != want.Domain {
			t.Fatalf("%q: got %+v, nats.go reads %+v", reply, got, *want)
		}
	})
}

func TestParseAckSubjectAllocatesNothing(t *testing.T) {
	var meta jetstream.MsgMetadata
	const reply = "$JS.ACK._.ACCHASH.JOB.WORKER.1.5.3.1700000000000000001.0.rand"
	if n := testing.AllocsPerRun(100, func() { _ = parseAckSubject(reply, &meta) }); n != 0 {
		t.Errorf("%v allocations per parse, want 0", n)
	}
}

// A job delivered after its pull ended is handed back at once, not left to
// wait out the ack wait.
func TestPullHandsBackJobsThatArriveAfterItsEnd(t *testing.T) {
	nc := servertest.Connect(t, servertest.Start(t))
	acks, err := nc.SubscribeSync("ack.late")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := nc.SubscribeSync("job.x")
	if err != nil {
		t.Fatal(err)
	}
	pl := &pull{admit: func(*nats.Msg) { t.Error("a job after the end was admitted") }, n: 1, done: make(chan struct{})}
	pl.end(nil)
	pl.receive(&nats.Msg{Subject: "job.x", Reply: "ack.late", Data: []byte("late"), Sub: sub})
	m, err := acks.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("no ack for the late job: %v", err)
	}
	if string(m.Data) != "-NAK" {
		t.Errorf("late job acked with %q, want -NAK", m.Data)
	}
}
