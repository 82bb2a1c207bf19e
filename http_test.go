package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

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
	hs := startHTTP(listenLocal(t), obj, pool, srv.StoreErr, reg, srv.MonitorHandlers(), nil, dashboard.Auth{}, log)
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

// servedWithDashboard serves startHTTP on loopback with the dashboard and
// auth (none: the default), over a pool whose handler dead-letters every
// job.
func servedWithDashboard(t *testing.T, auth dashboard.Auth) (base string, obj *queue.Objects) {
	t.Helper()
	log := servertest.Logger(t)
	reg, metrics := newMetrics()
	rec := dashboard.NewRecorder()
	srv, obj := provisioned(t, false, queue.Config{Metrics: metrics, Observer: rec, FetchWait: 200 * time.Millisecond})
	reg.MustRegister(queue.NewStatusCollector(obj, 0))
	pool := queue.NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error {
		return handlers.Permanent(errors.New("card declined"))
	}), log)
	if err := pool.Start(context.Background()); err != nil {
		t.Fatalf("start pool: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool.Stop(ctx)
	})
	dash := dashboard.New(dashboard.Config{Objects: obj, Pool: pool, Recorder: rec, Auth: auth, Log: log})
	hs := startHTTP(listenLocal(t), obj, pool, srv.StoreErr, reg, srv.MonitorHandlers(), dash, auth, log)
	t.Cleanup(func() { hs.Shutdown(context.Background()) })
	return "http://" + hs.Addr, obj
}

