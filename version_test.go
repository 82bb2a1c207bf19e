package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

func TestVersionAndCompletion(t *testing.T) {
	t.Parallel()
	r := jobq(t, "version", "--json")
	var v map[string]string
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil {
		t.Fatalf("jobq version --json: got %s", r)
	}
	server, client := required(t, "github.com/nats-io/nats-server/v2"), required(t, "github.com/nats-io/nats.go")
	// The product's contract names the release lines: a patch of either
	// may come in, another line may not.
	if !strings.HasPrefix(server, "v2.15.") || !strings.HasPrefix(client, "v1.55.") {
		t.Errorf("go.mod pins nats-server %s and nats.go %s, want v2.15.x and v1.55.x", server, client)
	}
	if v["nats_server"] != server || v["nats_go"] != client || !strings.HasPrefix(v["go"], "go1.") || v["version"] == "" {
		t.Errorf("jobq version --json: got %v, want nats-server %s, nats.go %s (go.mod's), a Go version and a version", v, server, client)
	}
	if r := jobq(t, "version"); r.code != 0 || !strings.HasPrefix(r.stdout, "jobq ") {
		t.Errorf("jobq version: got %s", r)
	}
	for _, tt := range []struct{ shell, want string }{
		{"bash", "complete -o default -F _jobq_complete jobq"},
		{"zsh", "compdef _jobq jobq"},
		{"fish", "complete -c jobq"},
	} {
		r := jobq(t, "completion", tt.shell)
		if r.code != 0 || !strings.Contains(r.stdout, tt.want) {
			t.Errorf("jobq completion %s: got %s, want a script with %q", tt.shell, r, tt.want)
		}
	}
	// The bash script really completes: sourced in bash, it offers the
	// commands after "jobq ".
	if bash, err := exec.LookPath("bash"); err == nil {
		script := filepath.Join(t.TempDir(), "c.bash")
		os.WriteFile(script, []byte(jobq(t, "completion", "bash").stdout), 0o600)
		cmd := exec.Command(bash, "-c", `source "$1"; COMP_WORDS=(jobq ""); COMP_CWORD=1; _jobq_complete; printf '%s\n' "${COMPREPLY[@]}"`, "bash", script)
		cmd.Env = append(subprocessEnv(), "PATH="+filepath.Dir(jobqBin)+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "serve") || !strings.Contains(string(out), "enqueue") {
			t.Errorf("bash completion of \"jobq \": got %q, %v; want the commands", out, err)
		}
	}
}

// TestSecretsStayOutOfLogs runs serve with every kind of secret at debug
// level, drives it, and checks that no secret reaches its log or status.
func TestSecretsStayOutOfLogs(t *testing.T) {
	t.Parallel()
	const token, password = "tok-5ecret-0001", "pw-5ecret-0002"
	srv := startServe(t, serveOpts{args: []string{"--token", token, "--handler", "job.>=log"}, env: []string{"JOBQ_PASSWORD_UNUSED=" + password}})
	auth := []string{"--token", token}
	r := srv.jobq(t, append([]string{"enqueue", "job.s", "hello", "--id", "s-1"}, auth...)...)
	if r.code != 0 {
		t.Fatalf("enqueue with the token: %s", r)
	}
	checkFor(t, waitTimeout, pollInterval, func() error {
		if r := srv.jobq(t, append([]string{"job", "s-1", "--json"}, auth...)...); !strings.Contains(r.stdout, `"state": "done"`) {
			return fmt.Errorf("job s-1: got %s, want done", r)
		}
		return nil
	})
	st := srv.jobq(t, append([]string{"status", "--json"}, auth...)...)
	if r := srv.jobq(t, "status"); r.code == 0 {
		t.Errorf("status without the token: got %s, want a refusal", r)
	}
	srv.Stop(t)
	for name, text := range map[string]string{"log": srv.logText(), "status": st.stdout + st.stderr} {
		if strings.Contains(text, token) || strings.Contains(text, password) {
			t.Errorf("a secret appears in the %s", name)
		}
	}
}

// required is the version go.mod pins for module path.
func required(t *testing.T, path string) string {
	t.Helper()
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(path) + ` (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatalf("go.mod does not require %s", path)
	}
	return string(m[1])
}

// TestSystemdUnit checks the hardened unit in packaging/: the directives the
// README promises, and that every JOBQ_ variable it sets is a real setting.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("packaging/jobq.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(raw)
	for _, want := range []string{
		"\nDynamicUser=yes\n", "\nStateDirectory=jobq\n", "\nProtectSystem=strict\n", "\nRestart=on-failure\n",
		"\nNoNewPrivileges=yes\n", "\nCapabilityBoundingSet=\n", "\nExecStart=/usr/local/bin/jobq serve\n", "\nKillSignal=SIGTERM\n",
		// SIGTERM to jobq alone: with systemd's default, control-group, each
		// exec handler's command got it at once too, and its job failed an
		// attempt (exit status 143; dead-lettered on its last) instead of
		// running on for --shutdown-timeout.
		"\nKillMode=mixed\n",
	} {
		if !strings.Contains(unit, want) {
			t.Errorf("jobq.service lacks %q", strings.TrimSpace(want))
		}
	}
	// systemd SIGKILLs a stop that takes longer than TimeoutStopSec; the
	// graceful stop's bounds (see the unit's comment) must fit in it.
	stopSec := regexp.MustCompile(`\nTimeoutStopSec=(\d+)\n`).FindStringSubmatch(unit)
	if stopSec == nil {
		t.Fatal("jobq.service lacks TimeoutStopSec=SECONDS")
	}
	secs, _ := strconv.Atoi(stopSec[1])
	worst := shutdownTimeoutDefault(t) + 15*time.Second + 2*10*time.Second + 30*time.Second
	if time.Duration(secs)*time.Second < worst {
		t.Errorf("jobq.service: TimeoutStopSec=%d is shorter than a stop may take (%s)", secs, worst)
	}
	known := map[string]bool{}
	for _, cmd := range newApp(strings.NewReader(""), io.Discard, io.Discard).Commands {
		for _, f := range cmd.Flags {
			for _, n := range f.Names() {
				known[env(n)[0]] = true
			}
		}
	}
	for _, line := range strings.Split(unit, "\n") {
		for _, field := range strings.Fields(strings.TrimPrefix(line, "Environment=")) {
			if name, _, ok := strings.Cut(field, "="); ok && strings.HasPrefix(name, "JOBQ_") && !known[name] {
				t.Errorf("jobq.service sets %s, which no flag reads", name)
			}
		}
	}
}

// shutdownTimeoutDefault is jobq serve's --shutdown-timeout default.
func shutdownTimeoutDefault(t *testing.T) time.Duration {
	t.Helper()
	for _, cmd := range newApp(strings.NewReader(""), io.Discard, io.Discard).Commands {
		for _, f := range cmd.Flags {
			if d, ok := f.(*cli.DurationFlag); ok && cmd.Name == "serve" && d.Name == "shutdown-timeout" {
				return d.Value
			}
		}
	}
	t.Fatal("jobq serve has no --shutdown-timeout")
	return 0
}
