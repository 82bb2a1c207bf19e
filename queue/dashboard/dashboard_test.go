package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/queue/dashboard"
	"github.com/jobq/jobq/server/servertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats-server keeps process-wide goroutines once JetStream started.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*jsAccount).updateUsage"),
		goleak.IgnoreTopFunction("time.Sleep"),
	)
}

const waitLimit = 20 * time.Second

// testBundle is an embedded server with jobq provisioned, a pool whose
// handler fails jobs on job.fail.* (permanently, so they are dead-lettered
// at once) while failing is set, and the dashboard on an httptest.Server.
type testBundle struct {
	obj     *queue.Objects
	prod    *queue.Producer
	rec     *dashboard.Recorder
	url     string
	failing atomic.Bool
	// job.slow.> jobs signal started and run until release closes.
	started chan string
	release chan struct{}
}

func setup(t *testing.T, auth dashboard.Auth) *testBundle {
	t.Helper()
	srv := servertest.Start(t)
	js, err := jetstream.New(servertest.Connect(t, srv))
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	log := servertest.Logger(t)
	b := &testBundle{rec: dashboard.NewRecorder(), started: make(chan string, 8), release: make(chan struct{})}
	b.failing.Store(true)
	cfg := queue.Config{RetryBackoff: []time.Duration{10 * time.Millisecond}, FetchWait: 200 * time.Millisecond, Observer: b.rec}
	if b.obj, err = queue.Provision(context.Background(), js, cfg, log); err != nil {
		t.Fatalf("provision: %v", err)
	}
	b.prod = queue.NewProducer(js, b.obj.Config)
	r := handlers.NewRouter()
	r.HandleFunc("job.ok.>", func(context.Context, *data.Job) error { return nil })
	r.HandleFunc("job.fail.>", func(context.Context, *data.Job) error {
		if b.failing.Load() {
			return handlers.Permanent(errors.New("card declined"))
		}
		return nil
	})
	r.HandleFunc("job.slow.>", func(ctx context.Context, job *data.Job) error {
		b.started <- job.ID
		select {
		case <-b.release:
		case <-ctx.Done():
		}
		return nil
	})
	pool := queue.NewPool(b.obj, r, log)
	if err := pool.Start(context.Background()); err != nil {
		t.Fatalf("start pool: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := pool.Stop(ctx); err != nil {
			t.Errorf("stop pool: %v", err)
		}
	})
	t.Cleanup(func() { close(b.release) }) // runs before the pool's Stop
	d := dashboard.New(dashboard.Config{Objects: b.obj, Pool: pool, Recorder: b.rec, Auth: auth, Log: log})
	hs := httptest.NewServer(d)
	t.Cleanup(hs.Close)
	b.url = hs.URL
	return b
}

func (b *testBundle) enqueue(t *testing.T, subject, id string) {
	t.Helper()
	if _, err := b.prod.Enqueue(context.Background(), subject, []byte(`{}`), queue.EnqueueOptions{ID: id}); err != nil {
		t.Fatalf("enqueue %s: %v", id, err)
	}
}

// response is what a request got back.
type response struct {
	code     int
	header   http.Header
	body     string
	location string
}