// listenLocal listens on a free loopback port, as serve does for --http.
func listenLocal(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func doHTTP(t *testing.T, method, u, host string, body io.Reader, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for _, h := range header {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// The loopback default has no credentials, so what keeps other sites out is
// the browser's same-origin policy. nats-server's monitoring handlers answer
// Access-Control-Allow-Origin: *, which lets any web page the local user
// opens read /varz and /jsz (server config, store dir, streams, consumers).
func TestHTTPMonitorIsNotReadableCrossOrigin(t *testing.T) {
	t.Parallel()
	base, _ := servedWithDashboard(t, dashboard.Auth{})
	for _, path := range []string{"/varz", "/jsz?streams=1&consumers=1&config=1"} {
		resp, _ := doHTTP(t, http.MethodGet, base+path, "", nil, "Origin: https://evil.example", "Sec-Fetch-Site: cross-site")
		if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "" {
			t.Errorf("GET %s from https://evil.example: %d with Access-Control-Allow-Origin %q: another site's script reads it", path, resp.StatusCode, got)
		}
	}
}

// DNS rebinding: a page at http://rebind.evil.example:PORT/ whose name then
// resolves to 127.0.0.1 is same-origin with itself in the browser, so its
// requests carry Host, Origin and Sec-Fetch-Site that all agree. Nothing
// checks that Host names this server, so it reads the dashboard and
// re-drives every dead letter.
func TestHTTPRefusesOtherHostNames(t *testing.T) {
	t.Parallel()
	base, obj := servedWithDashboard(t, dashboard.Auth{})
	if _, err := queue.NewProducer(obj.JS, obj.Config).Enqueue(context.Background(), "job.pay.charge", []byte("{}"), queue.EnqueueOptions{ID: "secret-customer-42"}); err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		list, err := queue.ListDeadLetters(context.Background(), obj, 0)
		if err == nil && len(list) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dead letter after 20s: %v %v", list, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
	u, _ := url.Parse(base)
	evil := "rebind.evil.example:" + u.Port()
	resp, body := doHTTP(t, http.MethodGet, base+"/", evil, nil, "Sec-Fetch-Site: same-origin")
	if resp.StatusCode == http.StatusOK && strings.Contains(body, "secret-customer-42") {
		t.Errorf("GET / with Host %s: 200 with the dead letters' job IDs; want it refused (the host is not this server)", evil)
	}
	resp, _ = doHTTP(t, http.MethodPost, base+"/dlq/retry-all", evil, strings.NewReader(""),
		"Origin: http://"+evil, "Sec-Fetch-Site: same-origin", "Content-Type: application/x-www-form-urlencoded")
	if resp.StatusCode != http.StatusMisdirectedRequest {
		list, _ := queue.ListDeadLetters(context.Background(), obj, 0)
		t.Errorf("POST /dlq/retry-all from a rebound http://%s page: got %d to %q, %d dead letters left; want 421 and the dead letter kept",
			evil, resp.StatusCode, resp.Header.Get("Location"), len(list))
	}
}

// /readyz says 503 while the workers cannot fetch a single job: it reads
// WORKER too (and DLQ and the ledger), not only JOB, since the pool keeps
// Running while every pull is refused. A pool makes a deleted WORKER anew
// at its next pull, so here the check is given a consumer that is gone
// for good.
func TestHTTPReadyzWithoutWorkerConsumer(t *testing.T) {
	t.Parallel()
	base, obj := servedWithDashboard(t, dashboard.Auth{})
	ctx := context.Background()
	// (JOB, a work queue, takes no second consumer.)
	gone, err := obj.JS.CreateConsumer(ctx, queue.StreamDLQ, jetstream.ConsumerConfig{Durable: "GONE", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if err := obj.JS.DeleteConsumer(ctx, queue.StreamDLQ, "GONE"); err != nil {
		t.Fatal(err)
	}
	without := *obj
	without.Worker = gone
	log := servertest.Logger(t)
	pool := queue.NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), log)
	if err := pool.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool.Stop(ctx)
	})
	hs := startHTTP(listenLocal(t), &without, pool, nil, prometheus.NewRegistry(), nil, nil, dashboard.Auth{}, log)
	t.Cleanup(func() { hs.Shutdown(context.Background()) })
	resp, body := doHTTP(t, http.MethodGet, "http://"+hs.Addr+"/readyz", "", nil)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "consumer WORKER") {
		t.Errorf("GET /readyz with the workers' consumer gone: got %d %s, want 503 naming it", resp.StatusCode, strings.TrimSpace(body))
	}

	// WORKER itself, deleted, is made anew: ready again.
	if err := obj.JS.DeleteConsumer(ctx, queue.StreamJob, queue.ConsumerWorker); err != nil {
		t.Fatalf("delete %s: %v", queue.ConsumerWorker, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, body := doHTTP(t, http.MethodGet, base+"/readyz", "", nil)
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /readyz 10s after %s was deleted: got %d %s, want 200 once the pool made it anew", queue.ConsumerWorker, resp.StatusCode, strings.TrimSpace(body))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The loopback listener answers under localhost and loopback IPs, and
// answers probes under any name.
func TestHTTPServesLoopbackNames(t *testing.T) {
	t.Parallel()
	base, _ := servedWithDashboard(t, dashboard.Auth{})
	u, _ := url.Parse(base)
	for _, host := range []string{"localhost:" + u.Port(), "127.0.0.1:" + u.Port(), "[::1]:" + u.Port()} {
		if resp, _ := doHTTP(t, http.MethodGet, base+"/", host, nil); resp.StatusCode != http.StatusOK {
			t.Errorf("GET / with Host %s: got %d, want 200", host, resp.StatusCode)
		}
	}
	if resp, _ := doHTTP(t, http.MethodGet, base+"/healthz", "jobq.internal:8222", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz with Host jobq.internal: got %d, want 200 (probes name the host as they like)", resp.StatusCode)
	}
}

// Host names are case-insensitive, and "localhost." is the same
// name; curl http://LOCALHOST:PORT/ sends the name as typed.
func TestHTTPLoopbackNameSpellings(t *testing.T) {
	t.Parallel()
	base, _ := servedWithDashboard(t, dashboard.Auth{})
	u, _ := url.Parse(base)
	for _, host := range []string{"LOCALHOST:" + u.Port(), "Localhost:" + u.Port(), "localhost.:" + u.Port()} {
		if resp, _ := doHTTP(t, http.MethodGet, base+"/", host, nil); resp.StatusCode != http.StatusOK {
			t.Errorf("GET / with Host %s: got %d, want 200", host, resp.StatusCode)
		}
	}
}

// A reverse proxy in front of a loopback --http may keep the client's Host
// (Caddy's default, nginx's proxy_set_header Host $host) when credentials
// are configured: a DNS rebinding gains nothing then.
func TestHTTPReverseProxyWithAuth(t *testing.T) {
	t.Parallel()
	base, _ := servedWithDashboard(t, dashboard.Auth{Token: "s3cret"})
	for _, path := range []string{"/", "/metrics", "/varz"} {
		resp, _ := doHTTP(t, http.MethodGet, base+path, "jobq.example.com", nil, "Authorization: Bearer s3cret", "X-Forwarded-For: 203.0.113.9")
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s via a reverse proxy (Host jobq.example.com) with the token: got %d, want 200", path, resp.StatusCode)
		}
	}
}

// startHTTP serves ln as jobq serve does once it is up.
func startHTTP(ln net.Listener, obj *queue.Objects, pool *queue.Pool, storeErr func() error, reg prometheus.Gatherer, monitor map[string]http.HandlerFunc, dash *dashboard.Dashboard, auth dashboard.Auth, log zerolog.Logger) *http.Server {
	hs, set := serveHTTP(ln, log)
	set(httpHandler(ln, obj, pool, storeErr, reg, monitor, dash, auth, log))
	return hs
}

// An --http port that is not loopback is served without TLS: serve warns
// that its credentials and pages go in clear; on loopback it does not.
func TestHTTPOffLoopbackWarnsItHasNoTLS(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		addr string
		warn bool
	}{{"127.0.0.1:0", false}, {"0.0.0.0:0", true}} {
		ln, err := net.Listen("tcp", tt.addr)
		if err != nil {
			t.Fatal(err)
		}
		var logs servertest.LogBuffer
		hs, set := serveHTTP(ln, zerolog.New(&logs))
		set(http.NotFoundHandler())
		hs.Shutdown(context.Background())
		if got := strings.Contains(logs.String(), "the HTTP port has no TLS"); got != tt.warn {
			t.Errorf("--http %s: warned of no TLS %v, want %v; log:\n%s", tt.addr, got, tt.warn, logs.String())
		}
	}
}

// While jobq starts, its --http port answers probes at once: /healthz 200,
// /readyz and the rest 503 "starting"; then the full handler takes over.
func TestHTTPAnswersWhileStarting(t *testing.T) {
	t.Parallel()
	hs, set := serveHTTP(listenLocal(t), servertest.Logger(t))
	t.Cleanup(func() { hs.Shutdown(context.Background()) })
	get := func(path string) (int, string) {
		t.Helper()
		client := &http.Client{Timeout: 5 * time.Second}
		resp, err := client.Get("http://" + hs.Addr + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, tt := range []struct {
		path string
		code int
		want string
	}{{"/healthz", 200, `"ok"`}, {"/readyz", 503, `"starting"`}, {"/", 503, `"starting"`}} {
		if code, body := get(tt.path); code != tt.code || !strings.Contains(body, tt.want) {
			t.Errorf("GET %s while starting: %d %q; want %d with %s", tt.path, code, body, tt.code, tt.want)
		}
	}
	set(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "up") }))
	if code, body := get("/"); code != 200 || body != "up" {
		t.Errorf("GET / once up: %d %q; want the full handler's answer", code, body)
	}
}

