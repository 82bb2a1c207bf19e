package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stallInfoProxy forwards TCP to target, and from the moment the server
// sends a message holding marker (the job's delivery), drops the client's
// look-ups of JOB (STREAM.INFO.JOB): they go unanswered, the connection up.
func stallInfoProxy(t *testing.T, target, marker string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var stall atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Go(func() {
				defer s.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 && !(stall.Load() && bytes.Contains(buf[:n], []byte("$JS.API.STREAM.INFO.JOB"))) {
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						if bytes.Contains(buf[:n], []byte(marker)) {
							stall.Store(true)
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "nats://" + ln.Addr().String()
}

// jobq next shows its job and records it done; its look-ups of JOB before
// the ack go unanswered (three tries, up to ten seconds), and the user hits
// Ctrl-C meanwhile. jobq next says that the job ran and was not
// acknowledged. Before, it said that the job was handed back unshown: any
// error after a signal was taken for one the signal caused.
func TestNextInterruptedWhileItsAckWaitsForItsLookUpSaysWhatHappened(t *testing.T) {
	t.Parallel()
	s := startServe(t, serveOpts{})
	s.enqueue(t, "job.next", "MARKER-sig-1", "sig-1")
	url := stallInfoProxy(t, strings.TrimPrefix(s.url, "nats://"), "MARKER-sig-1")
	cmd := exec.Command(jobqBin, "next", "--server", url)
	cmd.Env = subprocessEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	shown := make(chan string, 1)
	go func() {
		var out strings.Builder
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "MARKER-sig-1") {
				shown <- out.String()
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case out := <-shown:
		t.Logf("jobq next showed:\n%s", out)
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("jobq next did not show its job")
	}
	time.Sleep(2 * time.Second) // its ack waits for a look-up of JOB
	cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("jobq next still running 30s after Ctrl-C")
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("jobq next: %v, want exit status 1; stderr: %s", err, stderr.String())
	}
	if rec, ok := s.record(t, "sig-1"); !ok || rec.State != "done" {
		t.Fatalf("job sig-1: record %+v (found %v), want done", rec, ok)
	}
	if strings.Contains(stderr.String(), "handed back unshown") || !strings.Contains(stderr.String(), "not acknowledged") {
		t.Errorf("jobq next, interrupted after it showed job sig-1 and recorded it done, its ack held back, says:\n%s\nwant it to say the job ran and was not acknowledged, not that it was handed back unshown", stderr.String())
	}
}
