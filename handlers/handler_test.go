package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

// named returns a handler that records its name in *ran.
func named(name string, ran *string) handlers.Handler {
	return handlers.HandlerFunc(func(context.Context, *data.Job) error {
		*ran = name
		return nil
	})
}

// newRouter returns a router with a handler for each pattern that does nothing.
func newRouter(t testing.TB, patterns ...string) *handlers.Router {
	t.Helper()
	r := handlers.NewRouter()
	for _, p := range patterns {
		if err := r.HandleFunc(p, func(context.Context, *data.Job) error { return nil }); err != nil {
			t.Fatalf("HandleFunc(%q) = %v, want nil", p, err)
		}
	}
	return r
}

func TestRouterMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		patterns []string
		subject  string
		want     string // matched pattern; "" for none
	}{
		{"exact", []string{"job.email"}, "job.email", "job.email"},
		{"exact no match", []string{"job.email"}, "job.sms", ""},
		{"exact is not a prefix", []string{"job.email"}, "job.email.welcome", ""},
		{"star one token", []string{"job.*"}, "job.email", "job.*"},
		{"star not two tokens", []string{"job.*"}, "job.email.welcome", ""},
		{"star not zero tokens", []string{"job.*"}, "job", ""},
		{"gt one token", []string{"job.>"}, "job.email", "job.>"},
		{"gt many tokens", []string{"job.>"}, "job.email.welcome.v2", "job.>"},
		{"gt not zero tokens", []string{"job.>"}, "job", ""},
		{"bare gt", []string{">"}, "anything.at.all", ">"},
		{"bare star", []string{"*"}, "job", "*"},
		{"star in middle", []string{"job.*.welcome"}, "job.email.welcome", "job.*.welcome"},
		{"star in middle no match", []string{"job.*.welcome"}, "job.email.bye", ""},
		{"empty subject", []string{">"}, "", ""},
		{"empty token", []string{">"}, "job..email", ""},
		{"leading dot", []string{">"}, ".job", ""},
		{"trailing dot", []string{">"}, "job.", ""},
		{"no routes", nil, "job.email", ""},

		// Most specific wins.
		{"literal beats star", []string{"job.*", "job.email"}, "job.email", "job.email"},
		{"star beats gt", []string{"job.>", "job.*"}, "job.email", "job.*"},
		{"literal beats gt", []string{"job.>", "job.email"}, "job.email", "job.email"},
		{"longer literal beats shorter", []string{"job.>", "job.email.>"}, "job.email.welcome", "job.email.>"},
		{"leftmost token decides", []string{"job.*.welcome", "job.email.*"}, "job.email.welcome", "job.email.*"},
		{"leftmost literal beats later literals", []string{"*.email.welcome", "job.>"}, "job.email.welcome", "job.>"},
		{"backtracks from literal", []string{"job.email.welcome", "job.*.bye"}, "job.email.bye", "job.*.bye"},
		{"backtracks to gt", []string{"job.email.welcome", "job.>"}, "job.email.bye", "job.>"},
		{"backtracks to outer gt", []string{"job.email.x.y", ">"}, "job.email.x", ">"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRouter(t, tt.patterns...)
			h, got, ok := r.Match(tt.subject)
			if ok != (tt.want != "") || got != tt.want || (h == nil) == ok {
				t.Errorf("Match(%q) = (%v, %q, %v), want pattern %q", tt.subject, h, got, ok, tt.want)
			}
		})
	}
}

func TestRouterMostSpecific(t *testing.T) {
	t.Parallel()
	r := newRouter(t, "job.>", "job.*", "job.email.*", "job.email.welcome", "job.email.>", "job.*.welcome", "job.*.*.v2")
	tests := []struct {
		subject string
		want    string
	}{
		{"job.email", "job.*"},
		{"job.sms", "job.*"},
		{"job.email.welcome", "job.email.welcome"},
		{"job.email.bye", "job.email.*"},
		{"job.email.welcome.v2", "job.email.>"},
		{"job.email.a.b.c", "job.email.>"},
		{"job.sms.welcome", "job.*.welcome"},
		{"job.sms.bye", "job.>"},
		{"job.sms.welcome.v2", "job.*.*.v2"},
		{"job.sms.welcome.v3", "job.>"},
		{"job.a.b.c.d", "job.>"},
		{"other.email", ""},
		{"job", ""},
	}
	for _, tt := range tests {
		t.Run(tt.subject, func(t *testing.T) {
			t.Parallel()
			_, got, ok := r.Match(tt.subject)
			if got != tt.want || ok != (tt.want != "") {
				t.Errorf("Match(%q) = (%q, %v), want %q", tt.subject, got, ok, tt.want)
			}
		})
	}
}

func TestRouterHandleInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		pattern string
		want    string // in the error
	}{
		{"empty", "", "empty"},
		{"empty token", "job..email", "empty token"},
		{"leading dot", ".job", "empty token"},
		{"trailing dot", "job.", "empty token"},
		{"gt not last", "job.>.email", `">" is not its last token`},
		{"star with text", "job.a*", `token "a*" mixes a wildcard with text`},
		{"gt with text", "job.a>", `token "a>" mixes a wildcard with text`},
		{"double star", "job.**", `token "**" mixes`},
		{"space", "job. email", "whitespace"},
		{"tab", "job.\temail", "whitespace"},
		{"newline", "job.email\n", "whitespace"},
		{"control", "job.e\x00mail", "control character"},
		{"invalid utf8", "job.\xff", "UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := handlers.NewRouter()
			err := r.Handle(tt.pattern, handlers.Log(testLogger(t)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Handle(%q) = %v, want an error containing %q", tt.pattern, err, tt.want)
			}
			if r.Len() != 0 {
				t.Errorf("Len() = %d after a failed Handle, want 0", r.Len())
			}
		})
	}
}

func TestRouterHandleDuplicate(t *testing.T) {
	t.Parallel()
	r := newRouter(t, "job.email", "job.*")
	err := r.HandleFunc("job.email", func(context.Context, *data.Job) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Errorf("second Handle(job.email) = %v, want an already registered error", err)
	}
	if err := r.Handle("job.sms", nil); err == nil {
		t.Errorf("Handle with a nil handler = nil, want an error")
	}
	if err := r.HandleFunc("job.sms", nil); err == nil {
		t.Errorf("HandleFunc with a nil func = nil, want an error")
	}
	if got, want := r.Len(), 2; got != want {
		t.Errorf("Len() = %d, want %d", got, want)
	}
}

func TestRouterPatterns(t *testing.T) {
	t.Parallel()
	r := newRouter(t, "job.email.welcome", "job.>", "job.*", "job.email.*")
	got := r.Patterns()
	want := []string{"job.*", "job.>", "job.email.*", "job.email.welcome"}
	if !slices.Equal(got, want) {
		t.Errorf("Patterns() = %q, want %q", got, want)
	}
	if got, want := r.Len(), 4; got != want {
		t.Errorf("Len() = %d, want %d", got, want)
	}
	var zero handlers.Router
	if got := zero.Patterns(); len(got) != 0 {
		t.Errorf("zero Router Patterns() = %q, want none", got)
	}
}

func TestRouterProcess(t *testing.T) {
	t.Parallel()
	var ran string
	r := handlers.NewRouter()
	for _, p := range []string{"job.>", "job.email.*", "job.email.welcome"} {
		if err := r.Handle(p, named(p, &ran)); err != nil {
			t.Fatalf("Handle(%q) = %v, want nil", p, err)
		}
	}
	ctx := context.Background()
	for subject, want := range map[string]string{
		"job.email.welcome": "job.email.welcome",
		"job.email.bye":     "job.email.*",
		"job.sms":           "job.>",
	} {
		ran = ""
		if err := r.Process(ctx, &data.Job{Subject: subject}); err != nil {
			t.Errorf("Process(%q) = %v, want nil", subject, err)
		}
		if ran != want {
			t.Errorf("Process(%q) ran %q, want %q", subject, ran, want)
		}
	}
}

func TestRouterProcessPassesError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	r := handlers.NewRouter()
	if err := r.HandleFunc("job.x", func(context.Context, *data.Job) error { return boom }); err != nil {
		t.Fatal(err)
	}
	err := r.Process(context.Background(), &data.Job{Subject: "job.x"})
	if !errors.Is(err, boom) || handlers.IsPermanent(err) {
		t.Errorf("Process = %v (permanent %v), want %v (retryable)", err, handlers.IsPermanent(err), boom)
	}
}

