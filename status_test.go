package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/queue/dashboard"
)

// TestStatusWatch runs jobq status --watch for two tables against an
// embedded server, with stdout not a terminal: two tables, each under its
// time, no escape codes, sizes and durations for people.
func TestStatusWatch(t *testing.T) {
	t.Parallel()
	srv, obj := provisioned(t, true, queue.Config{})
	if _, err := queue.NewProducer(obj.JS, obj.Config).Enqueue(context.Background(), "job.watch", []byte("{}"), queue.EnqueueOptions{ID: "w-1"}); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	// A dead letter, so that the count would be red on a terminal.
	if _, err := obj.JS.Publish(context.Background(), queue.SubjectDLQPrefix+"job.watch", []byte("{}")); err != nil {
		t.Fatalf("publish a dead letter: %v", err)
	}

	const interval = 200 * time.Millisecond
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code := run([]string{"jobq", "status", "--watch", "--interval", interval.String(), "--count", "2", "--server", srv.ClientURL()}, strings.NewReader(""), &stdout, &stderr)
	took := time.Since(start)
	out := stdout.String()
	if code != 0 || stderr.Len() > 0 {
		t.Fatalf("status --watch: got exit status %d, stderr %q; want 0 and nothing\nstdout:\n%s", code, stderr.String(), out)
	}
	if n := strings.Count(out, "stream JOB"); n != 2 {
		t.Errorf("got %d tables, want 2:\n%s", n, out)
	}
	if took < interval {
		t.Errorf("two tables took %s, want at least the interval %s between them", took, interval)
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("output to a non-terminal has escape codes:\n%q", out)
	}
	tables := strings.Split(out, "\n\n")
	if len(tables) != 2 {
		t.Fatalf("got %d blocks separated by a blank line, want 2:\n%s", len(tables), out)
	}
	for i, table := range tables {
		first, _, _ := strings.Cut(table, "\n")
		if _, err := time.ParseInLocation(time.DateTime, first, time.Local); err != nil {
			t.Errorf("table %d: got first line %q, want its time (%v)", i+1, first, err)
		}
		for _, want := range []string{
			"stream JOB", "1 jobs", " B ", "seq 1..1", "dedupe window 10m\n", "consumer WORKER", "1 pending",
			"max deliver 3, ack wait 1m\n", "dead letters DLQ", "ledger processed", "0 records", "ttl 7d",
		} {
			if !strings.Contains(table, want) {
				t.Errorf("table %d has no %q:\n%s", i+1, want, table)
			}
		}
	}
}

func TestStatusWatchBadInterval(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"jobq", "status", "--watch", "--interval", "0s", "--server", "nats://127.0.0.1:1"}, strings.NewReader(""), &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "--interval") {
		t.Errorf("status --watch --interval 0s: got exit status %d, stderr %q; want 2 and a word on --interval", code, stderr.String())
	}
}

func TestStatusTable(t *testing.T) {
	t.Parallel()
	st := queue.Status{
		Stream:   queue.StreamStatus{Name: "JOB", Messages: 12, Bytes: 1_234_567, FirstSeq: 3, LastSeq: 14, DedupeWindow: "10m0s"},
		Consumer: queue.ConsumerStatus{Name: "WORKER", Pending: 10, AckPending: 2, MaxDeliver: 3, AckWait: "1m30s"},
		DLQ:      queue.StreamStatus{Name: "DLQ", Messages: 3, Bytes: 999},
		Ledger:   queue.LedgerStatus{Bucket: "processed", Records: 7, Bytes: 2722, TTL: "36h0m0s"},
	}
	plain := statusTable(st, false)
	for _, want := range []string{"12 jobs", "1.2 MB", "seq 3..14", "dedupe window 10m\n", "ack wait 1m30s\n", "3 jobs", "999 B", "2.7 kB", "ttl 1d12h"} {
		if !strings.Contains(plain, want) {
			t.Errorf("table has no %q:\n%s", want, plain)
		}
	}
	coloured := statusTable(st, true)
	if !strings.Contains(coloured, "\x1b[1;31m3 jobs\x1b[0m") {
		t.Errorf("coloured table has no red dead-letter count:\n%q", coloured)
	}
	if got := strings.NewReplacer("\x1b[1;31m", "", "\x1b[0m", "").Replace(coloured); got != plain {
		t.Errorf("colour changed the alignment:\ngot:\n%s\nwant:\n%s", got, plain)
	}
	st.DLQ.Messages = 0
	if strings.Contains(statusTable(st, true), "\x1b") {
		t.Errorf("no dead letters, yet the table is coloured")
	}

	for _, tt := range []struct{ in, want string }{
		{"10m0s", "10m"}, {"1m0s", "1m"}, {"1m30s", "1m30s"}, {"1h0m0s", "1h"}, {"1h30m0s", "1h30m"},
		{"24h0m0s", "1d"}, {"168h0m0s", "7d"}, {"36h0m0s", "1d12h"}, {"500ms", "500ms"}, {"0s", "0s"}, {"bogus", "bogus"},
	} {
		if got := dashboard.HumanSpan(tt.in); got != tt.want {
			t.Errorf("humanSpan(%q): got %q, want %q", tt.in, got, tt.want)
		}
	}
	for _, tt := range []struct {
		in   uint64
		want string
	}{{0, "0 B"}, {999, "999 B"}, {1000, "1.0 kB"}, {2722, "2.7 kB"}, {999_949, "999.9 kB"}, {999_999, "1.0 MB"}, {1_234_567, "1.2 MB"}, {5e12, "5.0 TB"}} {
		if got := dashboard.HumanSize(tt.in); got != tt.want {
			t.Errorf("humanBytes(%d): got %q, want %q", tt.in, got, tt.want)
		}
	}
}
