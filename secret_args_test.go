package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/jobq/jobq/server/servertest"
)

// A secret given where the name of its file belongs (an nkey seed to
// --nkey-seed, a PEM private key to --tls-key, as a container's variable
// may hold one), or a seed given to serve's --nkey, which takes the public
// key, is bad usage and is not shown: the messages quoted the value, and
// the seed or key went to the terminal or the service's log.
func TestSecretsGivenForFileNamesAreNotShown(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	seed := string(raw)
	dir := t.TempDir()
	cert, keyFile := servertest.SelfSignedCert(t, dir)
	rawKey, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	key := string(rawKey)
	serve := []string{"serve", "--store-dir", filepath.Join(dir, "store"), "--listen", "127.0.0.1:0", "--http", ""}
	tests := []struct {
		name   string
		env    []string
		args   []string
		secret string
		want   string
	}{
		{name: "seed as a client's --nkey-seed", args: []string{"status", "--server", "nats://127.0.0.1:1", "--nkey-seed", seed}, secret: seed, want: "--nkey-seed"},
		{name: "seed as JOBQ_NKEY_SEED", env: []string{"JOBQ_NKEY_SEED=" + seed}, args: []string{"enqueue", "--server", "nats://127.0.0.1:1", "job.x", "x"}, secret: seed, want: "--nkey-seed"},
		{name: "seed as serve --server's --nkey-seed", args: slices.Concat(serve, []string{"--server", "nats://127.0.0.1:1", "--nkey-seed", seed}), secret: seed, want: "--nkey-seed"},
		{name: "seed cut short as --nkey-seed", args: []string{"status", "--server", "nats://127.0.0.1:1", "--nkey-seed", seed[:50]}, secret: seed[:50], want: "--nkey-seed"},
		{name: "seed as serve's --nkey", args: slices.Concat(serve, []string{"--nkey", seed}), secret: seed, want: "--nkey"},
		{name: "key as JOBQ_TLS_KEY", env: []string{"JOBQ_TLS_KEY=" + key}, args: slices.Concat(serve, []string{"--tls-cert", cert}), secret: key, want: "--tls-key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCmd(t, cmdInput{env: tt.env, timeout: 30 * time.Second}, jobqBin, tt.args...)
			wantOneLineError(t, r, 2, tt.want)
			// Any line of the secret (a PEM key's are 64 characters),
			// or a part of one, gives it away.
			for _, line := range strings.Fields(tt.secret) {
				if len(line) >= 16 && strings.Contains(r.stderr, line[len(line)-16:]) {
					t.Errorf("stderr %q shows the secret", r.stderr)
					break
				}
			}
		})
	}
}
