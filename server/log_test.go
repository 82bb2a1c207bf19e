package server

import (
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

func TestLogAdapterReportsStoreErrors(t *testing.T) {
	var told string
	a := &logAdapter{log: zerolog.Nop(), storeError: func(msg string) { told = msg }}
	s := &Server{adapter: a}
	a.Errorf("JetStream failed to store a msg on stream '%s'", "JOB")
	if err := s.StoreErr(); err != nil || told != "" {
		t.Fatalf("after an ordinary error: got %v and %q, want nothing", err, told)
	}
	a.Errorf("Filestore [%s] Critical write error: %s", "JOB", "no space left on device")
	if err := s.StoreErr(); err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Errorf("StoreErr: got %v, want the critical write error", err)
	}
	if !strings.Contains(told, "Critical write error") {
		t.Errorf("OnStoreError was told %q, want the critical write error", told)
	}
	a.Fatalf("listen: %s", "address in use")
	if got := a.lastFatal(); got != "listen: address in use" {
		t.Errorf("lastFatal: got %q", got)
	}
}
