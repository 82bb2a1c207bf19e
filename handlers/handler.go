package handlers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/jobq/jobq/data"
)

// Handler runs one job. A nil error means done; an error means the attempt
// failed and will be retried unless it is Permanent. The job is the
// handler's own (queue.Pool passes a copy): it may keep it after Process
// returns, though its Payload and Header must not be changed.
type Handler interface {
	Process(ctx context.Context, job *data.Job) error
}

// HandlerFunc adapts an ordinary function to a Handler.
type HandlerFunc func(ctx context.Context, job *data.Job) error

// Process calls f(ctx, job).
func (f HandlerFunc) Process(ctx context.Context, job *data.Job) error { return f(ctx, job) }

// Middleware wraps a Handler with behaviour of its own, such as logging or
// metrics, around the call to the next Handler.
type Middleware func(Handler) Handler

// Router routes jobs by subject to handlers registered under NATS subject
// patterns: tokens are separated by '.', '*' matches one token and '>' matches
// one or more trailing tokens.
//
// The most specific pattern wins, compared token by token from the left: a
// literal token beats '*', which beats '>', so a longer literal match beats a
// shorter one. For job.email.welcome, job.email.welcome beats job.email.*,
// which beats job.email.>, which beats job.*.welcome, which beats job.>.
//
// A Router is safe for concurrent use; the zero value is an empty Router.
type Router struct {
	mu       sync.RWMutex
	root     node
	routes   map[string]Handler // by pattern
	fallback Handler            // for subjects no pattern matches, if set
	mws      []Middleware
}

// NewRouter returns an empty Router.
func NewRouter() *Router { return &Router{} }

// Handle registers h for pattern. It returns an error if the pattern is
// invalid (empty, an empty token, '>' before the last token, a token mixing a
// wildcard with text such as "a*", whitespace or control characters), if it is
// already registered, or if h is nil.
func (r *Router) Handle(pattern string, h Handler) error {
	if err := checkPattern(pattern); err != nil {
		return err
	}
	if h == nil {
		return fmt.Errorf("pattern %q: nil handler", pattern)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.routes[pattern]; ok {
		return fmt.Errorf("pattern %q is already registered", pattern)
	}
	if r.routes == nil {
		r.routes = make(map[string]Handler)
	}
	r.routes[pattern] = h
	r.root.insert(pattern, &entry{pattern: pattern, h: h})
	return nil
}

// HandleFunc registers f for pattern, as Handle does.
func (r *Router) HandleFunc(pattern string, f func(context.Context, *data.Job) error) error {
	if f == nil {
		return r.Handle(pattern, nil)
	}
	return r.Handle(pattern, HandlerFunc(f))
}

// Use adds middleware that Process wraps around every handler, including
// those registered before. The first middleware is the outermost. Nil
// middleware is ignored.
func (r *Router) Use(mw ...Middleware) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range mw {
		if m != nil {
			r.mws = append(r.mws, m)
		}
	}
}

// SetFallback sets the handler for jobs whose subject no pattern matches,
// which Process fails otherwise (ErrNoRoute); nil removes it. Unlike a
// route for ">", it never takes a job from a registered pattern, however
// little specific.
func (r *Router) SetFallback(h Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fallback = h
}

// Match returns the handler registered under the most specific pattern that
// matches subject, without middleware, and that pattern; or the fallback,
// with pattern "", if none matches. ok is false when neither does, or
// subject is empty or has an empty token.
func (r *Router) Match(subject string) (h Handler, pattern string, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e := r.match(subject)
	if e == nil {
		ok := r.fallback != nil && routable(subject)
		if !ok {
			return nil, "", false
		}
		return r.fallback, "", true
	}
	return e.h, e.pattern, true
}

// Process runs job with the handler that Match picks for job.Subject, wrapped
// in the router's middleware. When nothing matches, and there is no
// fallback, it returns a Permanent error wrapping ErrNoRoute that names the
// subject.
func (r *Router) Process(ctx context.Context, job *data.Job) error {
	if job == nil {
		return Permanent(errors.New("process: nil job"))
	}
	r.mu.RLock()
	e, fallback := r.match(job.Subject), r.fallback
	mws := r.mws
	r.mu.RUnlock()
	var h Handler
	switch {
	case e != nil:
		h = e.h
	case fallback != nil && routable(job.Subject):
		h = fallback
	default:
		return Permanent(fmt.Errorf("%w %q", ErrNoRoute, job.Subject))
	}
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h.Process(ctx, job)
}

// Len returns the number of registered patterns.
func (r *Router) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.routes)
}

