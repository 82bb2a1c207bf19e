package dashboard

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// Auth is the credential that the dashboard, and whatever else Require
// wraps, asks of every request: a token, or a user with a password, the
// ones jobq serve's clients present (--token, --user, --password). The zero
// Auth asks nothing.
//
// A request presents it as HTTP Basic auth with User and Password, or the
// token as `Authorization: Bearer TOKEN` or as the password of HTTP Basic
// auth with any user (so a browser's login prompt works for both).
type Auth struct {
	Token    string
	User     string
	Password string
}

// Enabled reports whether a asks for a credential.
func (a Auth) Enabled() bool { return a.Token != "" || a.User != "" || a.Password != "" }

// Allows reports whether r presents a's credential; always, when a is not
// Enabled. Secrets are compared in constant time.
func (a Auth) Allows(r *http.Request) bool {
	if !a.Enabled() {
		return true
	}
	ok := 0
	if user, pass, basic := r.BasicAuth(); basic {
		if a.User != "" || a.Password != "" {
			ok |= equal(user, a.User) & equal(pass, a.Password)
		}
		if a.Token != "" {
			ok |= equal(pass, a.Token)
		}
	}
	if scheme, token, found := strings.Cut(r.Header.Get("Authorization"), " "); found && strings.EqualFold(scheme, "Bearer") && a.Token != "" {
		ok |= equal(strings.TrimSpace(token), a.Token)
	}
	return ok == 1
}

// Require returns h behind a: a request that does not present a's
// credential gets 401 with a Basic challenge and never reaches h.
func (a Auth) Require(h http.Handler) http.Handler {
	if !a.Enabled() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.Allows(r) {
			w.Header().Set("WWW-Authenticate", `Basic realm="jobq", charset="UTF-8"`)
			http.Error(w, "401 unauthorized: log in with jobq serve's --user and --password, or any user and its --token as the password", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// equal compares two secrets in constant time, also in their length: it
// compares their SHA-256 sums. It returns 1 if they are equal, else 0.
func equal(got, want string) int {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:])
}

// sameOrigin rejects a request that a browser sent from another site, so
// that no other page can make a logged-in browser change state here: a
// Sec-Fetch-Site other than same-origin or none (typed by the user), or,
// from a browser too old to send it, an Origin or Referer whose host is not
// the request's Host. A request without these headers (curl, a script)
// passes.
//
// A browser's Sec-Fetch-Site is its own word, which no page can set, and
// it is taken alone: behind a reverse proxy that passes on a Host of its
// own (nginx's default, the upstream's address), the Origin never names
// the Host, and every button of the dashboard was refused. This is what
// net/http's CrossOriginProtection does, which also checks no Referer.
func sameOrigin(r *http.Request) error {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "":
	case "same-origin", "none":
		return nil
	default:
		return fmt.Errorf("cross-site request: Sec-Fetch-Site %q, want same-origin", site)
	}
	for _, name := range []string{"Origin", "Referer"} {
		v := r.Header.Get(name)
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return fmt.Errorf("cross-origin request: %s %q is not this host %q", name, v, r.Host)
		}
	}
	return nil
}
