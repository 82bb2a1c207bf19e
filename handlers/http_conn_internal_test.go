package handlers

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobq/jobq/data"
)

// hookCountingConns starts a hook that closes connections idle for
// serverIdle, and counts the connections opened to it.
func hookCountingConns(t *testing.T, serverIdle time.Duration) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	srv.Config.IdleTimeout = serverIdle
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

// A job posted just as the hook closes its connection, idle, failed with
// EOF or "connection reset by peer" (net/http resends no POST it wrote),
// which made a failed attempt: about one in six jobs spaced at the hook's
// idle timeout did, with net/http's 90s. The default client keeps a
// connection idle for less than common hooks do, so it never reuses one
// that its hook is closing. Here, the hook's idle timeout is 200ms and the
// client's 50ms, as the real ones are 2s or more and 1s; most jobs come
// within a millisecond or two of 200ms apart, and every fifth 10ms after
// the one before, which reuses its connection.
func TestHTTPDefaultClientLetsIdleConnectionsGoBeforeTheHook(t *testing.T) {
	t.Parallel()
	srv, conns := hookCountingConns(t, 200*time.Millisecond)
	h := HTTP(srv.URL, newHTTPClient(50*time.Millisecond))
	const jobs = 40
	for i := range jobs {
		if err := h.Process(context.Background(), &data.Job{ID: "j", Subject: "job.x", Attempt: 1, Payload: []byte("x")}); err != nil {
			t.Errorf("job %d: %v", i, err)
		}
		if i%5 == 4 {
			time.Sleep(10 * time.Millisecond)
		} else {
			time.Sleep(200*time.Millisecond - time.Duration(i%20)*100*time.Microsecond)
		}
	}
	if n := conns.Load(); n >= jobs {
		t.Errorf("%d connections for %d jobs: none was reused", n, jobs)
	}
}

// The default client keeps a connection per worker: eight workers posting
// together, ten times, use about eight connections. With net/http's two
// idle connections per host, six of eight jobs opened one each time (about
// 62 connections).
func TestHTTPDefaultClientKeepsAConnectionPerWorker(t *testing.T) {
	t.Parallel()
	srv, conns := hookCountingConns(t, time.Minute)
	h := HTTP(srv.URL, nil)
	const workers, rounds = 8, 10
	for range rounds {
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				if err := h.Process(context.Background(), &data.Job{ID: "j", Subject: "job.x", Attempt: 1, Payload: []byte("x")}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		time.Sleep(20 * time.Millisecond) // the connections go back to the client's pool
	}
	if n := conns.Load(); n > 2*workers {
		t.Errorf("%d connections for %d rounds of %d jobs posted together, want at most %d", n, rounds, workers, 2*workers)
	}
}
