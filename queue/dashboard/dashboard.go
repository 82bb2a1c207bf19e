package dashboard

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/queue"
)

// The paths the dashboard serves. Only the POSTs change state.
const (
	// PathPage is the dashboard page (GET).
	PathPage = "/"
	// PathRetry re-drives one dead letter, its DLQ sequence in the form
	// field seq (POST).
	PathRetry = "/dlq/retry"
	// PathRetryAll re-drives every dead letter (POST).
	PathRetryAll = "/dlq/retry-all"
	// PathRemove deletes one dead letter, its DLQ sequence in the form
	// field seq and when DLQ stored it in stored, Unix nanoseconds, which
	// must match (POST).
	PathRemove = "/dlq/rm"
)

// Limits of the page.
const (
	// DeadLetters is how many dead letters the page lists, oldest first.
	DeadLetters = 50
	// DefaultRefresh is how often the page reloads itself.
	DefaultRefresh = 5 * time.Second
	// readTimeout bounds the JetStream reads of one page.
	readTimeout = 5 * time.Second
	// retryTimeout bounds one POST's re-drives.
	retryTimeout = 2 * time.Minute
)

//go:embed templates
var templates embed.FS

var (
	pageTemplate = template.Must(template.New("page.html").Funcs(template.FuncMap{
		"duration": humanDuration,
		"size":     HumanSize,
		"span":     HumanSpan,
		"clock":    clock,
		"datetime": datetime,
	}).ParseFS(templates, "templates/page.html"))
	style  = mustRead("templates/style.css")
	script = mustRead("templates/refresh.js")
	// contentPolicy lets the page run only its own inline style and script,
	// post forms only to itself, and never be framed (no clickjacking of
	// the Retry buttons).
	contentPolicy = "default-src 'none'; style-src " + hashSource(style) + "; script-src " + hashSource(script) +
		"; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

func mustRead(name string) string {
	b, err := templates.ReadFile(name)
	if err != nil {
		panic(err) // embedded at build time
	}
	return string(b)
}

func hashSource(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

// Config configures a Dashboard.
type Config struct {
	// Objects are the JetStream objects shown. Required.
	Objects *queue.Objects
	// Pool, when set, tells how many jobs are in flight. nil: this process
	// runs no workers.
	Pool *queue.Pool
	// Recorder, when set with Pool, gives the counts, the throughput chart
	// and the recent jobs. Set it as the pool's queue.Config.Observer.
	Recorder *Recorder
	// Auth, when enabled, is required of every request.
	Auth Auth
	// Refresh is how often the page reloads itself. Defaults to 5s.
	Refresh time.Duration
	// Log receives the re-drives and the errors. Defaults to none.
	Log zerolog.Logger
}

// Dashboard is jobq's web page: queue depth, jobs in flight, counts, a
// throughput chart, the recent jobs, the dead letters with a Retry and a
// Remove button each, and a job lookup in the ledger. It is an http.Handler for the
// paths above; GET never changes state, and a POST must come from the
// page's own origin. It is safe for concurrent use.
type Dashboard struct {
	cfg     Config
	handler http.Handler
}

// New returns a Dashboard over cfg.Objects.
func New(cfg Config) *Dashboard {
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	d := &Dashboard{cfg: cfg}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathPage+"{$}", d.page)
	mux.HandleFunc("POST "+PathRetry, d.retry)
	mux.HandleFunc("POST "+PathRetryAll, d.retryAll)
	mux.HandleFunc("POST "+PathRemove, d.remove)
	d.handler = cfg.Auth.Require(mux)
	return d
}

// ServeHTTP implements http.Handler.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.handler.ServeHTTP(w, r)
}

// Register serves the dashboard's paths on mux, beside mux's own.
func (d *Dashboard) Register(mux *http.ServeMux) {
	mux.Handle("GET "+PathPage+"{$}", d)
	mux.Handle("POST "+PathRetry, d)
	mux.Handle("POST "+PathRetryAll, d)
	mux.Handle("POST "+PathRemove, d)
}

// view is what the page template shows.
type view struct {
	Refresh    int // seconds
	RefreshURL string
	Style      template.CSS
	Script     template.JS
	Updated    time.Time
	Flash      *flash

	StatusErr string
	Status    queue.Status

	HasPool     bool
	InFlight    int
	HasRecorder bool
	Counts      Counts
	Chart       chart
	Recent      []Attempt

	Dead     []queue.DeadLetter
	DeadErr  string
	DeadMore uint64 // dead letters not listed

	Lookup lookup
}

