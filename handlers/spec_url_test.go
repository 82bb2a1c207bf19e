package handlers_test

import (
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/jobq/jobq/handlers"
)

// An http URL whose port is out of range is bad usage at start-up: it
// passed, and every job then failed its dial, retried until its deliveries
// ran out.
func TestParseSpecRefusesAnOutOfRangePort(t *testing.T) {
	t.Parallel()
	for _, port := range []string{"99999", "0", "65536"} {
		spec := "http:http://127.0.0.1:" + port + "/hook"
		if _, err := handlers.ParseSpec(spec, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "port "+port+": want 1 to 65535") {
			t.Errorf("ParseSpec(%q) = %v; want it refused for its port", spec, err)
		}
	}
	if _, err := handlers.ParseSpec("http:http://127.0.0.1:65535/hook", zerolog.Nop()); err != nil {
		t.Errorf("port 65535: %v", err)
	}
}

// An error quotes a URL as typed when it holds nothing to hide: the URL
// http:// was shown as "http:", and its route as job.a=http:http:.
func TestParseSpecQuotesAURLAsTyped(t *testing.T) {
	t.Parallel()
	if _, err := handlers.ParseSpec("http:http://", zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "URL http:// has no host") {
		t.Errorf(`ParseSpec("http:http://") = %v, want an error quoting the URL as http://`, err)
	}
	for route, want := range map[string]string{
		"job.a=http:http://":                          "job.a=http:http://",
		"job.a=http:http://u:secret@h/p?token=t#frag": "job.a=http:http://h/p",
	} {
		if got := handlers.RedactRoute(route); got != want {
			t.Errorf("RedactRoute(%q) = %q, want %q", route, got, want)
		}
	}
}
