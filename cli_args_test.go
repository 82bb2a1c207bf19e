package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A --server list for a cluster names each server with its credentials:
// redactURL hid only those of the first, up to its first "@", so that an
// error (cannot reach a jobq server at ...) and serve's log line "using
// external nats server" showed the password of every other URL, and the
// rest of a password that holds an "@".
func TestRedactURLHidesEveryCredential(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://u:pw1@h1:4222,nats://u2:SECRET2@h2:4222": "nats://***@h1:4222,nats://***@h2:4222",
		"nats://h1:4222,nats://u:SECRET@h2:4222":         "nats://h1:4222,nats://***@h2:4222",
		"nats://u:p@SECRET@h:4222":                       "nats://***@h:4222",
		"u:SECRET@h:4222":                                "***@h:4222",
		"nats://h:4222":                                  "nats://h:4222",
		"nats://u:SECRET@h:4222/x@y":                     "nats://***@h:4222/x@y",
	} {
		got := redactURL(in)
		if got != want || strings.Contains(got, "SECRET") {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// README, "When things go wrong": for every dlq command "an empty argument
// (an unset shell variable) is bad usage (exit 2)". dlq rm says so, before
// it connects; dlq show and dlq retry connected, then failed with exit 1
// ("no such dead letter: \"\""), or, with no server, blamed the server.
func TestDLQEmptyArgumentIsBadUsage(t *testing.T) {
	t.Parallel()
	unreachable := "nats://" + freeAddr(t)
	for _, args := range [][]string{
		{"dlq", "show", ""},
		{"dlq", "show", "", "--by-id"},
		{"dlq", "retry", ""},
		{"dlq", "retry", "", "--by-id"},
		{"dlq", "rm", ""},
	} {
		r := jobq(t, append(args, "--server", unreachable)...)
		wantOneLineError(t, r, 2, "empty")
	}
}

// A job ID is "any bytes but ASCII control characters" (queue.ValidID), so
// enqueue takes one that is not UTF-8; jobq next --json printed it as JSON
// text, each such byte U+FFFD: two jobs a\xffb and a\xfeb both came out as
// "a\ufffdb", and a script could not name the job it took (jobq job, dlq).
// The payload has payload_base64 for this; the ID has to round-trip too.
func TestNextJSONKeepsAnIDThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	for _, id := range []string{"a\xffb", "a\xfeb"} {
		s.enqueue(t, "job.bytes", "p", id)
		var out struct {
			jobOut
			IDBase64 string `json:"id_base64"`
		}
		s.jobqJSON(t, &out, "next", "--wait", "20s")
		got := out.ID
		if out.IDBase64 != "" {
			b, err := base64.StdEncoding.DecodeString(out.IDBase64)
			if err != nil {
				t.Fatalf("id_base64 %q: %v", out.IDBase64, err)
			}
			got = string(b)
		}
		if got != id {
			raw, _ := json.Marshal(out)
			t.Errorf("next --json for job %q: got %s, want its ID as given (in id_base64 if not UTF-8)", id, raw)
		}
	}
}

// "help" and "h" are job IDs like any other (enqueue --id help stores
// one), but urfave/cli gave every command a help subcommand: jobq job help
// showed the help of jobq job, and jobq dlq rm h, dlq retry help and dlq
// show h did the same and exited 0 having done nothing, so a script's
// `jobq dlq rm "$ID"` or `jobq dlq retry "$ID"` said it was done. Likewise
// jobq import h, for a file named h. Here no server runs: each command must
// try to reach it, not show help.
func TestAJobIDNamedHelpIsAnArgument(t *testing.T) {
	t.Parallel()
	unreachable := "nats://" + freeAddr(t)
	for _, args := range [][]string{
		{"job", "help"},
		{"job", "h"},
		{"dlq", "show", "help"},
		{"dlq", "retry", "h"},
		{"dlq", "rm", "h", "--by-id"},
		{"dlq", "remove", "help"},
		{"import", "h"},
	} {
		if args[0] == "import" {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "h"), []byte(`{"subject":"job.x"}`+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			r := runCmdIn(t, dir, append(args, "--server", unreachable)...)
			wantOneLineError(t, r, 1, "cannot reach a jobq server")
			continue
		}
		r := jobq(t, append(args, "--server", unreachable)...)
		wantOneLineError(t, r, 1, "cannot reach a jobq server")
	}
}

// runCmdIn runs jobq with args in dir.
func runCmdIn(t *testing.T, dir string, args ...string) result {
	t.Helper()
	cmd := exec.Command(jobqBin, args...)
	cmd.Dir, cmd.Env = dir, subprocessEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run jobq %q: %v", args, err)
	}
	return r
}

// A directory given to import opened fine and read as no input: import
// connected and failed there (exit 1), or, with a server, imported nothing.
// A directory is the wrong argument, bad usage like a missing file.
func TestImportOfADirectoryIsBadUsage(t *testing.T) {
	t.Parallel()
	r := jobq(t, "import", t.TempDir(), "--server", "nats://"+freeAddr(t))
	wantOneLineError(t, r, 2, "is a directory")
}

// Go's flag package words a bad boolean "invalid boolean value … for
// -json", which named the flag as it is not typed.
func TestBadBooleanFlagIsNamedAsTyped(t *testing.T) {
	t.Parallel()
	r := jobq(t, "import", "--json=maybe", "-")
	wantOneLineError(t, r, 2, `"maybe" for --json`)
}
