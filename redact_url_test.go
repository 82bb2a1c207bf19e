package main

import (
	"strings"
	"testing"
)

// A password with "/", "?" or "#" not percent-encoded (a generated one)
// makes the URL unparsable, and validServerURLs says so with the URL
// redacted: redactURL cut the host part at that character, found no "@"
// before it, and showed the password. (The old redactURL hid it.)
func TestRedactURLHidesPasswordsWithURLDelimiters(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"nats://user:pa/SECRET@h:4222",
		"nats://user:pa#SECRET@h:4222",
		"nats://user:pa?SECRET@h:4222",
		"nats://h1:4222,nats://u:x/SECRET@h2:4222",
		"u:a/SECRET@h:4222",
	} {
		if got := redactURL(in); strings.Contains(got, "SECRET") {
			t.Errorf("redactURL(%q) = %q: the password shows", in, got)
		}
		if err := validServerURLs(in); err != nil && strings.Contains(err.Error(), "SECRET") {
			t.Errorf("validServerURLs(%q): %v", in, err)
		}
	}
}