type flash struct {
	Kind string // ok or error
	Text string
}

type lookup struct {
	ID       string
	Searched bool
	Record   *data.Record
	Lapsed   bool // the record's claim, see queue.ClaimLapsed
	NotFound bool
	Err      string
}

func (d *Dashboard) page(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	q := r.URL.Query()
	v := view{
		Refresh: int(d.cfg.Refresh.Round(time.Second) / time.Second),
		Style:   template.CSS(style),
		Script:  template.JS(script),
		Updated: time.Now(),
		Flash:   flashOf(q),
		HasPool: d.cfg.Pool != nil,
	}
	v.Refresh = max(v.Refresh, 1)
	v.RefreshURL = PathPage
	if id := q.Get("id"); id != "" {
		v.RefreshURL += "?" + url.Values{"id": {id}}.Encode()
	}
	if d.cfg.Pool != nil {
		v.InFlight = d.cfg.Pool.InFlight()
	}
	if rec := d.cfg.Recorder; rec != nil && d.cfg.Pool != nil {
		v.HasRecorder = true
		v.Counts = rec.Counts()
		v.Recent = rec.Recent()
		v.Chart = newChart(rec.Throughput(v.Updated))
	}
	st, err := queue.ReadStatus(ctx, d.cfg.Objects)
	if err != nil {
		v.StatusErr = err.Error()
	}
	v.Status = st
	v.Dead, err = queue.ListDeadLetterSummaries(ctx, d.cfg.Objects, DeadLetters)
	if err != nil {
		v.DeadErr = err.Error()
	}
	if n := uint64(len(v.Dead)); st.DLQ.Messages > n {
		v.DeadMore = st.DLQ.Messages - n
	}
	v.Lookup = d.lookup(ctx, q.Get("id"))

	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, v); err != nil {
		d.cfg.Log.Error().Err(err).Msg("render dashboard")
		http.Error(w, "500 internal server error: render dashboard: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", contentPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	w.Write(buf.Bytes())
}

// lookup reads the ledger record of job id, if any was asked for, or what
// a pool's lease tells of it (see queue.LookUp).
func (d *Dashboard) lookup(ctx context.Context, id string) lookup {
	l := lookup{ID: id, Searched: id != ""}
	if id == "" {
		return l
	}
	rec, err := queue.LookUp(ctx, d.cfg.Objects, id)
	switch {
	case errors.Is(err, data.ErrNotFound):
		l.NotFound = true
	case err != nil:
		l.Err = err.Error()
	default:
		l.Record = &rec
		l.Lapsed = queue.ClaimLapsed(rec, time.Now())
	}
	return l
}

// flashOf returns the message of a redirect after a POST.
func flashOf(q url.Values) *flash {
	retried, _ := strconv.Atoi(q.Get("retried"))
	failed, _ := strconv.Atoi(q.Get("failed"))
	switch {
	case q.Has("gone"):
		return &flash{"error", "That dead letter is gone: it was retried or purged already."}
	case failed > 0:
		return &flash{"error", "Retried " + plural(retried, "dead letter") + "; " + plural(failed, "retry") + " failed: see jobq's log."}
	case q.Has("retried"):
		return &flash{"ok", "Retried " + plural(retried, "dead letter") + ": back in JOB."}
	case q.Get("removed") == "0":
		return &flash{"error", "The dead letter could not be removed: see jobq's log."}
	case q.Has("removed"):
		return &flash{"ok", "Removed 1 dead letter: its job will not run."}
	}
	return nil
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if noun == "retry" {
		return strconv.Itoa(n) + " retries"
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// retry re-drives one dead letter and redirects back to the page.
func (d *Dashboard) retry(w http.ResponseWriter, r *http.Request) {
	if !d.allowPost(w, r) {
		return
	}
	seq, err := strconv.ParseUint(r.PostFormValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		http.Error(w, "400 bad request: want the form field seq, a dead letter's DLQ sequence", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), retryTimeout)
	defer cancel()
	dl, err := queue.DeadLetterAt(ctx, d.cfg.Objects, seq)
	if errors.Is(err, queue.ErrNoDeadLetter) {
		http.Redirect(w, r, PathPage+"?gone=1", http.StatusSeeOther)
		return
	}
	if err == nil {
		err = d.redrive(ctx, dl)
	}
	if err != nil {
		d.cfg.Log.Error().Err(err).Uint64("dlq_seq", seq).Msg("retry dead letter from the dashboard")
		http.Redirect(w, r, PathPage+"?retried=0&failed=1", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, PathPage+"?retried=1", http.StatusSeeOther)
}

// remove deletes one dead letter and redirects back to the page. The form
// names when DLQ stored it too: a DLQ made anew since the page was read may
// hold another job's dead letter at that sequence, which a removal, unlike
// a retry, would lose for good.
func (d *Dashboard) remove(w http.ResponseWriter, r *http.Request) {
	if !d.allowPost(w, r) {
		return
	}
	seq, err := strconv.ParseUint(r.PostFormValue("seq"), 10, 64)
	stored, serr := strconv.ParseInt(r.PostFormValue("stored"), 10, 64)
	if err != nil || serr != nil || seq == 0 {
		http.Error(w, "400 bad request: want the form fields seq, a dead letter's DLQ sequence, and stored, when DLQ stored it (Unix nanoseconds)", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), retryTimeout)
	defer cancel()
	dl, err := queue.DeadLetterAt(ctx, d.cfg.Objects, seq)
	if err == nil && dl.Stored().UnixNano() != stored {
		err = queue.ErrNoDeadLetter // another job's, of a DLQ made anew
	}
	if err == nil {
		err = queue.RemoveDeadLetter(ctx, d.cfg.Objects, dl)
	}
	switch {
	case errors.Is(err, queue.ErrNoDeadLetter):
		http.Redirect(w, r, PathPage+"?gone=1", http.StatusSeeOther)
	case err != nil:
		d.cfg.Log.Error().Err(err).Uint64("dlq_seq", seq).Msg("remove dead letter from the dashboard")
		http.Redirect(w, r, PathPage+"?removed=0", http.StatusSeeOther)
	default:
		d.cfg.Log.Info().Str("job_id", dl.ID).Str("subject", dl.Subject).Uint64("dlq_seq", dl.Seq).Msg("dead letter removed from the dashboard")
		http.Redirect(w, r, PathPage+"?removed=1", http.StatusSeeOther)
	}
}

// retryAll re-drives every dead letter and redirects back to the page.
func (d *Dashboard) retryAll(w http.ResponseWriter, r *http.Request) {
	if !d.allowPost(w, r) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), retryTimeout)
	defer cancel()
	retried, failed := 0, 0
	// One dead letter read at a time: a DLQ of large payloads is never in
	// memory whole.
	err := queue.EachDeadLetter(ctx, d.cfg.Objects, func(dl queue.DeadLetter) error {
		if err := d.redrive(ctx, dl); err != nil {
			d.cfg.Log.Error().Err(err).Uint64("dlq_seq", dl.Seq).Str("job_id", dl.ID).Msg("retry dead letter from the dashboard")
			failed++
			return ctx.Err() // the others are tried, while there is time
		}
		retried++
		return nil
	})
	if err != nil && ctx.Err() == nil { // not the end of a redrive counted above
		d.cfg.Log.Error().Err(err).Msg("read dead letters to retry from the dashboard")
		failed++
	}
	to := PathPage + "?retried=" + strconv.Itoa(retried)
	if failed > 0 {
		to += "&failed=" + strconv.Itoa(failed)
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

func (d *Dashboard) redrive(ctx context.Context, dl queue.DeadLetter) error {
	r, err := queue.RetryDeadLetter(ctx, d.cfg.Objects, dl)
	if err != nil {
		return err
	}
	d.cfg.Log.Info().Str("job_id", dl.ID).Str("subject", dl.Subject).Uint64("dlq_seq", dl.Seq).Uint64("seq", r.Sequence).Str("runs_as", r.ID).Msg("dead letter retried from the dashboard")
	return nil
}

// allowPost rejects a POST that another site's page sent (see sameOrigin)
// with 403, and bounds the form's size.
func (d *Dashboard) allowPost(w http.ResponseWriter, r *http.Request) bool {
	if err := sameOrigin(r); err != nil {
		d.cfg.Log.Warn().Err(err).Str("path", r.URL.Path).Msg("dashboard POST rejected")
		http.Error(w, "403 forbidden: "+err.Error()+"; use the dashboard's own buttons", http.StatusForbidden)
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	return true
}