// do sends a request without following redirects; header holds extra
// headers as "Key: value".
func (b *testBundle) do(t *testing.T, method, path string, form url.Values, header ...string) response {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, h := range header {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{resp.StatusCode, resp.Header, string(got), resp.Header.Get("Location")}
}

func (b *testBundle) page(t *testing.T, path string) string {
	t.Helper()
	r := b.do(t, http.MethodGet, path, nil)
	if r.code != http.StatusOK {
		t.Fatalf("GET %s: got %d, want 200:\n%s", path, r.code, r.body)
	}
	return r.body
}

// waitPage polls the page until it holds every one of want.
func (b *testBundle) waitPage(t *testing.T, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		body := b.page(t, "/")
		missing := ""
		for _, w := range want {
			if !strings.Contains(body, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the page has no %q:\n%s", waitLimit, missing, body)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// deadLetters returns the DLQ sequences of the dead letters.
func (b *testBundle) deadLetters(t *testing.T) []queue.DeadLetter {
	t.Helper()
	list, err := queue.ListDeadLetters(context.Background(), b.obj, 0)
	if err != nil {
		t.Fatalf("list dead letters: %v", err)
	}
	return list
}

// waitDone waits until job id's ledger record says done.
func (b *testBundle) waitDone(t *testing.T, id string) data.Record {
	t.Helper()
	ledger := data.NewLedger(b.obj.Ledger, 0, nil)
	deadline := time.Now().Add(waitLimit)
	for {
		rec, err := ledger.Get(context.Background(), id)
		if err == nil && rec.State == data.StateDone {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s job %s: got record %+v (%v), want state done", waitLimit, id, rec, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func count(id string, n int) string { return `id="` + id + `">` + strconv.Itoa(n) + "<" }

func mustContain(t *testing.T, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("page has no %q", w)
		}
	}
	if t.Failed() {
		t.Logf("page:\n%s", body)
	}
}

func TestPageShowsCounts(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Auth{})
	r := b.do(t, http.MethodGet, "/", nil)
	if r.code != http.StatusOK {
		t.Fatalf("GET /: got %d, want 200", r.code)
	}
	for k, want := range map[string]string{
		"Content-Type":            "text/html; charset=utf-8",
		"X-Frame-Options":         "DENY",
		"X-Content-Type-Options":  "nosniff",
		"Cache-Control":           "no-store",
		"Content-Security-Policy": "frame-ancestors 'none'",
	} {
		if got := r.header.Get(k); !strings.Contains(got, want) {
			t.Errorf("header %s: got %q, want %q in it", k, got, want)
		}
	}
	mustContain(t, r.body,
		`<meta name="viewport" content="width=device-width, initial-scale=1">`,
		`<meta http-equiv="refresh" content="5; url=/">`,
		count("count-completed", 0), count("count-failed", 0), count("dlq-jobs", 0), count("stream-jobs", 0),
		count("in-flight", 0), "No dead letters.", "No job has finished since jobq started.",
		"<svg viewBox=", "Throughput, last 15 minutes", `<label for="id">Job ID</label>`,
	)
	if strings.Contains(r.body, "http://") || strings.Contains(r.body, "https://") {
		t.Errorf("page refers to an external resource:\n%s", r.body)
	}

	for i := range 3 {
		b.enqueue(t, "job.ok.report", fmt.Sprintf("ok-%d", i))
	}
	b.enqueue(t, "job.fail.charge", "charge-<7>")
	// Completions count once recorded; the acks that empty JOB follow.
	body := b.waitPage(t, count("count-completed", 3), count("count-failed", 1), count("dlq-jobs", 1), count("stream-jobs", 0))
	mustContain(t, body,
		count("count-retried", 0),
		"ok-0", "ok-2", "job.ok.report", `<span class="state done">done</span>`,
		"charge-&lt;7&gt;", "job.fail.charge", `<span class="state failed">failed</span>`, "card declined",
		`aria-label="Retry charge-&lt;7&gt;"`, `id="retry-all">Retry all 1</button>`,
		"completed <strong>3</strong>", "failed attempts <strong>1</strong>", `<rect class="ok"`, `<rect class="bad"`,
	)
	if strings.Contains(body, "No dead letters.") {
		t.Errorf("page says no dead letters with one in DLQ")
	}
}

func TestRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Auth{})
	b.enqueue(t, "job.fail.charge", "charge-1")
	b.enqueue(t, "job.fail.charge", "charge-2")
	b.waitPage(t, count("dlq-jobs", 2))
	dead := b.deadLetters(t)
	b.failing.Store(false) // fixed: the retried jobs succeed

	t.Run("one", func(t *testing.T) {
		r := b.do(t, http.MethodPost, "/dlq/retry", url.Values{"seq": {strconv.FormatUint(dead[0].Seq, 10)}}, "Origin: "+b.url, "Sec-Fetch-Site: same-origin")
		if r.code != http.StatusSeeOther || r.location != "/?retried=1" {
			t.Fatalf("POST /dlq/retry: got %d to %q, want 303 to /?retried=1:\n%s", r.code, r.location, r.body)
		}
		b.waitDone(t, dead[0].ID)
		if got := b.deadLetters(t); len(got) != 1 || got[0].ID != dead[1].ID {
			t.Errorf("dead letters after retrying %s: got %+v, want only %s", dead[0].ID, got, dead[1].ID)
		}
		mustContain(t, b.page(t, r.location), "Retried 1 dead letter: back in JOB.", count("dlq-jobs", 1))
	})
	t.Run("again", func(t *testing.T) {
		r := b.do(t, http.MethodPost, "/dlq/retry", url.Values{"seq": {strconv.FormatUint(dead[0].Seq, 10)}})
		if r.code != http.StatusSeeOther || r.location != "/?gone=1" {
			t.Fatalf("POST /dlq/retry of a retried one: got %d to %q, want 303 to /?gone=1", r.code, r.location)
		}
		mustContain(t, b.page(t, r.location), "That dead letter is gone")
	})
	t.Run("bad seq", func(t *testing.T) {
		if r := b.do(t, http.MethodPost, "/dlq/retry", url.Values{"seq": {"x"}}); r.code != http.StatusBadRequest {
			t.Errorf("POST /dlq/retry seq=x: got %d, want 400", r.code)
		}
	})
	t.Run("all", func(t *testing.T) {
		b.failing.Store(true)
		b.enqueue(t, "job.fail.charge", "charge-3")
		b.waitPage(t, count("dlq-jobs", 2))
		b.failing.Store(false)
		r := b.do(t, http.MethodPost, "/dlq/retry-all", url.Values{}, "Referer: "+b.url+"/")
		if r.code != http.StatusSeeOther || r.location != "/?retried=2" {
			t.Fatalf("POST /dlq/retry-all: got %d to %q, want 303 to /?retried=2:\n%s", r.code, r.location, r.body)
		}
		b.waitDone(t, "charge-2")
		b.waitDone(t, "charge-3")
		if got := b.deadLetters(t); len(got) != 0 {
			t.Errorf("dead letters after retry all: got %+v, want none", got)
		}
		mustContain(t, b.waitPage(t, count("count-completed", 3)), "No dead letters.", count("count-failed", 3))
	})
}

// Sidekiq's and asynq's dashboards delete a dead job; jobq's offered
// only Retry, and a dead letter not to be run again needed jobq dlq rm.
func TestRemove(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Auth{})
	b.enqueue(t, "job.fail.charge", "charge-1")
	b.enqueue(t, "job.fail.charge", "charge-2")
	body := b.waitPage(t, count("dlq-jobs", 2))
	dead := b.deadLetters(t)
	stored := func(d queue.DeadLetter) string { return strconv.FormatInt(d.Stored().UnixNano(), 10) }
	mustContain(t, body, `aria-label="Remove charge-1"`, `name="stored" value="`+stored(dead[0])+`"`)

	t.Run("one", func(t *testing.T) {
		r := b.do(t, http.MethodPost, "/dlq/rm", url.Values{"seq": {strconv.FormatUint(dead[0].Seq, 10)}, "stored": {stored(dead[0])}}, "Origin: "+b.url, "Sec-Fetch-Site: same-origin")
		if r.code != http.StatusSeeOther || r.location != "/?removed=1" {
			t.Fatalf("POST /dlq/rm: got %d to %q, want 303 to /?removed=1:\n%s", r.code, r.location, r.body)
		}
		if got := b.deadLetters(t); len(got) != 1 || got[0].ID != dead[1].ID {
			t.Errorf("dead letters after removing %s: got %+v, want only %s", dead[0].ID, got, dead[1].ID)
		}
		mustContain(t, b.page(t, r.location), "Removed 1 dead letter: its job will not run.", count("dlq-jobs", 1))
	})
	t.Run("again", func(t *testing.T) {
		r := b.do(t, http.MethodPost, "/dlq/rm", url.Values{"seq": {strconv.FormatUint(dead[0].Seq, 10)}, "stored": {stored(dead[0])}})
		if r.code != http.StatusSeeOther || r.location != "/?gone=1" {
			t.Fatalf("POST /dlq/rm of a removed one: got %d to %q, want 303 to /?gone=1", r.code, r.location)
		}
	})
	// What the page showed at that sequence is gone: another dead letter
	// there now (DLQ made anew since) is kept.
	t.Run("another dead letter at the sequence", func(t *testing.T) {
		r := b.do(t, http.MethodPost, "/dlq/rm", url.Values{"seq": {strconv.FormatUint(dead[1].Seq, 10)}, "stored": {stored(dead[0])}})
		if r.code != http.StatusSeeOther || r.location != "/?gone=1" {
			t.Fatalf("POST /dlq/rm with another stored time: got %d to %q, want 303 to /?gone=1", r.code, r.location)
		}
		if got := b.deadLetters(t); len(got) != 1 {
			t.Errorf("dead letters after a removal of another: got %d, want 1 kept", len(got))
		}
	})
	t.Run("bad form", func(t *testing.T) {
		for _, form := range []url.Values{{"seq": {"x"}, "stored": {"1"}}, {"seq": {"1"}}} {
			if r := b.do(t, http.MethodPost, "/dlq/rm", form); r.code != http.StatusBadRequest {
				t.Errorf("POST /dlq/rm %v: got %d, want 400", form, r.code)
			}
		}
	})
}

func TestGetChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Auth{})
	b.enqueue(t, "job.fail.charge", "charge-1")
	b.waitPage(t, count("dlq-jobs", 1))
	seq := strconv.FormatUint(b.deadLetters(t)[0].Seq, 10)
	for _, path := range []string{"/dlq/retry?seq=" + seq, "/dlq/retry-all", "/dlq/rm?seq=" + seq, "/?retried=1&seq=" + seq} {
		r := b.do(t, http.MethodGet, path, nil)
		if path[1] == 'd' && r.code != http.StatusMethodNotAllowed {
			t.Errorf("GET %s: got %d, want 405", path, r.code)
		}
	}
	if r := b.do(t, http.MethodGet, "/nothing", nil); r.code != http.StatusNotFound {
		t.Errorf("GET /nothing: got %d, want 404", r.code)
	}
	if got := b.deadLetters(t); len(got) != 1 {
		t.Errorf("dead letters after GETs: got %d, want 1", len(got))
	}
}

