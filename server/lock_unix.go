//go:build unix

package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockFile is the file in the store dir that one jobq at a time holds.
const lockFile = "jobq.lock"

// lockDir takes an exclusive, non-blocking flock on dir's lock file. The
// kernel drops the lock when the process dies, so a SIGKILL never leaves a
// stale lock behind.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open store lock: %w; pass a writable --store-dir", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s; stop it or pass another --store-dir", ErrStoreLocked, dir)
		}
		return nil, fmt.Errorf("lock store dir %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		fmt.Fprintf(f, "%d\n", os.Getpid())
	}
	return f, nil
}

func unlockDir(f *os.File) {
	if f == nil {
		return
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	f.Close()
}

// StoreFree returns ErrStoreLocked, as Start would, if another process
// holds storeDir: so a second jobq on one store says so before anything
// else it binds (its --http address, say, the same as the first one's)
// fails first. Anything else is left for Start to report.
func StoreFree(storeDir string) error {
	dir, err := filepath.Abs(storeDir)
	if err != nil {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR, 0)
	if err != nil {
		return nil // no lock file: nobody holds it
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("%w: %s; stop it or pass another --store-dir", ErrStoreLocked, dir)
		}
		return nil
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return nil
}
