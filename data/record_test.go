package data

import (
	"encoding/json"
	"testing"
	"time"
)

// The hand-written encoder must write what encoding/json writes.
func TestRecordEncodeMatchesEncodingJSON(t *testing.T) {
	now := time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)
	tests := []struct {
		name string
		rec  Record
	}{
		{name: "empty"},
		{name: "claim", rec: Record{ID: "payroll-1", State: StateRunning, Subject: "job.payroll", Seq: 7, Attempts: 1, Worker: "host-1/0", LeaseUntil: now, FirstAt: now, StartedAt: now}},
		{name: "done", rec: Record{ID: "a b/c", State: StateDone, Attempts: 2, Resumed: true, FinishedAt: now.Add(time.Second), Took: 1500 * time.Microsecond}},
		{name: "done on a lease", rec: Record{ID: "l", State: StateDone, Attempts: 1, Worker: "host-1/0", Lease: "NUIDOWNER123", FinishedAt: now}},
		{name: "escapes", rec: Record{ID: "ü \"q\" <x> & \\ \t", State: StateFailed, LastError: "exit status 65: line\nbreak"}},
		{name: "local time", rec: Record{ID: "t", State: StateDone, FinishedAt: now.In(time.FixedZone("X", 3600))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := json.Marshal(tt.rec)
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.rec.encode(); string(got) != string(want) {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
}

func BenchmarkRecordEncode(b *testing.B) {
	now := time.Now()
	r := Record{ID: "payroll-1", State: StateRunning, Subject: "job.payroll", Seq: 7, Attempts: 1, Worker: "host-1/0", LeaseUntil: now, FirstAt: now, StartedAt: now}
	b.ReportAllocs()
	for b.Loop() {
		r.encode()
	}
}