// Patterns returns the registered patterns, sorted.
func (r *Router) Patterns() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	ps := make([]string, 0, len(r.routes))
	for p := range r.routes {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// MaxSubjectLen is the longest job subject, in bytes: well under NATS's
// limit on a protocol line (4 KiB), which a publish's subject goes in; the
// server closes the connection of a client that goes over it, failing
// every publish on it.
const MaxSubjectLen = 1024

// ValidSubject returns nil if subject is a concrete subject a job can be
// published on: at least two tokens, the first "job", no empty tokens, no
// wildcards, no whitespace or control characters, valid UTF-8, at most
// MaxSubjectLen bytes. Otherwise it
// returns an error saying what is wrong.
func ValidSubject(subject string) error {
	if len(subject) > MaxSubjectLen {
		// Quoted whole, it would make an error as long as the subject.
		return fmt.Errorf("invalid subject %.40q… (%d bytes): longer than %d bytes", subject, len(subject), MaxSubjectLen)
	}
	reason := textProblem(subject)
	if reason == "" {
		switch {
		case strings.ContainsAny(subject, "*>"):
			reason = "contains a wildcard"
		case !strings.HasPrefix(subject, "job."):
			reason = `not under "job."`
		case strings.HasSuffix(subject, ".") || strings.Contains(subject, ".."):
			reason = "contains an empty token"
		}
	}
	if reason != "" {
		return fmt.Errorf("invalid subject %q: %s (want e.g. job.email)", subject, reason)
	}
	return nil
}

// match returns the most specific entry for subject, or nil. The caller
// holds r.mu.
func (r *Router) match(subject string) *entry {
	if !routable(subject) {
		return nil
	}
	return r.root.match(subject)
}

// routable reports whether subject can be routed: not empty, no empty
// token.
func routable(subject string) bool {
	return subject != "" && subject[0] != '.' && subject[len(subject)-1] != '.' && !strings.Contains(subject, "..")
}

// entry is one registered route.
type entry struct {
	pattern string
	h       Handler
}

// node is one level of the pattern trie. Trying children in the order
// literal, '*', '>' and taking the first full match yields the most specific
// pattern.
type node struct {
	literal map[string]*node
	star    *node  // patterns continuing with '*'
	rest    *entry // the pattern ending in '>' here
	end     *entry // the pattern ending here
}

// insert adds e under the tokens of pattern, which is valid.
func (n *node) insert(pattern string, e *entry) {
	for tok := range strings.SplitSeq(pattern, ".") {
		switch tok {
		case ">":
			n.rest = e
			return
		case "*":
			if n.star == nil {
				n.star = &node{}
			}
			n = n.star
		default:
			c := n.literal[tok]
			if c == nil {
				if n.literal == nil {
					n.literal = make(map[string]*node)
				}
				c = &node{}
				n.literal[tok] = c
			}
			n = c
		}
	}
	n.end = e
}

// match returns the most specific entry under n for subject, a non-empty
// list of non-empty tokens, or nil.
func (n *node) match(subject string) *entry {
	tok, after, more := strings.Cut(subject, ".")
	if c := n.literal[tok]; c != nil {
		if e := c.next(after, more); e != nil {
			return e
		}
	}
	if n.star != nil {
		if e := n.star.next(after, more); e != nil {
			return e
		}
	}
	return n.rest
}

// next continues a match at n with the tokens after the one just matched.
func (n *node) next(after string, more bool) *entry {
	if !more {
		return n.end
	}
	return n.match(after)
}

// checkPattern returns an error saying what is wrong with pattern, or nil.
func checkPattern(pattern string) error {
	if reason := patternProblem(pattern); reason != "" {
		return fmt.Errorf("invalid pattern %q: %s", pattern, reason)
	}
	return nil
}

// patternProblem says what is wrong with pattern, or returns "".
func patternProblem(pattern string) string {
	if reason := textProblem(pattern); reason != "" {
		return reason
	}
	if len(pattern) > MaxSubjectLen {
		// Each token matches one byte or more: so long a pattern matches
		// no subject.
		return fmt.Sprintf("longer than %d bytes, as no job subject is", MaxSubjectLen)
	}
	toks := strings.Split(pattern, ".")
	for i, tok := range toks {
		switch {
		case tok == "":
			return "contains an empty token"
		case tok == ">":
			if i != len(toks)-1 {
				return `">" is not its last token`
			}
		case tok == "*":
		case strings.ContainsAny(tok, "*>"):
			return fmt.Sprintf("token %q mixes a wildcard with text", tok)
		}
	}
	return ""
}

// textProblem says what makes s unusable as a subject or pattern regardless
// of its tokens, or returns "".
func textProblem(s string) string {
	switch {
	case s == "":
		return "empty"
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return "contains whitespace or a control character"
	}
	return ""
}