func TestRouterNoRoute(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		patterns []string
		subject  string
	}{
		{"empty router", nil, "job.email"},
		{"no match", []string{"job.sms", "job.email.*"}, "job.email"},
		{"empty subject", []string{">"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := newRouter(t, tt.patterns...)
			err := r.Process(context.Background(), &data.Job{Subject: tt.subject})
			if !errors.Is(err, handlers.ErrNoRoute) {
				t.Errorf("Process(%q) = %v, want %v", tt.subject, err, handlers.ErrNoRoute)
			}
			if !handlers.IsPermanent(err) {
				t.Errorf("IsPermanent(%v) = false, want true", err)
			}
			if want := fmt.Sprintf("%q", tt.subject); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("Process(%q) = %v, want the subject %s in it", tt.subject, err, want)
			}
		})
	}
	if err := handlers.NewRouter().Process(context.Background(), nil); !handlers.IsPermanent(err) {
		t.Errorf("Process(nil job) = %v, want a permanent error", err)
	}
}

func TestRouterMiddlewareOrder(t *testing.T) {
	t.Parallel()
	var calls []string
	mw := func(name string) handlers.Middleware {
		return func(next handlers.Handler) handlers.Handler {
			return handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
				calls = append(calls, name+" before")
				err := next.Process(ctx, job)
				calls = append(calls, name+" after")
				return err
			})
		}
	}
	r := handlers.NewRouter()
	r.Use(mw("first"), nil, mw("second"))
	if err := r.HandleFunc("job.>", func(context.Context, *data.Job) error {
		calls = append(calls, "handler")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r.Use(mw("third")) // added after registration, still applies
	if err := r.Process(context.Background(), &data.Job{Subject: "job.x"}); err != nil {
		t.Fatalf("Process = %v, want nil", err)
	}
	want := []string{"first before", "second before", "third before", "handler", "third after", "second after", "first after"}
	if !slices.Equal(calls, want) {
		t.Errorf("calls = %q, want %q", calls, want)
	}

	// Match returns the handler without middleware.
	calls = nil
	h, _, _ := r.Match("job.x")
	if err := h.Process(context.Background(), &data.Job{Subject: "job.x"}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"handler"}; !slices.Equal(calls, want) {
		t.Errorf("Match handler calls = %q, want %q", calls, want)
	}
}

func TestRouterMiddlewareNoRoute(t *testing.T) {
	t.Parallel()
	called := false
	r := handlers.NewRouter()
	r.Use(func(next handlers.Handler) handlers.Handler { called = true; return next })
	if err := r.Process(context.Background(), &data.Job{Subject: "job.x"}); !errors.Is(err, handlers.ErrNoRoute) {
		t.Errorf("Process = %v, want %v", err, handlers.ErrNoRoute)
	}
	if called {
		t.Errorf("middleware ran for a job with no route, want not run")
	}
}

func TestRouterConcurrent(t *testing.T) {
	t.Parallel()
	r := handlers.NewRouter()
	var mu sync.Mutex
	counts := map[string]int{}
	for _, p := range []string{"job.>", "job.a", "job.b.*"} {
		if err := r.HandleFunc(p, func(context.Context, *data.Job) error {
			mu.Lock()
			counts[p]++
			mu.Unlock()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				subject := []string{"job.a", "job.b.c", "job.c"}[(i+j)%3]
				if err := r.Process(context.Background(), &data.Job{Subject: subject}); err != nil {
					t.Errorf("Process(%q) = %v, want nil", subject, err)
				}
				_ = r.Patterns()
			}
		})
	}
	wg.Wait()
	if got, want := counts["job.a"]+counts["job.b.*"]+counts["job.>"], 800; got != want {
		t.Errorf("handlers ran %d times, want %d", got, want)
	}
}

// specificity ranks a pattern's tokens: literal 2, '*' 1, '>' 0.
func specificity(pattern string) []int {
	var rank []int
	for tok := range strings.SplitSeq(pattern, ".") {
		switch tok {
		case ">":
			rank = append(rank, 0)
		case "*":
			rank = append(rank, 1)
		default:
			rank = append(rank, 2)
		}
	}
	return rank
}

