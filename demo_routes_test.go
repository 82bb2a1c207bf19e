package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
)

// --demo logs every job no --handler routes: with a route that matches the
// demo's job.payroll, it added no catch-all, and other jobs no route took
// were dead-lettered ("no handler for subject") rather than logged. Its
// catch-all takes no job from a route, however little specific.
func TestDemoLogsEveryJobNoHandlerRoutes(t *testing.T) {
	t.Parallel()
	got := map[string]string{} // subject: the pattern that takes it; "" the demo's log
	app := newApp(strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{})
	for _, cmd := range app.Commands {
		if cmd.Name == "serve" {
			cmd.Action = func(c *cli.Context) error {
				r, err := routes(c, zerolog.Nop())
				if err != nil {
					return err
				}
				for _, s := range []string{"job.payroll", "job.email.welcome", "job.sms", "job.x"} {
					if _, pattern, ok := r.Match(s); ok {
						got[s] = pattern
					}
				}
				return nil
			}
		}
	}
	if err := app.Run([]string{"jobq", "serve", "--demo", "--handler", "job.*=exec:true", "--handler", "*.x=log"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"job.payroll": "job.*", "job.email.welcome": "", "job.sms": "job.*", "job.x": "job.*"}
	for s, p := range want {
		if g, ok := got[s]; !ok || g != p {
			t.Errorf("%s: taken by %q (routed %v), want %q (\"\": the demo's log)", s, g, ok, p)
		}
	}
}