func TestCrossOriginPostRejected(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Auth{})
	b.enqueue(t, "job.fail.charge", "charge-1")
	b.waitPage(t, count("dlq-jobs", 1))
	seq := strconv.FormatUint(b.deadLetters(t)[0].Seq, 10)
	stored := strconv.FormatInt(b.deadLetters(t)[0].Stored().UnixNano(), 10)
	host := strings.TrimPrefix(b.url, "http://")
	for _, tt := range []struct {
		name   string
		header []string
		want   int
	}{
		{"other origin", []string{"Origin: http://evil.example"}, http.StatusForbidden},
		{"other port", []string{"Origin: http://127.0.0.1:1"}, http.StatusForbidden},
		{"null origin", []string{"Origin: null"}, http.StatusForbidden},
		{"other referer", []string{"Referer: http://evil.example/page"}, http.StatusForbidden},
		{"same origin, other referer", []string{"Origin: " + b.url, "Referer: http://evil.example/"}, http.StatusForbidden},
		{"cross-site fetch", []string{"Sec-Fetch-Site: cross-site"}, http.StatusForbidden},
		{"same-site fetch", []string{"Sec-Fetch-Site: same-site", "Origin: http://localhost:1"}, http.StatusForbidden},
		{"same-site fetch alone", []string{"Sec-Fetch-Site: same-site"}, http.StatusForbidden},
		// Allowed: the seq is one that does not exist, so nothing changes.
		{"same origin", []string{"Origin: " + b.url, "Sec-Fetch-Site: same-origin", "Referer: http://" + host + "/"}, http.StatusSeeOther},
		{"no browser headers", nil, http.StatusSeeOther},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, path := range []string{"/dlq/retry", "/dlq/retry-all", "/dlq/rm"} {
				form := url.Values{"seq": {seq}, "stored": {stored}}
				if tt.want != http.StatusForbidden {
					if path == "/dlq/retry-all" {
						continue
					}
					form = url.Values{"seq": {"999"}, "stored": {stored}}
				}
				if r := b.do(t, http.MethodPost, path, form, tt.header...); r.code != tt.want {
					t.Errorf("POST %s with %q: got %d, want %d: %s", path, tt.header, r.code, tt.want, r.body)
				}
			}
		})
	}
	if got := b.deadLetters(t); len(got) != 1 {
		t.Errorf("dead letters after rejected POSTs: got %d, want 1", len(got))
	}
}

