//go:build !unix

package server

import "os"

// lockDir is a no-op where flock is not available.
func lockDir(string) (*os.File, error) { return nil, nil }

func unlockDir(*os.File) {}

// StoreFree is a no-op where flock is not available.
func StoreFree(string) error { return nil }
