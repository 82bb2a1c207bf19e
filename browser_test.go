//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
	"github.com/jobq/jobq/queue"
	"github.com/jobq/jobq/queue/dashboard"
	"github.com/jobq/jobq/server/servertest"
)

// screenshotFile is the dashboard's picture in the README; go test -run
// TestDashboardBrowser -update . rewrites it.
const screenshotFile = "docs/dashboard.png"

// findBrowser returns Debian's chromium, or skips the test without one.
func findBrowser(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	fmt.Println("TestDashboardBrowser skipped: no chromium at /usr/bin/chromium or on PATH (apt-get install chromium)")
	t.Skip("no chromium at /usr/bin/chromium or on PATH: apt-get install chromium")
	return ""
}

// TestDashboardBrowser drives the dashboard in headless Chromium, served by
// startHTTP as jobq serve serves it, over a pool whose handler fails the
// jobs on job.charge.*: the counts change after jobs run, a dead letter's
// Retry button re-drives it (it leaves the list and then runs), the job
// lookup shows its record, and the page fits a phone's width.
func TestDashboardBrowser(t *testing.T) {
	t.Parallel()
	browser := findBrowser(t)
	started := time.Now()

	log := servertest.Logger(t)
	reg, metrics := newMetrics()
	rec := dashboard.NewRecorder()
	srv, obj := provisioned(t, false, queue.Config{
		Metrics: metrics, Observer: rec, FetchWait: 200 * time.Millisecond, RetryBackoff: []time.Duration{10 * time.Millisecond},
	})
	reg.MustRegister(queue.NewStatusCollector(obj, 0))
	var failing atomic.Bool
	failing.Store(true)
	r := handlers.NewRouter()
	r.HandleFunc("job.>", func(ctx context.Context, job *data.Job) error {
		time.Sleep(time.Duration(len(job.ID)) * time.Millisecond) // durations that differ
		return nil
	})
	r.HandleFunc("job.reports.>", func(_ context.Context, job *data.Job) error {
		if job.Attempt == 1 {
			return errors.New("report store busy: try again")
		}
		return nil
	})
	r.HandleFunc("job.charge.>", func(context.Context, *data.Job) error {
		if failing.Load() {
			return handlers.Permanent(errors.New("card declined: insufficient funds"))
		}
		return nil
	})
	pool := queue.NewPool(obj, r, log)
	if err := pool.Start(context.Background()); err != nil {
		t.Fatalf("start pool: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pool.Stop(ctx)
	})
	// The page reloads itself only once an hour here, so no reload races
	// the test's clicks.
	dash := dashboard.New(dashboard.Config{Objects: obj, Pool: pool, Recorder: rec, Refresh: time.Hour, Log: log})
	hs := startHTTP(listenLocal(t), obj, pool, srv.StoreErr, reg, srv.MonitorHandlers(), dash, dashboard.Auth{}, log)
	t.Cleanup(func() { hs.Shutdown(context.Background()) })
	base := "http://" + hs.Addr

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(browser),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.WindowSize(1200, 900),
	)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	defer cancelTab()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	eval := func(js string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		if err != nil {
			t.Fatalf("evaluate %s: %v", js, err)
		}
		return s
	}
	rows := func(table string) string {
		return eval(`Array.from(document.querySelectorAll("` + table + ` tbody tr")).map(r => r.innerText.replace(/\s+/g, " ").trim()).join("\n")`)
	}
	// reloadUntil reloads the page until each id's text is its value.
	reloadUntil := func(want map[string]string) {
		t.Helper()
		deadline := time.Now().Add(waitTimeout)
		for {
			do("reload", chromedp.Reload())
			ok := true
			for id, v := range want {
				ok = ok && text("#"+id) == v
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %s the page shows %v, want %v", waitTimeout, map[string]string{"count-completed": text("#count-completed"), "dlq-jobs": text("#dlq-jobs")}, want)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	do("load the dashboard", chromedp.Navigate(base+"/"))
	if title, _ := chromedp.Run(ctx, chromedp.Title()); title != "jobq dashboard" {
		t.Errorf("title: got %q, want jobq dashboard", title)
	}
	for sel, want := range map[string]string{"#count-completed": "0", "#dlq-jobs": "0", "#no-dead-letters": "No dead letters."} {
		if got := text(sel); got != want {
			t.Errorf("%s before any job: got %q, want %q", sel, got, want)
		}
	}

	prod := queue.NewProducer(obj.JS, obj.Config)
	for _, j := range []struct{ subject, id string }{
		{"job.email.welcome", "welcome-ana"}, {"job.email.welcome", "welcome-bob"}, {"job.reports.daily", "report-2026-11-29"},
		{"job.charge.card", "charge-1041"}, {"job.payroll", "payroll-E001"}, {"job.payroll", "payroll-E002"},
		{"job.charge.card", "charge-1042"}, {"job.email.digest", "digest-weekly-0048"},
	} {
		if _, err := prod.Enqueue(context.Background(), j.subject, []byte(`{}`), queue.EnqueueOptions{ID: j.id}); err != nil {
			t.Fatalf("enqueue %s: %v", j.id, err)
		}
	}
	reloadUntil(map[string]string{"count-completed": "6", "count-retried": "1", "count-failed": "2", "dlq-jobs": "2"})
	dead := rows("#dead-letters")
	if !strings.Contains(dead, "charge-1041") || !strings.Contains(dead, "charge-1042") || !strings.Contains(dead, "card declined") || strings.Count(dead, "\n") != 1 {
		t.Errorf("dead letters: got\n%s\nwant charge-1041 and charge-1042 with their error", dead)
	}
	if recent := rows("#recent-jobs"); strings.Count(recent, "\n") != 8 || !strings.Contains(recent, "welcome-ana") || !strings.Contains(recent, "retrying") || !strings.Contains(recent, "failed") {
		t.Errorf("recent jobs: got\n%s\nwant the 8 jobs' 9 attempts", recent)
	}
	if bars := eval(`String(document.querySelectorAll("svg rect.ok").length)`); bars == "0" {
		t.Errorf("throughput chart has no bar of completed jobs")
	}
	if *update {
		// The picture shows the page as jobq serve shows it: the same
		// data, reloading itself every 5s.
		shown := httptest.NewServer(dashboard.New(dashboard.Config{Objects: obj, Pool: pool, Recorder: rec, Log: log}))
		defer shown.Close()
		do("load the page to picture", chromedp.Navigate(shown.URL+"/"))
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		do("load the dashboard again", chromedp.Navigate(base+"/"))
		if err := os.MkdirAll(filepath.Dir(screenshotFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(screenshotFile, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d bytes)", screenshotFile, len(png))
	}

	// The handler is fixed: retry one dead letter with its button.
	failing.Store(false)
	if _, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil,
		chromedp.Click(chromedp.CSS(`button[aria-label="Retry charge-1041"]`)))); err != nil {
		t.Fatalf("click Retry of charge-1041: %v", err)
	}
	if got := text(".flash"); got != "Retried 1 dead letter: back in JOB." {
		t.Errorf("after Retry: got message %q, want Retried 1 dead letter", got)
	}
	if dead := rows("#dead-letters"); strings.Contains(dead, "charge-1041") || !strings.Contains(dead, "charge-1042") {
		t.Errorf("dead letters after retrying charge-1041: got\n%s\nwant only charge-1042", dead)
	}
	// The page's script took the message out of the address: a reload
	// does not show it again.
	if loc, _ := chromedp.Run(ctx, chromedp.Location()); loc != base+"/" {
		t.Errorf("address after Retry: got %s, want %s/", loc, base)
	}
	reloadUntil(map[string]string{"count-completed": "7", "dlq-jobs": "1"})

	// Find the retried job with the search form.
	if _, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Steps(
		chromedp.SendKeys(chromedp.ID("id"), "charge-1041"),
		chromedp.Click(chromedp.CSS(`form.lookup button`)),
	))); err != nil {
		t.Fatalf("search charge-1041: %v", err)
	}
	if got := text("#lookup-result .state"); got != "done" {
		t.Errorf("lookup of charge-1041: got state %q, want done", got)
	}
	if got := text("#lookup-result"); !strings.Contains(got, "Attempts") {
		t.Errorf("lookup of charge-1041: got %q, want its record", got)
	}

	// Remove the other dead letter: the page asks first, and a No keeps it.
	var accept atomic.Bool
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	asked := make(chan string, 4)
	go func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			asked <- ev.Message
			if _, err := chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: accept.Load()}); err != nil && ctx.Err() == nil {
				t.Errorf("answer the page's question: %v", err)
			}
		}
	}()
	do("navigate", chromedp.Navigate(base+"/"))
	do("click Remove, answer no", chromedp.Click(chromedp.CSS(`button[aria-label="Remove charge-1042"]`)))
	if q := <-asked; !strings.Contains(q, "charge-1042") || !strings.Contains(q, "will not run") {
		t.Errorf("Remove asked %q, want a question naming charge-1042", q)
	}
	reloadUntil(map[string]string{"dlq-jobs": "1"})
	accept.Store(true)
	if _, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil,
		chromedp.Click(chromedp.CSS(`button[aria-label="Remove charge-1042"]`)))); err != nil {
		t.Fatalf("click Remove of charge-1042: %v", err)
	}
	<-asked
	if got := text(".flash"); got != "Removed 1 dead letter: its job will not run." {
		t.Errorf("after Remove: got message %q, want Removed 1 dead letter", got)
	}
	if got := text("#dlq-jobs"); got != "0" {
		t.Errorf("dead letters after removing charge-1042: got %s, want 0", got)
	}

	// On a phone's width nothing makes the page scroll sideways.
	do("phone viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Navigate(base+"/"))
	if got := eval(`String(document.documentElement.scrollWidth) + " " + String(document.documentElement.clientWidth)`); func() bool {
		var sw, cw int
		fmt.Sscan(got, &sw, &cw)
		return sw > cw
	}() {
		t.Errorf("on a 390px wide phone the page is wider than the screen: scroll width, client width %s", got)
		t.Log(eval(`Array.from(document.querySelectorAll("*")).filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1).slice(0, 15).map(e => e.tagName + "." + e.className + "#" + e.id + " " + Math.round(e.getBoundingClientRect().right)).join("\n")`))
	}
	t.Logf("browser test took %s", time.Since(started).Round(time.Millisecond))
}
