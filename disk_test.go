package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDiskFull fills the disk under a running jobq serve: a small tmpfs,
// mounted by the test, so it needs root (CI runs as root). It checks that
// the producer gets a clear error, that serve stops with exit status 1 and
// says why (nats-server refuses writes to a stream after a failed write
// until it restarts), and that after space is freed a restart recovers with
// nothing lost. The same refusal without a full disk, through the store's
// byte limit, is tested in queue (TestFullStoreRefusesNewJobsAndKeepsStoredOnes).
func TestDiskFull(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs; the byte-limit variant runs in queue")
	}
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(disk, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", disk).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s); the byte-limit variant runs in queue", err, out)
	}
	// Registered before the server, so it runs after the server stopped.
	t.Cleanup(func() {
		for range 50 {
			if exec.Command("umount", disk).Run() == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("umount %s failed", disk)
	})
	opts := serveOpts{dir: filepath.Join(disk, "store"), args: []string{"--handler", "job.>=exec:cat > /dev/null", "--log-level", "info"}}
	srv := startServe(t, opts)
	srv.enqueue(t, "job.disk", "stored before", "before-full")
	srv.waitState(t, "before-full", "done")
	srv.enqueue(t, "job.disk", "pending", "pending-1", "-H", "x=y")
	// Its run, its record and its ack are stored before the disk fills:
	// a write of theirs that met the full disk stopped serve before the
	// enqueue below could reach it (seen once in .ci/run), and its ack,
	// lost so, left it in JOB until its ack wait ran out after the
	// restart.
	srv.waitState(t, "pending-1", "done")
	checkFor(t, waitTimeout, 50*time.Millisecond, func() error {
		if n := srv.status(t).Stream.Messages; n != 0 {
			return fmt.Errorf("JOB holds %d jobs, want pending-1 acked", n)
		}
		return nil
	})

	filler := filepath.Join(disk, "filler")
	fill(t, filler)
	big := strings.Repeat("x", 64<<10)
	r := srv.jobq(t, "enqueue", "job.disk", big, "--id", "while-full", "--timeout", "1s")
	wantOneLineError(t, r, 1, "while-full", "store may be full")

	// serve notices the failed write and stops, saying why.
	select {
	case <-srv.done:
	case <-time.After(waitTimeout):
		t.Fatalf("jobq serve still running %s after the store failed a write", waitTimeout)
	}
	srv.ended = true
	if code := srv.state.ExitCode(); code != 1 {
		t.Errorf("jobq serve after a failed store write: got exit status %d, want 1", code)
	}
	if log := srv.logText(); !strings.Contains(log, "store write failed") || !strings.Contains(log, "no space left on device") {
		t.Errorf("jobq serve log does not say the store write failed:\n%s", srv.logTail(20))
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	srv = startServe(t, opts)
	srv.waitState(t, "pending-1", "done") // done before, and kept
	srv.enqueue(t, "job.disk", big, "after-full")
	srv.waitState(t, "after-full", "done")
	if rec, ok := srv.record(t, "before-full"); !ok || rec.State != "done" || rec.Attempts != 1 {
		t.Errorf("before-full after the restart: got %+v, want done once", rec)
	}
	if st := srv.status(t); st.Stream.Messages != 0 || st.DLQ.Messages != 0 {
		t.Errorf("after recovery: JOB %d, DLQ %d; want 0 and 0", st.Stream.Messages, st.DLQ.Messages)
	}
}

// fill writes path until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill the disk: %v", err)
			}
			break
		}
	}
	// Small writes take what the big ones left.
	for {
		if _, err := f.Write(chunk[:512]); err != nil {
			break
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(path), &st); err == nil && st.Bavail != 0 {
		t.Logf("%s", fmt.Sprintf("disk not full: %d blocks left", st.Bavail))
	}
}