// /readyz is not ready while the workers cannot work: without the ledger
// bucket no job is claimed or recorded, without DLQ none is dead-lettered.
// TestReadyzNeedsEveryObject: /readyz names the object that is gone, with
// workers or without (external workers need them too), and says to restart
// jobq serve when only that creates it again.
func TestReadyzNeedsEveryObject(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, want string
		workers    bool
		remove     func(context.Context, *queue.Objects) error
	}{
		{"ledger", "ledger bucket processed is gone: restart jobq serve", true, func(ctx context.Context, obj *queue.Objects) error {
			return obj.JS.DeleteKeyValue(ctx, queue.BucketProcessed)
		}},
		{"dlq", "stream DLQ: ", true, func(ctx context.Context, obj *queue.Objects) error {
			return obj.JS.DeleteStream(ctx, queue.StreamDLQ)
		}},
		{"job", "stream JOB is gone: restart jobq serve", true, func(ctx context.Context, obj *queue.Objects) error {
			return obj.JS.DeleteStream(ctx, queue.StreamJob)
		}},
		{"broker ledger", "ledger bucket processed is gone: restart jobq serve", false, func(ctx context.Context, obj *queue.Objects) error {
			return obj.JS.DeleteKeyValue(ctx, queue.BucketProcessed)
		}},
		{"broker dlq", "stream DLQ is gone: restart jobq serve", false, func(ctx context.Context, obj *queue.Objects) error {
			return obj.JS.DeleteStream(ctx, queue.StreamDLQ)
		}},
		{"broker worker", "consumer WORKER is gone: restart jobq serve", false, func(ctx context.Context, obj *queue.Objects) error {
			return obj.JS.DeleteConsumer(ctx, queue.StreamJob, queue.ConsumerWorker)
		}},
		{"broker job", "stream JOB is gone: restart jobq serve", false, func(ctx context.Context, obj *queue.Objects) error {
			return obj.JS.DeleteStream(ctx, queue.StreamJob)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			log := servertest.Logger(t)
			reg, _ := newMetrics()
			srv, obj := provisioned(t, false, queue.Config{FetchWait: 200 * time.Millisecond})
			var pool *queue.Pool
			if tt.workers {
				pool = queue.NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), log)
				if err := pool.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					pool.Stop(ctx)
				})
			}
			hs := startHTTP(listenLocal(t), obj, pool, srv.StoreErr, reg, nil, nil, dashboard.Auth{}, log)
			t.Cleanup(func() { hs.Shutdown(context.Background()) })
			readyz := func() (int, string) {
				resp, err := http.Get("http://" + hs.Addr + "/readyz")
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, strings.TrimSpace(string(body))
			}
			if code, body := readyz(); code != http.StatusOK {
				t.Fatalf("/readyz before: %d %s; want 200", code, body)
			}
			if err := tt.remove(context.Background(), obj); err != nil {
				t.Fatal(err)
			}
			if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, tt.want) {
				t.Errorf("/readyz without %s: %d %s; want 503 with %q", tt.name, code, body, tt.want)
			}
		})
	}
}

