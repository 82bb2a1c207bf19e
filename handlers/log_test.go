package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// testLogger returns a logger that writes to t.Log.
func testLogger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t))
}

func TestLog(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		job         data.Job
		wantPayload string
	}{
		{
			name:        "short payload",
			job:         data.Job{ID: "id-1", Subject: "job.email", Seq: 7, Attempt: 2, Resumed: true, Payload: []byte(`{"to":"a@b"}`)},
			wantPayload: `{"to":"a@b"}`,
		},
		{
			name:        "empty payload",
			job:         data.Job{ID: "seq-3", Subject: "job.x", Seq: 3, Attempt: 1},
			wantPayload: "",
		},
		{
			name:        "long payload cut to 256 bytes",
			job:         data.Job{ID: "big", Subject: "job.big", Seq: 1, Attempt: 1, Payload: bytes.Repeat([]byte("a"), 1000)},
			wantPayload: strings.Repeat("a", 256),
		},
		{
			name:        "cut keeps whole runes",
			job:         data.Job{ID: "utf8", Subject: "job.u", Seq: 1, Attempt: 1, Payload: []byte(strings.Repeat("a", 255) + "é and more")},
			wantPayload: strings.Repeat("a", 255),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			h := handlers.Log(zerolog.New(&buf))
			if err := h.Process(context.Background(), &tt.job); err != nil {
				t.Fatalf("Process = %v, want nil", err)
			}
			var got struct {
				Level        string `json:"level"`
				Message      string `json:"message"`
				JobID        string `json:"job_id"`
				Subject      string `json:"subject"`
				Seq          uint64 `json:"seq"`
				Attempt      int    `json:"attempt"`
				Resumed      bool   `json:"resumed"`
				PayloadBytes int    `json:"payload_bytes"`
				Payload      string `json:"payload"`
			}
			if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
				t.Fatalf("log line %q is not JSON: %v", buf.String(), err)
			}
			if n := strings.Count(buf.String(), "\n"); n != 1 {
				t.Errorf("wrote %d lines, want 1", n)
			}
			if got.Level != "info" || got.Message != "job processed" {
				t.Errorf("level, message = %q, %q, want info, job processed", got.Level, got.Message)
			}
			j := tt.job
			if got.JobID != j.ID || got.Subject != j.Subject || got.Seq != j.Seq || got.Attempt != j.Attempt ||
				got.Resumed != j.Resumed || got.PayloadBytes != len(j.Payload) {
				t.Errorf("fields = %+v, want job %+v", got, j)
			}
			if got.Payload != tt.wantPayload {
				t.Errorf("payload = %q, want %q", got.Payload, tt.wantPayload)
			}
		})
	}
}
