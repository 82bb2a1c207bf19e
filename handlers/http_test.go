package handlers_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// received is what a test server saw of one request.
type received struct {
	method, path string
	header       http.Header
	body         string
}

// newServer starts a server that answers every request with status and body
// and sends what it received on the returned channel.
func newServer(t *testing.T, status int, body string) (*httptest.Server, <-chan received) {
	t.Helper()
	reqs := make(chan received, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		reqs <- received{method: r.Method, path: r.URL.Path, header: r.Header.Clone(), body: string(b)}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, reqs
}

func TestHTTPStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		status    int
		wantErr   bool
		permanent bool
	}{
		{"200 done", http.StatusOK, false, false},
		{"201 done", http.StatusCreated, false, false},
		{"204 done", http.StatusNoContent, false, false},
		{"302 not followed", http.StatusFound, true, false},
		{"400 permanent", http.StatusBadRequest, true, true},
		{"404 permanent", http.StatusNotFound, true, true},
		{"422 permanent", http.StatusUnprocessableEntity, true, true},
		{"408 retryable", http.StatusRequestTimeout, true, false},
		{"429 retryable", http.StatusTooManyRequests, true, false},
		{"500 retryable", http.StatusInternalServerError, true, false},
		{"503 retryable", http.StatusServiceUnavailable, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, _ := newServer(t, tt.status, "reason here")
			err := handlers.HTTP(srv.URL+"/hook", nil).Process(context.Background(), &data.Job{ID: "a", Subject: "job.x"})
			if (err != nil) != tt.wantErr {
				t.Fatalf("Process = %v, want error %v", err, tt.wantErr)
			}
			if got := handlers.IsPermanent(err); got != tt.permanent {
				t.Errorf("IsPermanent(%v) = %v, want %v", err, got, tt.permanent)
			}
			if err == nil {
				return
			}
			want := "post " + srv.URL + "/…: status " + strconv.Itoa(tt.status) + " " + http.StatusText(tt.status) + ": reason here"
			if got := err.Error(); got != want {
				t.Errorf("Error() = %q, want %q", got, want)
			}
		})
	}
}

func TestHTTPRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name            string
		job             data.Job
		wantContentType string
		wantID          string
		wantResumed     string
	}{
		{
			name:            "json",
			job:             data.Job{ID: "id-1", Subject: "job.email", Seq: 42, Attempt: 2, Payload: []byte(`{"to":"a@b"}`), Header: map[string][]string{"Content-Type": {"application/json"}}},
			wantContentType: "application/json",
			wantID:          "id-1",
			wantResumed:     "0",
		},
		{
			name:            "no content type",
			job:             data.Job{ID: "seq-7", Subject: "job.raw", Seq: 7, Attempt: 1, Resumed: true, Payload: []byte("\x00\x01binary")},
			wantContentType: "application/octet-stream",
			wantID:          "seq-7",
			wantResumed:     "1",
		},
		{
			name:            "lower-case header, empty payload",
			job:             data.Job{ID: "x", Subject: "job.y", Seq: 1, Attempt: 3, Header: map[string][]string{"content-type": {"text/plain"}}},
			wantContentType: "text/plain",
			wantID:          "x",
			wantResumed:     "0",
		},
		{
			name:            "ID not a header value",
			job:             data.Job{ID: "a\r\nb", Subject: "job.y", Seq: 1, Attempt: 1, Header: map[string][]string{"Content-Type": {"bad\nvalue"}}},
			wantContentType: "application/octet-stream",
			wantID:          "a%0D%0Ab",
			wantResumed:     "0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, reqs := newServer(t, http.StatusNoContent, "")
			if err := handlers.HTTP(srv.URL+"/hook", srv.Client()).Process(context.Background(), &tt.job); err != nil {
				t.Fatalf("Process = %v, want nil", err)
			}
			got := <-reqs
			if got.method != http.MethodPost || got.path != "/hook" {
				t.Errorf("request = %s %s, want POST /hook", got.method, got.path)
			}
			if got.body != string(tt.job.Payload) {
				t.Errorf("body = %q, want %q", got.body, tt.job.Payload)
			}
			for key, want := range map[string]string{
				"Content-Type":   tt.wantContentType,
				"X-Jobq-Job-Id":  tt.wantID,
				"X-Jobq-Subject": tt.job.Subject,
				"X-Jobq-Attempt": strconv.Itoa(tt.job.Attempt),
				"X-Jobq-Seq":     strconv.FormatUint(tt.job.Seq, 10),
				"X-Jobq-Resumed": tt.wantResumed,
			} {
				if v := got.header.Get(key); v != want {
					t.Errorf("header %s = %q, want %q", key, v, want)
				}
			}
		})
	}
}