// A pool makes a deleted DLQ anew, but only when a job runs out of
// deliveries: /readyz, which reads DLQ, said 503 "stream DLQ: … not found"
// for as long as no job failed for good, with no word of a restart, and an
// orchestrator kept a working jobq out of service. The pool makes DLQ anew
// within an ack wait, as it does WORKER.
func TestReadyzAfterDLQDeletedWithWorkers(t *testing.T) {
	t.Parallel()
	log := servertest.Logger(t)
	srv, obj := provisioned(t, false, queue.Config{AckWait: time.Second, FetchWait: 200 * time.Millisecond})
	pool := queue.NewPool(obj, handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }), log)
	if err := pool.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool.Stop(ctx)
	})
	hs := startHTTP(listenLocal(t), obj, pool, srv.StoreErr, prometheus.NewRegistry(), nil, nil, dashboard.Auth{}, log)
	t.Cleanup(func() { hs.Shutdown(context.Background()) })
	if err := obj.JS.DeleteStream(context.Background(), queue.StreamDLQ); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, body := doHTTP(t, http.MethodGet, "http://"+hs.Addr+"/readyz", "", nil)
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /readyz 10s after DLQ was deleted (ack wait 1s), no job failing: got %d %s, want 200 once the pool made DLQ anew", resp.StatusCode, strings.TrimSpace(body))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := obj.JS.Stream(context.Background(), queue.StreamDLQ); err != nil {
		t.Errorf("DLQ after /readyz said ready: %v", err)
	}
}
