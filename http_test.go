package main

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/queue/dashboard"
	"github.com/jobq/jobq/server/servertest"
)

// TestHTTPEndpoints serves startHTTP over a provisioned queue on an
// embedded server, runs a job through a pool, and checks every endpoint:
// /metrics with jobq's, Go's and the process's metrics, /healthz and
// /readyz, and nats-server's /varz and /jsz.
func TestHTTPEndpoints(t *testing.T) {
	t.Parallel()
	log := servertest.Logger(t)
	reg, metrics := newMetrics()
	srv, obj := provisioned(t, false, queue.Config{Metrics: metrics, FetchWait: 200 * time.Millisecond})
	reg.MustRegister(queue.NewStatusCollector(obj, 0))
	pool := queue.NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), log)
	if err := pool.Start(context.Background()); err != nil {
		t.Fatalf("start pool: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool.Stop(ctx)
	})
	hs, err := startHTTP("127.0.0.1:0", obj, pool, srv.StoreErr, reg, srv.MonitorHandlers(), nil, dashboard.Auth{}, log)
	if err != nil {
		t.Fatalf("start http: %v", err)
	}
	t.Cleanup(func() { hs.Shutdown(context.Background()) })
	base := "http://" + hs.Addr

	get := func(t *testing.T, method, path string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s %s: read body: %v", method, path, err)
		}
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
	}

	if _, err := queue.NewProducer(obj.JS, obj.Config).Enqueue(context.Background(), "job.http.check", []byte("x"), queue.EnqueueOptions{ID: "http-1"}); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, _, body := get(t, http.MethodGet, "/metrics")
		if strings.Contains(body, `jobq_jobs_completed_total{subject="job.http"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s /metrics has no completed job:\n%s", body)
		}
		time.Sleep(25 * time.Millisecond)
	}

	t.Run("metrics", func(t *testing.T) {
		code, ctype, body := get(t, http.MethodGet, "/metrics")
		if code != http.StatusOK || !strings.HasPrefix(ctype, "text/plain") {
			t.Fatalf("got %d %s, want 200 text/plain", code, ctype)
		}
		for _, want := range []string{
			`jobq_jobs_enqueued_total{subject="job.http"} 1`,
			`jobq_jobs_started_total{subject="job.http"} 1`,
			`jobq_jobs_completed_total{subject="job.http"} 1`,
			`jobq_jobs_retried_total{subject="job.http"} 0`,
			`jobq_jobs_dead_lettered_total{subject="job.http"} 0`,
			`jobq_jobs_skipped_total{subject="job.http"} 0`,
			`jobq_handler_duration_seconds_count{subject="job.http"} 1`,
			`jobq_enqueue_to_start_seconds_count{subject="job.http"} 1`,
			"\njobq_stream_jobs ", "\njobq_consumer_pending ", "\njobq_consumer_ack_pending ",
			"\njobq_dlq_jobs 0", "\njobq_ledger_records 1",
			"\ngo_goroutines ", "\nprocess_resident_memory_bytes ",
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics has no %q", strings.TrimSpace(want))
			}
		}
	})
	for _, tt := range []struct{ path, want string }{
		{"/healthz", "ok"},
		{"/readyz", "ready"},
	} {
		t.Run(tt.path, func(t *testing.T) {
			code, ctype, body := get(t, http.MethodGet, tt.path)
			var got struct{ Status string }
			if err := json.Unmarshal([]byte(body), &got); err != nil || code != http.StatusOK || ctype != "application/json" || got.Status != tt.want {
				t.Errorf("got %d %s %q (%v), want 200 application/json with status %q", code, ctype, body, err, tt.want)
			}
		})
	}
	for _, tt := range []struct{ path, field string }{
		{"/varz", "server_name"},
		{"/jsz", "streams"},
		{"/jsz?streams=1", "account_details"},
	} {
		t.Run(tt.path, func(t *testing.T) {
			code, ctype, body := get(t, http.MethodGet, tt.path)
			var got map[string]any
			if err := json.Unmarshal([]byte(body), &got); err != nil || code != http.StatusOK || ctype != "application/json" {
				t.Fatalf("got %d %s (%v), want 200 and a JSON object:\n%.300s", code, ctype, err, body)
			}
			if _, ok := got[tt.field]; !ok {
				t.Errorf("got fields %v, want %s", slices.Sorted(maps.Keys(got)), tt.field)
			}
		})
	}
	t.Run("wrong method", func(t *testing.T) {
		if code, _, _ := get(t, http.MethodPost, "/metrics"); code != http.StatusMethodNotAllowed {
			t.Errorf("POST /metrics: got %d, want 405", code)
		}
	})
}
