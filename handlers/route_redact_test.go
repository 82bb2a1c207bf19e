package handlers_test

import (
	"strings"
	"testing"

	"github.com/jobq/jobq/handlers"
)

// A route whose subject holds "=" (as NATS allows, and ParseRoute takes)
// is redacted too: RedactRoute cut it at its first "=", found no http
// spec after it, and the error for a bad port showed the URL's password
// and query token.
func TestRedactRouteHidesSecretsAfterASubjectWithEquals(t *testing.T) {
	t.Parallel()
	for route, want := range map[string]string{
		"job.a=b=http:http://u:s3cret@h:99999/p?token=t": "job.a=b=http:http://h:99999/p",
		"job.a==http:http://u:s3cret@h/p?token=t":        "job.a==http:http://h/p",
	} {
		got := handlers.RedactRoute(route)
		if strings.Contains(got, "s3cret") || strings.Contains(got, "token=t") || got != want {
			t.Errorf("RedactRoute(%q) = %q, want %q", route, got, want)
		}
	}
}