// matches reports whether the valid pattern matches subject, by brute force.
func matches(pattern, subject string) bool {
	if subject == "" {
		return false
	}
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	if slices.Contains(st, "") {
		return false
	}
	for i, p := range pt {
		if p == ">" {
			return len(st) > i
		}
		if i >= len(st) || (p != "*" && p != st[i]) {
			return false
		}
	}
	return len(pt) == len(st)
}

// bruteMatch returns the most specific of patterns matching subject, or "".
func bruteMatch(patterns []string, subject string) string {
	best := ""
	for _, p := range patterns {
		if matches(p, subject) && (best == "" || slices.Compare(specificity(p), specificity(best)) > 0) {
			best = p
		}
	}
	return best
}

func FuzzRouterMatch(f *testing.F) {
	f.Add("job.>", "job.*", "job.email.*", "job.email.welcome")
	f.Add("job.*.welcome", "job.email.>", ">", "job.email.welcome.v2")
	f.Add("*.*", "job.a", "job.a.>", "job.a")
	f.Add("job.email", "", "job..x", "job..x")
	f.Fuzz(func(t *testing.T, p1, p2, p3, subject string) {
		r := handlers.NewRouter()
		var patterns []string
		for _, p := range []string{p1, p2, p3} {
			err := r.HandleFunc(p, func(context.Context, *data.Job) error { return nil })
			if err == nil {
				patterns = append(patterns, p)
			}
		}
		want := bruteMatch(patterns, subject)
		_, got, ok := r.Match(subject)
		if got != want || ok != (want != "") {
			t.Errorf("patterns %q: Match(%q) = (%q, %v), want %q", patterns, subject, got, ok, want)
		}
	})
}

func BenchmarkRouterMatch(b *testing.B) {
	r := newRouter(b, "job.>", "job.*", "job.email.*", "job.email.welcome", "job.email.>", "job.*.welcome", "job.sms.*")
	for _, subject := range []string{"job.email.welcome", "job.sms.bye.now", "job.other"} {
		b.Run(subject, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, ok := r.Match(subject); !ok {
					b.Fatalf("Match(%q) found nothing, want a pattern", subject)
				}
			}
		})
	}
}

// A fallback takes the jobs no pattern matches, and none that one does,
// however little specific; its jobs get the router's middleware too.
func TestRouterFallback(t *testing.T) {
	t.Parallel()
	var got []string
	take := func(name string) handlers.Handler {
		return handlers.HandlerFunc(func(_ context.Context, job *data.Job) error {
			got = append(got, name+":"+job.Subject)
			return nil
		})
	}
	r := handlers.NewRouter()
	if err := r.Handle("*.x", take("route")); err != nil {
		t.Fatal(err)
	}
	r.SetFallback(take("fallback"))
	r.Use(func(next handlers.Handler) handlers.Handler {
		return handlers.HandlerFunc(func(ctx context.Context, job *data.Job) error {
			got = append(got, "mw")
			return next.Process(ctx, job)
		})
	})
	for _, s := range []string{"job.x", "job.y"} {
		if err := r.Process(context.Background(), &data.Job{Subject: s}); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"mw", "route:job.x", "mw", "fallback:job.y"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	r.SetFallback(nil)
	if err := r.Process(context.Background(), &data.Job{Subject: "job.y"}); !errors.Is(err, handlers.ErrNoRoute) || !handlers.IsPermanent(err) {
		t.Errorf("without the fallback: got %v, want a permanent ErrNoRoute", err)
	}
}

// A fallback takes no subject that cannot be routed (empty, or with an
// empty token), in Match as in Process.
func TestRouterFallbackTakesNoUnroutableSubject(t *testing.T) {
	t.Parallel()
	r := handlers.NewRouter()
	r.SetFallback(handlers.HandlerFunc(func(context.Context, *data.Job) error { return nil }))
	for _, s := range []string{"", "job..x", ".job", "job."} {
		if h, p, ok := r.Match(s); ok || h != nil {
			t.Errorf("Match(%q) = %v, %q, %v; want no handler", s, h, p, ok)
		}
		if err := r.Process(context.Background(), &data.Job{Subject: s}); !errors.Is(err, handlers.ErrNoRoute) {
			t.Errorf("Process of %q: got %v, want ErrNoRoute", s, err)
		}
	}
}
