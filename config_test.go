package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestConfigArgs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "jobq.yaml")
	os.WriteFile(file, []byte(`
store-dir: /var/lib/jobq
workers: 8
demo: true
handler:
  - job.email.*=exec:./send.sh a,b
  - job.sms=log
timeout: 3s
`), 0o600)
	client := filepath.Join(dir, "client.yaml")
	os.WriteFile(client, []byte("server: nats://127.0.0.1:1\nheader:\n  - X-Team=ops\n"), 0o600)
	short := filepath.Join(dir, "short.yaml")
	os.WriteFile(short, []byte("s: nats://short:4222\n"), 0o600)
	both := filepath.Join(dir, "both.yaml")
	os.WriteFile(both, []byte("s: nats://a:4222\nserver: nats://b:4222\n"), 0o600)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("wokers: 8\n"), 0o600)
	badValues := map[string]string{"workers": "abc", "shutdown-timeout": "5", "no-ledger": "maybe"}
	for k, v := range badValues {
		os.WriteFile(filepath.Join(dir, k+".yaml"), []byte(k+": "+v+"\n"), 0o600)
	}
	literal := filepath.Join(dir, "literal.yaml")
	os.WriteFile(literal, []byte("token: 0123\npassword: 1e3\nuser: 1_000\n"), 0o600)
	null := filepath.Join(dir, "null.yaml")
	os.WriteFile(null, []byte("listen:\nworkers: ~\n"), 0o600)
	noListen := filepath.Join(dir, "no-listen.yaml")
	os.WriteFile(noListen, []byte("listen:\n"), 0o600)
	notYAML := filepath.Join(dir, "not.yaml")
	os.WriteFile(notYAML, []byte("a: [\n"), 0o600)
	app := newApp(strings.NewReader(""), io.Discard, io.Discard)
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    []string
		wantErr string
	}{
		{
			name: "serve takes its settings, after the command",
			args: []string{"jobq", "serve", "--config", file},
			want: []string{"jobq", "serve", "--demo=true", "--handler", "job.email.*=exec:./send.sh a,b", "--handler", "job.sms=log", "--store-dir", "/var/lib/jobq", "--workers", "8"},
		},
		{
			name: "flags on the command line win",
			args: []string{"jobq", "serve", "--workers", "2", "--handler", "job.x=log", "--config=" + file},
			want: []string{"jobq", "serve", "--demo=true", "--store-dir", "/var/lib/jobq", "--workers", "2", "--handler", "job.x=log"},
		},
		{
			name: "environment wins",
			args: []string{"jobq", "serve"},
			env:  map[string]string{"JOBQ_CONFIG": file, "JOBQ_WORKERS": "3", "JOBQ_STORE_DIR": "/data"},
			want: []string{"jobq", "serve", "--demo=true", "--handler", "job.email.*=exec:./send.sh a,b", "--handler", "job.sms=log"},
		},
		{
			name: "a client command skips serve's settings",
			args: []string{"jobq", "status", "--config", file, "--json"},
			want: []string{"jobq", "status", "--timeout", "3s", "--json"},
		},
		{
			name: "no config",
			args: []string{"jobq", "status"},
			want: []string{"jobq", "status"},
		},
		{name: "unknown setting", args: []string{"jobq", "serve", "--config", bad}, wantErr: `unknown setting "wokers"`},
		{name: "not yaml", args: []string{"jobq", "serve", "--config", notYAML}, wantErr: "config " + notYAML},
		{
			name: "a flag's short name on the command line wins too",
			args: []string{"jobq", "status", "--config", client, "-s", "nats://elsewhere:4222"},
			want: []string{"jobq", "status", "-s", "nats://elsewhere:4222"},
		},
		{
			name: "so does a repeatable flag's",
			args: []string{"jobq", "enqueue", "--config", client, "-H", "X-Team=dev", "job.x", "p"},
			want: []string{"jobq", "enqueue", "--server", "nats://127.0.0.1:1", "-H", "X-Team=dev", "job.x", "p"},
		},
		{
			name: "a key may be a flag's short name",
			args: []string{"jobq", "status", "--config", short},
			want: []string{"jobq", "status", "--s", "nats://short:4222"},
		},
		{
			name: "the environment wins over a short key too",
			args: []string{"jobq", "status", "--config", short},
			env:  map[string]string{"JOBQ_SERVER": "nats://env:4222"},
			want: []string{"jobq", "status"},
		},
		{name: "a key and its short name", args: []string{"jobq", "status", "--config", both}, wantErr: "s and server are one setting"},
		{name: "missing file", args: []string{"jobq", "serve", "--config", filepath.Join(dir, "none.yaml")}, wantErr: "none.yaml: no such file"},
		{name: "no file named", args: []string{"jobq", "serve", "--config"}, wantErr: "--config needs a file"},
		{name: "not a number", args: []string{"jobq", "serve", "--config", filepath.Join(dir, "workers.yaml")}, wantErr: "workers.yaml: workers: invalid value \"abc\": want a whole number"},
		{name: "a duration without its unit", args: []string{"jobq", "serve", "--config", filepath.Join(dir, "shutdown-timeout.yaml")}, wantErr: "shutdown-timeout.yaml: shutdown-timeout: invalid value \"5\": want a duration with its unit"},
		// Read as YAML numbers before: token 0123 became the octal 83, and
		// the server took a token its clients did not know.
		{
			name: "a value is the text as written",
			args: []string{"jobq", "status", "--config", literal},
			want: []string{"jobq", "status", "--password", "1e3", "--token", "0123", "--user", "1_000"},
		},
		// The flag parser ignores an empty variable for a number or a
		// duration: the file's value stands. It was dropped, and the
		// built-in default taken, which neither asked for.
		{
			name: "an empty variable wins only where the parser takes it",
			args: []string{"jobq", "serve", "--config", file},
			env:  map[string]string{"JOBQ_WORKERS": "", "JOBQ_STORE_DIR": "", "JOBQ_DEMO": ""},
			want: []string{"jobq", "serve", "--handler", "job.email.*=exec:./send.sh a,b", "--handler", "job.sms=log", "--workers", "8"},
		},
		// The parser takes an empty JOBQ_HANDLER as one empty route, bad
		// usage; with a config file it was ignored and the file's routes
		// ran, so the same variable was an error or nothing.
		{
			name: "an empty repeatable variable wins as the parser takes it",
			args: []string{"jobq", "serve", "--config", file},
			env:  map[string]string{"JOBQ_HANDLER": ""},
			want: []string{"jobq", "serve", "--demo=true", "--store-dir", "/var/lib/jobq", "--workers", "8"},
		},
		// A key with no value was dropped, silently: listen: meant the
		// default address, not none.
		{name: "no value is the empty one", args: []string{"jobq", "serve", "--config", noListen}, want: []string{"jobq", "serve", "--listen", ""}},
		{name: "no value for a number", args: []string{"jobq", "serve", "--config", null}, wantErr: `workers: invalid value "": want a whole number`},
		{name: "not a boolean", args: []string{"jobq", "serve", "--config", filepath.Join(dir, "no-ledger.yaml")}, wantErr: "no-ledger.yaml: no-ledger: invalid value \"maybe\": want true or false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
			got, err := configArgs(app, tt.args, lookup)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, %v; want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("got %q, %v\nwant %q", got, err, tt.want)
			}
		})
	}
}

// An empty JOBQ_HANDLER is one empty route, bad usage, whether or not a
// config file names handlers; with one, it was ignored, and serve ran the
// file's handlers.
func TestEmptyHandlerVariableIsBadUsageWithAConfigToo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "jobq.yaml")
	if err := os.WriteFile(file, []byte("handler: [job.x=log]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"serve", "--store-dir", filepath.Join(dir, "store"), "--listen", "127.0.0.1:0", "--http", ""},
		{"serve", "--config", file, "--store-dir", filepath.Join(dir, "store"), "--listen", "127.0.0.1:0", "--http", ""},
	} {
		r := runCmd(t, cmdInput{env: []string{"JOBQ_HANDLER="}, timeout: time.Minute}, jobqBin, args...)
		wantOneLineError(t, r, 2, `--handler ""`)
	}
}
