package handlers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jobq/jobq/data"
)

const (
	// httpBodySnippet bounds how much of a failed response's body an error
	// shows.
	httpBodySnippet = 256
	// httpDrainMax bounds how much of a response body is read to let its
	// connection be reused.
	httpDrainMax = 64 << 10
	// httpBodyWait bounds the time spent reading a response body once the
	// status is in.
	httpBodyWait = time.Second
	// httpStatusMax bounds how much of a status line an error shows.
	httpStatusMax = 64
	// httpMaxRedirects bounds the 307 and 308 redirects the default client
	// follows.
	httpMaxRedirects = 10
)

// defaultHTTPClient is the client HTTP uses when given none (see
// newHTTPClient).
var defaultHTTPClient = newHTTPClient(httpIdleConnTimeout)

const (
	// httpIdleConnTimeout is how long the default client keeps a
	// connection idle for a next request: less than the shortest idle
	// timeout of common servers (gunicorn's 2s; node's, Apache's and
	// uvicorn's 5s). A request sent on a connection just as its server
	// closes it, idle, fails with EOF or a reset, a failed attempt of its
	// job; net/http resends no POST that it wrote. So a connection is
	// reused within a burst of jobs, and a job after a pause opens one.
	httpIdleConnTimeout = time.Second
	// httpMaxIdlePerHost is how many idle connections the default client
	// keeps per host: one per worker of a large pool. With net/http's 2,
	// all but two of eight workers posting together opened a connection,
	// and a TLS handshake, per job.
	httpMaxIdlePerHost = 64
)

// newHTTPClient returns a client with no overall timeout (the job's ctx
// bounds each request), that follows only 307 and 308 redirects, since
// those keep the method and the body, and keeps connections idle for at
// most idle. Its transport is net/http's default one (proxies from the
// environment, HTTP/2 over TLS, the same dial and handshake timeouts) but
// for its idle connections; it is made here rather than cloned from
// http.DefaultTransport, which a program may have replaced.
func newHTTPClient(idle time.Duration) *http.Client {
	t := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   httpMaxIdlePerHost,
		IdleConnTimeout:       idle,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &http.Client{
		Transport: t,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= httpMaxRedirects || req.Response == nil {
				return http.ErrUseLastResponse
			}
			switch req.Response.StatusCode {
			case http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
				return nil
			}
			return http.ErrUseLastResponse
		},
	}
}

// HTTP returns a Handler that POSTs each job's payload to rawURL with client;
// a nil client means one with no overall timeout that follows only 307 and
// 308 redirects, and keeps a connection idle for at most a second (see
// newHTTPClient). The ctx bounds each request.
//
// The Content-Type is the job's "Content-Type" header, else
// application/octet-stream. The headers X-Jobq-Job-Id, X-Jobq-Subject,
// X-Jobq-Attempt, X-Jobq-Seq and X-Jobq-Resumed ("1" or "0") describe the job;
// a job ID that is not a valid header value is sent percent-encoded.
//
// A 2xx status means done. A 4xx status other than 408 and 429 is a Permanent
// error; any other status and any transport error or timeout is retryable.
// Errors name the URL without its user info, query or fragment, and show the
// status and the start of the response body. They name the URL by its
// scheme and host alone ("https://hooks.example.com/…"): they are stored
// in the ledger and in dead letters, and a webhook URL often holds its
// secret in its path (Slack's, Discord's). An invalid rawURL makes every
// job fail permanently; ParseSpec checks it up front.
func HTTP(rawURL string, client *http.Client) Handler {
	if client == nil {
		client = defaultHTTPClient
	}
	u, err := parseHookURL(rawURL)
	if err != nil {
		return &httpHandler{client: client, err: err}
	}
	return &httpHandler{url: rawURL, safeURL: hookOrigin(u), client: client}
}

// hookOrigin names the hook at u by its scheme and host, the rest elided.
func hookOrigin(u *url.URL) string {
	s := u.Scheme + "://" + u.Host
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.ForceQuery {
		s += "/…"
	}
	return s
}

type httpHandler struct {
	url     string
	safeURL string // url fit for errors and logs (see hookOrigin)
	client  *http.Client
	err     error // why url is unusable
}

