package handlers_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// A hook that has answered (status and headers sent) but never finishes its
// body does not hold the worker: its status decides, without --job-timeout
// (the default) too.
func TestHTTPAnsweredHookDoesNotHoldTheWorker(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status string
		ok     bool
	}{{"200 OK", true}, {"500 Internal Server Error", false}} {
		t.Run(tt.status, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				conn, bw, err := w.(http.Hijacker).Hijack()
				if err != nil {
					return
				}
				defer conn.Close()
				// The body is announced as 1000 bytes; 5 come, the rest never.
				_, _ = bw.WriteString("HTTP/1.1 " + tt.status + "\r\nContent-Length: 1000\r\n\r\nshort")
				_ = bw.Flush()
				<-release
			}))
			t.Cleanup(srv.Close)
			t.Cleanup(func() { close(release) })

			done := make(chan error, 1)
			go func() {
				done <- handlers.HTTP(srv.URL, nil).Process(context.Background(), &data.Job{Subject: "job.x"})
			}()
			select {
			case err := <-done:
				if (err == nil) != tt.ok {
					t.Errorf("Process = %v, want success %v", err, tt.ok)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("Process still running 5s after the hook answered %s, want it to return", tt.status)
			}
		})
	}
}

// A hook's status line is cut in the error, as its body is: a hook cannot
// make a job's last error (ledger record, log line) arbitrarily long.
func TestHTTPErrorBoundsTheStatusLine(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, bw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = bw.WriteString("HTTP/1.1 503 " + strings.Repeat("r", 200000) + "\r\nContent-Length: 4\r\n\r\nbusy")
		_ = bw.Flush()
	}))
	t.Cleanup(srv.Close)
	err := handlers.HTTP(srv.URL, nil).Process(context.Background(), &data.Job{Subject: "job.x"})
	if err == nil || handlers.IsPermanent(err) {
		t.Fatalf("Process = %v, want a retryable error", err)
	}
	if limit := len("post "+srv.URL+": status 503 ") + 512; len(err.Error()) > limit {
		t.Errorf("error has %d bytes (%.60q...), want at most %d", len(err.Error()), err.Error(), limit)
	}
}
