package handlers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
	"github.com/jobq/jobq/handlers"
)

var specTests = []struct {
	name     string
	spec     string
	wantKind string // "log", "exec" or "http" when accepted
	wantErr  string // in the error when rejected
}{
	{"log", "log", "log", ""},
	{"log with spaces", "  log\t", "log", ""},
	{"log with argument", "log:verbose", "", `handler "log" takes no argument`},
	{"log with empty argument", "log:", "", `handler "log" takes no argument`},
	{"empty", "", "", "empty handler spec: want log, exec:COMMAND or http:URL"},
	{"blank", "  \n", "", "empty handler spec"},
	{"exec", "exec:./send.sh", "exec", ""},
	{"exec with spaces", "exec:  echo hi | tr a b  ", "exec", ""},
	{"exec with colon and equals", "exec:FOO=a:b ./x", "exec", ""},
	{"exec empty", "exec:", "", `handler "exec" needs a command: want exec:COMMAND, e.g. exec:./send.sh`},
	{"exec blank", "exec:  ", "", `handler "exec" needs a command`},
	{"exec no colon", "exec", "", `handler "exec" needs a command`},
	{"http", "http:http://127.0.0.1:9000/hook", "http", ""},
	{"http https", "http:https://example.com/hook?token=x", "http", ""},
	{"http with spaces", " http: http://localhost/ ", "http", ""},
	{"http empty", "http:", "", `handler "http" needs a URL: want http:URL, e.g. http:http://127.0.0.1:9000/hook`},
	{"http no colon", "http", "", `handler "http" needs a URL`},
	{"bare http URL", "http://127.0.0.1:9000/hook", "", `handler spec is a bare URL: put "http:" before it`},
	{"bare https URL", "https://example.com/hook", "", "handler spec is a bare URL"},
	{"https kind", "https:https://example.com/hook", "", `unknown handler kind "https"`},
	{"http wrong scheme", "http:ftp://example.com/x", "", `has scheme "ftp", not http or https`},
	{"http relative", "http:/hook", "", `has scheme "", not http or https`},
	{"http no host", "http:http:///hook", "", "has no host"},
	{"http bad URL", "http:http://user:pw@exa mple.com/", "", "invalid URL"},
	{"http bad port", "http:https://user:pw@example.com:bad/?token=t", "", "invalid URL"},
	{"unknown kind", "grpc:localhost:9000", "", `unknown handler kind "grpc": want log, exec:COMMAND or http:URL`},
	{"kinds are lower case", "LOG", "", `unknown handler kind "LOG"`},
}

func TestParseSpec(t *testing.T) {
	t.Parallel()
	for _, tt := range specTests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, err := handlers.ParseSpec(tt.spec, zerolog.Nop())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseSpec(%q) = %v, want an error containing %q", tt.spec, err, tt.wantErr)
				}
				for _, secret := range []string{"pw", "token"} {
					if strings.Contains(err.Error(), secret) {
						t.Errorf("ParseSpec(%q) = %q, want no %q in it", tt.spec, err, secret)
					}
				}
				return
			}
			if err != nil || h == nil {
				t.Fatalf("ParseSpec(%q) = (%v, %v), want a handler", tt.spec, h, err)
			}
			if got := fmt.Sprintf("%T", h); !strings.Contains(got, tt.wantKind) {
				t.Errorf("ParseSpec(%q) = %s, want a %s handler", tt.spec, got, tt.wantKind)
			}
		})
	}
}

func TestParseSpecLog(t *testing.T) {
	t.Parallel()
	var buf strings.Builder
	h, err := handlers.ParseSpec("log", zerolog.New(&buf))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Process(context.Background(), &data.Job{ID: "x", Subject: "job.x"}); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); !strings.Contains(got, `"job_id":"x"`) {
		t.Errorf("log handler wrote %q, want the job to the given logger", got)
	}
}

const routeForm = "want SUBJECT=SPEC, e.g. job.email=exec:./send.sh"

var routeTests = []struct {
	name        string
	route       string
	wantPattern string
	wantSpec    string
	wantErr     string // in the error when rejected
}{
	{"exec", "job.email=exec:./send.sh", "job.email", "exec:./send.sh", ""},
	{"spaces trimmed", " job.email = log ", "job.email", "log", ""},
	{"gt", "job.>=log", "job.>", "log", ""},
	{"bare gt", ">=log", ">", "log", ""},
	{"star first", "*.email=log", "*.email", "log", ""},
	{"star last", "job.*=log", "job.*", "log", ""},
	{"spec with equals", "job.hook=http:http://x/?a=b", "job.hook", "http:http://x/?a=b", ""},
	{"spec not checked", "job.x=nonsense", "job.x", "nonsense", ""},
	// NATS takes "=" in a subject, and so does jobq enqueue: such a subject
	// has a route of its own, cut at the "=" a spec follows. It was cut at
	// the first, and refused: unknown handler kind "42=log".
	{"subject with equals", "job.user.id=42=log", "job.user.id=42", "log", ""},
	{"subject with equals, exec with equals", "job.k=v = exec:./run a=b", "job.k=v", "exec:./run a=b", ""},
	{"exec spec with equals", "job.a=exec:b=log", "job.a", "exec:b=log", ""},
	{"no equals", "job.email", "", "", `handler route has no "="`},
	{"empty", "", "", "", `handler route has no "="`},
	{"empty subject", "=log", "", "", "handler route has an empty subject"},
	{"empty spec", "job.email=", "", "", `handler route for "job.email" has an empty spec`},
	{"blank spec", "job.email=  ", "", "", "has an empty spec"},
	{"empty token", "job..x=log", "", "", `invalid handler subject "job..x": contains an empty token`},
	{"mixed wildcard", "job.a*=log", "", "", `token "a*" mixes a wildcard with text`},
	{"gt not last", "job.>.x=log", "", "", `">" is not its last token`},
	{"inner space", "job. x=log", "", "", "contains whitespace"},
	{"outside job", "orders.new=log", "", "", `handler subject "orders.new" matches no subject under "job."`},
	{"job alone", "job=log", "", "", `handler subject "job" matches no subject`},
	{"star alone", "*=log", "", "", `handler subject "*" matches no subject`},
	// No subject is so long (found by FuzzParseRoute).
	{"longer than a subject", "job." + strings.Repeat("x", 1021) + "=log", "", "", "longer than 1024 bytes, as no job subject is"},
}