// Process POSTs job to the handler's URL.
func (h *httpHandler) Process(ctx context.Context, job *data.Job) error {
	if job == nil {
		return Permanent(errors.New("http: nil job"))
	}
	if h.err != nil {
		return Permanent(h.err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(job.Payload))
	if err != nil {
		return Permanent(fmt.Errorf("post %s: %w", h.safeURL, err))
	}
	ct := job.HeaderValue("Content-Type")
	if ct == "" || !validHeaderValue(ct) {
		ct = "application/octet-stream"
	}
	resumed := "0"
	if job.Resumed {
		resumed = "1"
	}
	req.Header.Set("Content-Type", ct)
	req.Header.Set("X-Jobq-Job-Id", headerSafe(job.ID))
	req.Header.Set("X-Jobq-Subject", headerSafe(job.Subject))
	req.Header.Set("X-Jobq-Attempt", strconv.Itoa(job.Attempt))
	req.Header.Set("X-Jobq-Seq", strconv.FormatUint(job.Seq, 10))
	req.Header.Set("X-Jobq-Resumed", resumed)

	resp, err := h.client.Do(req)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("post %s: %w", h.safeURL, ctxErr)
		}
		// A *url.Error repeats the URL, query and all; say it once, redacted.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("post %s: %w", h.safeURL, err)
	}
	// The outcome is known from here: a body that comes slowly, or never,
	// may not hold the worker, so reading it gets a second.
	stopReading := time.AfterFunc(httpBodyWait, func() { _ = resp.Body.Close() })
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, httpDrainMax))
		_ = resp.Body.Close()
		stopReading.Stop()
	}()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, httpBodySnippet+4))
	msg := fmt.Sprintf("post %s: status %s", h.safeURL, statusText(resp))
	if s := oneLine(truncate(snippet, httpBodySnippet)); s != "" {
		msg += ": " + s
	}
	err = errors.New(msg)
	if permanentStatus(resp.StatusCode) {
		return Permanent(err)
	}
	return err
}

// permanentStatus reports whether a response with status code means the
// request will never succeed: a 4xx other than 408 and 429.
func permanentStatus(code int) bool {
	return code >= 400 && code < 500 &&
		code != http.StatusRequestTimeout && code != http.StatusTooManyRequests
}

// statusText returns resp's status as "404 Not Found".
func statusText(resp *http.Response) string {
	if s := strings.TrimSpace(resp.Status); s != "" {
		return oneLine(truncate(s, httpStatusMax))
	}
	return strconv.Itoa(resp.StatusCode)
}

// parseHookURL parses raw as an absolute http or https URL with a host. Its
// errors never show the URL's user info or query.
func parseHookURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("invalid URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("URL %s has scheme %q, not http or https", redactURL(raw, u), u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("URL %s has no host", redactURL(raw, u))
	}
	// Refused here, at start-up, rather than by each job's dial, retried
	// until the job's deliveries run out.
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("URL %s has port %s: want 1 to 65535", redactURL(raw, u), p)
		}
	}
	return u, nil
}

// redactURL returns the URL raw, which parsed as u, without user info,
// query and fragment, where secrets tend to live; as typed if it has none.
func redactURL(raw string, u *url.URL) string {
	if u.User == nil && u.RawQuery == "" && !u.ForceQuery && u.Fragment == "" {
		return raw
	}
	c := *u
	c.User = nil
	c.RawQuery = ""
	c.ForceQuery = false
	c.Fragment = ""
	c.RawFragment = ""
	return c.String()
}

// RedactRoute returns a --handler route (SUBJECT=SPEC) as an error may
// show it: an http handler's URL without its user info and query, which
// may hold secrets, even if the URL does not parse.
func RedactRoute(route string) string {
	// Cut where ParseRoute cuts: a subject may hold "=" itself.
	pattern, spec, ok := cutRoute(route)
	if !ok {
		return route
	}
	kind, raw, ok := strings.Cut(strings.TrimSpace(spec), ":")
	if !ok || kind != "http" && kind != "https" {
		return route
	}
	if u, err := url.Parse(strings.TrimSpace(raw)); err == nil {
		return pattern + "=" + kind + ":" + redactURL(strings.TrimSpace(raw), u)
	}
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw = raw[:i]
	}
	if i := strings.Index(raw, "//"); i >= 0 {
		host := raw[i+2:]
		if end := strings.IndexByte(host, '/'); end >= 0 {
			host = host[:end]
		}
		if at := strings.LastIndexByte(host, '@'); at >= 0 {
			raw = raw[:i+2] + raw[i+2+at+1:]
		}
	}
	return pattern + "=" + kind + ":" + raw
}

// headerSafe returns v, percent-encoded if net/http would reject it as a
// header value.
func headerSafe(v string) string {
	if validHeaderValue(v) {
		return v
	}
	return url.PathEscape(v)
}

// validHeaderValue reports whether net/http accepts v as a header value: no
// control characters other than tab.
func validHeaderValue(v string) bool {
	for i := range len(v) {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// oneLine returns s trimmed, valid UTF-8, with runs of whitespace and control
// characters replaced by one space.
func oneLine(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return r < 0x20 || r == 0x7f || r == ' '
	}), " ")
}
