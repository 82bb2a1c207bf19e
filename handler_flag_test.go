package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
)

// A --handler value is one route: a comma in the command or the URL does not
// split it into several.
func TestHandlerFlagKeepsCommas(t *testing.T) {
	for _, route := range []string{
		`job.csv=exec:cut -d, -f1 >/dev/null`,
		`job.hook=http:http://127.0.0.1:9000/hook?fields=a,b`,
	} {
		t.Run(route, func(t *testing.T) {
			var got []string
			var routeErr error
			app := newApp(strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
			for _, cmd := range app.Commands {
				if cmd.Name == "serve" {
					cmd.Action = func(c *cli.Context) error {
						got = c.StringSlice("handler")
						_, routeErr = routes(c, zerolog.Nop())
						return nil
					}
				}
			}
			if err := app.Run([]string{"jobq", "serve", "--handler", route}); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != route || routeErr != nil {
				t.Errorf("--handler %q: got routes %q (routes() error: %v), want the one route", route, got, routeErr)
			}
		})
	}
}

// serve's usage errors quote a --handler route without its URL's user info
// and query, which ParseSpec keeps out of its own errors too.
func TestHandlerErrorHidesURLSecrets(t *testing.T) {
	for _, route := range []string{
		"job.x=http:ftp://user:hunter2@example.com/hook?token=s3cret",       // bad scheme
		"job.x=http:https://user:hunter2@example.com:bad/hook?token=s3cret", // bad port
		"job x=http:https://user:hunter2@example.com/hook?token=s3cret",     // bad subject
	} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"jobq", "serve", "--store-dir", t.TempDir(), "--listen", "", "--http", "", "--handler", route},
			strings.NewReader(""), &stdout, &stderr)
		if code != exitUsage {
			t.Errorf("--handler %q: exit %d, want %d; stderr %q", route, code, exitUsage, stderr.String())
		}
		for _, secret := range []string{"hunter2", "s3cret"} {
			if strings.Contains(stderr.String(), secret) {
				t.Errorf("--handler %q: stderr %q shows the secret %q", route, stderr.String(), secret)
			}
		}
	}
}