func TestAuthRequired(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		auth   dashboard.Auth
		good   []func(*http.Request)
		wrongs []func(*http.Request)
	}{
		{
			name: "user and password",
			auth: dashboard.Auth{User: "ops", Password: "pa55 word"},
			good: []func(*http.Request){func(r *http.Request) { r.SetBasicAuth("ops", "pa55 word") }},
			wrongs: []func(*http.Request){
				func(*http.Request) {},
				func(r *http.Request) { r.SetBasicAuth("ops", "guess") },
				func(r *http.Request) { r.SetBasicAuth("root", "pa55 word") },
				func(r *http.Request) { r.SetBasicAuth("", "") },
				func(r *http.Request) { r.Header.Set("Authorization", "Bearer pa55 word") },
			},
		},
		{
			name: "token",
			auth: dashboard.Auth{Token: "s3cret-token"},
			good: []func(*http.Request){
				func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret-token") },
				func(r *http.Request) { r.Header.Set("Authorization", "bearer s3cret-token") },
				func(r *http.Request) { r.SetBasicAuth("anyone", "s3cret-token") },
			},
			wrongs: []func(*http.Request){
				func(*http.Request) {},
				func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret") },
				func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret-token-and-more") },
				func(r *http.Request) { r.SetBasicAuth("s3cret-token", "") },
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "in") })
			h := tt.auth.Require(ok)
			serve := func(set func(*http.Request)) *httptest.ResponseRecorder {
				r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
				set(r)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			for i, set := range tt.good {
				if w := serve(set); w.Code != http.StatusOK || w.Body.String() != "in" {
					t.Errorf("good credential %d: got %d %q, want 200", i, w.Code, w.Body)
				}
			}
			for i, set := range tt.wrongs {
				w := serve(set)
				if w.Code != http.StatusUnauthorized || !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Basic ") {
					t.Errorf("wrong credential %d: got %d (WWW-Authenticate %q), want 401 with a Basic challenge", i, w.Code, w.Header().Get("WWW-Authenticate"))
				}
				if strings.Contains(w.Body.String(), "s3cret") || strings.Contains(w.Body.String(), "pa55") {
					t.Errorf("401 body shows the secret: %q", w.Body)
				}
			}
		})
	}

	t.Run("dashboard", func(t *testing.T) {
		t.Parallel()
		b := setup(t, dashboard.Auth{User: "ops", Password: "pw", Token: "tok"})
		b.enqueue(t, "job.fail.charge", "charge-1")
		if r := b.do(t, http.MethodGet, "/", nil); r.code != http.StatusUnauthorized {
			t.Errorf("GET / without credentials: got %d, want 401", r.code)
		}
		if r := b.do(t, http.MethodGet, "/", nil, "Authorization: Bearer tok"); r.code != http.StatusOK {
			t.Errorf("GET / with the token: got %d, want 200", r.code)
		}
		if r := b.do(t, http.MethodPost, "/dlq/retry-all", url.Values{}); r.code != http.StatusUnauthorized {
			t.Errorf("POST /dlq/retry-all without credentials: got %d, want 401", r.code)
		}
		req, _ := http.NewRequest(http.MethodGet, b.url+"/", nil)
		req.SetBasicAuth("ops", "pw")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET / with user and password: got %d, want 200", resp.StatusCode)
		}
	})
}