func TestParseRoute(t *testing.T) {
	t.Parallel()
	for _, tt := range routeTests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pattern, spec, err := handlers.ParseRoute(tt.route)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseRoute(%q) = %v, want an error containing %q", tt.route, err, tt.wantErr)
				}
				if !strings.HasSuffix(err.Error(), routeForm) {
					t.Errorf("ParseRoute(%q) = %q, want it to end %q", tt.route, err, routeForm)
				}
				return
			}
			if err != nil || pattern != tt.wantPattern || spec != tt.wantSpec {
				t.Errorf("ParseRoute(%q) = (%q, %q, %v), want (%q, %q, nil)", tt.route, pattern, spec, err, tt.wantPattern, tt.wantSpec)
			}
		})
	}
}

func TestValidSubject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		subject string
		wantErr string // "" for valid
	}{
		{"job.email", ""},
		{"job.email.welcome", ""},
		{"job.a-b_c.ñ", ""},
		{"", "empty"},
		{"job", `not under "job."`},
		{"jobs.x", `not under "job."`},
		{"orders.new", `not under "job."`},
		{"job.", "empty token"},
		{"job..x", "empty token"},
		{".job.x", `not under "job."`},
		{"job.*", "wildcard"},
		{"job.>", "wildcard"},
		{"job.a*", "wildcard"},
		{"job. x", "whitespace"},
		{"job.x\n", "whitespace"},
		{"job.\x01", "control character"},
		{"job.\xff", "UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.subject, func(t *testing.T) {
			t.Parallel()
			err := handlers.ValidSubject(tt.subject)
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("ValidSubject(%q) = %v, want nil", tt.subject, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ValidSubject(%q) = %v, want an error containing %q", tt.subject, err, tt.wantErr)
			}
		})
	}
}

func FuzzParseSpec(f *testing.F) {
	for _, tt := range specTests {
		f.Add(tt.spec)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		h, err := handlers.ParseSpec(spec, zerolog.Nop())
		if (err == nil) == (h == nil) {
			t.Fatalf("ParseSpec(%q) = (%v, %v), want exactly one of a handler and an error", spec, h, err)
		}
		if err != nil && strings.ContainsAny(err.Error(), "\r\n") {
			t.Errorf("ParseSpec(%q) error %q, want one line", spec, err)
		}
	})
}

// exampleSubject returns a subject that the valid pattern matches.
func exampleSubject(pattern string) string {
	toks := strings.Split(pattern, ".")
	for i, tok := range toks {
		switch {
		case i == 0 && (tok == "*" || tok == ">"):
			toks[i] = "job"
			if tok == ">" {
				toks = append(toks, "x")
			}
		case tok == "*" || tok == ">":
			toks[i] = "x"
		}
	}
	return strings.Join(toks, ".")
}

func FuzzParseRoute(f *testing.F) {
	for _, tt := range routeTests {
		f.Add(tt.route)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pattern, spec, err := handlers.ParseRoute(s)
		if err != nil {
			if pattern != "" || spec != "" {
				t.Errorf("ParseRoute(%q) = (%q, %q, %v), want empty results with the error", s, pattern, spec, err)
			}
			if msg := err.Error(); strings.ContainsAny(msg, "\r\n") || !strings.HasSuffix(msg, routeForm) {
				t.Errorf("ParseRoute(%q) error %q, want one line ending %q", s, msg, routeForm)
			}
			return
		}
		if spec == "" || spec != strings.TrimSpace(spec) {
			t.Errorf("ParseRoute(%q) = (%q, %q), want a trimmed, non-empty spec", s, pattern, spec)
		}
		p2, s2, err := handlers.ParseRoute(pattern + "=" + spec)
		if err != nil || p2 != pattern || s2 != spec {
			t.Errorf("ParseRoute(%q) = (%q, %q, %v), want (%q, %q, nil) again", pattern+"="+spec, p2, s2, err, pattern, spec)
		}
		r := handlers.NewRouter()
		if err := r.Handle(pattern, handlers.Log(zerolog.Nop())); err != nil {
			t.Fatalf("Handle(%q) = %v, want nil for a pattern ParseRoute accepted", pattern, err)
		}
		subject := exampleSubject(pattern)
		if err := handlers.ValidSubject(subject); err != nil {
			t.Fatalf("pattern %q: example subject: %v, want a valid subject", pattern, err)
		}
		if _, got, ok := r.Match(subject); !ok || got != pattern {
			t.Errorf("pattern %q: Match(%q) = (%q, %v), want it to match", pattern, subject, got, ok)
		}
	})
}
