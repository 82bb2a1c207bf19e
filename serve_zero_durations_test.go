package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// --ack-wait is "min 1s" and --processed-ttl is "how long a ledger record
// lives": an explicit 0 is under both minimums, as --ack-wait 10ms is, and
// is refused like its siblings --dedupe-window 0, --max-deliver 0 and
// --workers 0 (exit 2). It was taken for "not set": serve started with the
// 60s ack wait and the 168h TTL, silently, from the flag and from
// JOBQ_ACK_WAIT / JOBQ_PROCESSED_TTL alike.
func TestServeRefusesAnExplicitZeroAckWaitOrProcessedTTL(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{name: "ack wait flag", args: []string{"--ack-wait", "0s"}, want: "--ack-wait 0s"},
		{name: "ack wait env", env: []string{"JOBQ_ACK_WAIT=0s"}, want: "--ack-wait 0s"},
		{name: "processed ttl flag", args: []string{"--processed-ttl", "0"}, want: "--processed-ttl 0s"},
		{name: "processed ttl env", env: []string{"JOBQ_PROCESSED_TTL=0s"}, want: "--processed-ttl 0s"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := filepath.Join(t.TempDir(), "store")
			args := append([]string{"serve", "--store-dir", store, "--listen", "", "--http", ""}, tt.args...)
			r := runCmd(t, cmdInput{env: tt.env, timeout: 10 * time.Second}, jobqBin, args...)
			wantOneLineError(t, r, 2, tt.want)
			if _, err := os.Stat(store); err == nil {
				t.Errorf("bad usage created the store dir %s", store)
			}
		})
	}
}