func TestLookup(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Auth{})
	b.enqueue(t, "job.ok.email", "welcome <ana>")
	b.waitPage(t, count("count-completed", 1))
	body := b.page(t, "/?id="+url.QueryEscape("welcome <ana>"))
	mustContain(t, body,
		`<div id="lookup-result"`, `value="welcome &lt;ana&gt;"`,
		"<dt>ID</dt><dd>welcome &lt;ana&gt;</dd>", `<dt>State</dt><dd><span class="state done">done</span></dd>`,
		"<dt>Subject</dt><dd>job.ok.email</dd>", "<dt>Attempts</dt><dd>1</dd>", "<dt>Took</dt>", "<dt>Finished</dt>",
		`<meta http-equiv="refresh" content="5; url=/?id=welcome&#43;%3Cana%3E">`,
	)
	if strings.Contains(body, "<ana>") {
		t.Errorf("page shows the ID unescaped")
	}
	mustContain(t, b.page(t, "/?id=nobody"), "No ledger record for job <q>nobody</q>")
}

// A running job's claim that was not renewed by its end is shown lapsed:
// its worker stopped without an outcome. One still renewed is not.
func TestLookupOfALapsedClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Auth{})
	for id, until := range map[string]time.Time{"lapsed-1": time.Now().Add(-time.Minute), "held-1": time.Now().Add(time.Hour)} {
		rec, err := json.Marshal(data.Record{ID: id, State: data.StateRunning, Subject: "job.x", Seq: 1, Attempts: 1, Worker: "gone/0", LeaseUntil: until})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.obj.Ledger.Put(context.Background(), data.Key(id), rec); err != nil {
			t.Fatal(err)
		}
	}
	mustContain(t, b.page(t, "/?id=lapsed-1"), `<dt>State</dt><dd><span class="state running">running</span></dd>`, "(lapsed: not renewed by its end")
	held := b.page(t, "/?id=held-1")
	mustContain(t, held, "<dt>Lease until</dt>")
	if strings.Contains(held, "lapsed") {
		t.Errorf("a claim renewed until an hour from now is shown lapsed")
	}
}

// A job running on its pool's lease, with no record until it ends, is
// found as leased, with its worker, as jobq job shows it; it was "not
// found".
func TestLookupOfAJobOnItsPoolsLease(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Auth{})
	b.enqueue(t, "job.slow.report", "slow-1")
	if id := <-b.started; id != "slow-1" {
		t.Fatalf("started %q, want slow-1", id)
	}
	mustContain(t, b.page(t, "/?id=slow-1"),
		"<dt>ID</dt><dd>slow-1</dd>", `<dt>State</dt><dd><span class="state leased">leased</span></dd>`,
		"<dt>Record</dt><dd>none yet: it runs on its pool", "<dt>Worker</dt>", "<dt>Lease until</dt>",
	)
}