func TestHTTPErrorBody(t *testing.T) {
	t.Parallel()
	srv, _ := newServer(t, http.StatusInternalServerError, "database\ndown "+strings.Repeat("y", 5000))
	err := handlers.HTTP(srv.URL, nil).Process(context.Background(), &data.Job{Subject: "job.x"})
	prefix := "post " + srv.URL + ": status 500 Internal Server Error: database down yyy"
	if err == nil || !strings.HasPrefix(err.Error(), prefix) {
		t.Fatalf("Process = %v, want it to start %q", err, prefix)
	}
	if got, limit := len(err.Error()), len(prefix)-len("database down yyy")+256; got > limit {
		t.Errorf("error has %d bytes, want at most %d", got, limit)
	}
}

func TestHTTPFollows307(t *testing.T) {
	t.Parallel()
	target, reqs := newServer(t, http.StatusOK, "")
	redirect := httptest.NewServer(http.RedirectHandler(target.URL+"/moved", http.StatusTemporaryRedirect))
	t.Cleanup(redirect.Close)
	if err := handlers.HTTP(redirect.URL, nil).Process(context.Background(), &data.Job{Subject: "job.x", Payload: []byte("p")}); err != nil {
		t.Fatalf("Process = %v, want nil", err)
	}
	if got := <-reqs; got.method != http.MethodPost || got.path != "/moved" || got.body != "p" {
		t.Errorf("target got %s %s %q, want POST /moved \"p\"", got.method, got.path, got.body)
	}
}

func TestHTTPTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := handlers.HTTP(srv.URL, nil).Process(ctx, &data.Job{Subject: "job.x"})
	if !errors.Is(err, context.DeadlineExceeded) || handlers.IsPermanent(err) {
		t.Errorf("Process = %v, want a retryable error wrapping %v", err, context.DeadlineExceeded)
	}
}

func TestHTTPTransportError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	err = handlers.HTTP("http://user:hunter2@"+addr+"/hook?token=s3cret#frag", nil).
		Process(context.Background(), &data.Job{Subject: "job.x"})
	if err == nil || handlers.IsPermanent(err) {
		t.Fatalf("Process = %v, want a retryable error", err)
	}
	msg := err.Error()
	if want := "post http://" + addr + "/…: "; !strings.HasPrefix(msg, want) {
		t.Errorf("Error() = %q, want it to start %q", msg, want)
	}
	for _, secret := range []string{"user", "hunter2", "token", "s3cret", "frag"} {
		if strings.Contains(msg, secret) {
			t.Errorf("Error() = %q, want no %q in it", msg, secret)
		}
	}
}

func TestHTTPInvalidURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "ftp://example.com/x", "http://", "/relative", "http://a b.com/"} {
		err := handlers.HTTP(u, nil).Process(context.Background(), &data.Job{Subject: "job.x"})
		if !handlers.IsPermanent(err) {
			t.Errorf("HTTP(%q).Process = %v, want a permanent error", u, err)
		}
	}
	if err := handlers.HTTP("http://127.0.0.1:1/", nil).Process(context.Background(), nil); !handlers.IsPermanent(err) {
		t.Errorf("Process(nil) = %v, want a permanent error", err)
	}
}

// A webhook URL often holds its secret in its path (Slack's
// /services/T…/B…/SECRET, Discord's /api/webhooks/ID/TOKEN). The errors
// named the path, and they are stored in the job's record and its dead
// letter, which the dashboard and jobq job show.
func TestHTTPErrorsLeaveTheURLPathOut(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such hook", http.StatusNotFound)
	}))
	defer srv.Close()
	err := handlers.HTTP(srv.URL+"/services/T0001/B0001/XoXoSeCrEt", nil).Process(context.Background(), &data.Job{Subject: "job.x"})
	if err == nil || strings.Contains(err.Error(), "XoXoSeCrEt") || !strings.Contains(err.Error(), srv.URL+"/…") {
		t.Errorf("Process = %v, want an error naming %s/… and not the path's secret", err, srv.URL)
	}
}
