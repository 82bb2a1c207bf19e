package handlers_test

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/jobq/jobq/handlers"
)

func TestPermanent(t *testing.T) {
	t.Parallel()
	if err := handlers.Permanent(nil); err != nil {
		t.Errorf("Permanent(nil) = %v, want nil", err)
	}
	if handlers.IsPermanent(nil) {
		t.Errorf("IsPermanent(nil) = true, want false")
	}
	base := fmt.Errorf("open config: %w", fs.ErrNotExist)
	if handlers.IsPermanent(base) {
		t.Errorf("IsPermanent(%v) = true, want false", base)
	}
	perm := handlers.Permanent(base)
	wrapped := fmt.Errorf("job x: %w", perm)
	for _, err := range []error{perm, wrapped, handlers.Permanent(perm)} {
		if !handlers.IsPermanent(err) {
			t.Errorf("IsPermanent(%v) = false, want true", err)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("errors.Is(%v, fs.ErrNotExist) = false, want true", err)
		}
	}
	if got, want := perm.Error(), base.Error(); got != want {
		t.Errorf("Permanent(err).Error() = %q, want %q", got, want)
	}
	var xe *handlers.ExitError
	if err := fmt.Errorf("run: %w", handlers.Permanent(&handlers.ExitError{Code: 65})); !errors.As(err, &xe) || xe.Code != 65 {
		t.Errorf("errors.As(%v, *ExitError) = %v, want Code 65", err, xe)
	}
}

func TestExitErrorMessage(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 2000)
	tests := []struct {
		name string
		err  handlers.ExitError
		want string
	}{
		{"no stderr", handlers.ExitError{Code: 3}, "exit status 3"},
		{"blank stderr", handlers.ExitError{Code: 3, Stderr: " \n\t\n"}, "exit status 3"},
		{"one line", handlers.ExitError{Code: 75, Stderr: "try later\n"}, "exit status 75: try later"},
		{"lines joined", handlers.ExitError{Code: 1, Stderr: "warning: a\n\nerror: b\r\n"}, "exit status 1: warning: a; error: b"},
		{"control chars", handlers.ExitError{Code: 1, Stderr: "\x1b[31mred\x1b[0m"}, "exit status 1: [31mred [0m"},
		{"keeps last whole lines", handlers.ExitError{Code: 2, Stderr: long + "\nlast line\n"}, "exit status 2: last line"},
		{"cuts one long line", handlers.ExitError{Code: 2, Stderr: "first\n" + long}, "exit status 2: " + strings.Repeat("x", 512)},
		{"invalid utf8", handlers.ExitError{Code: 2, Stderr: "bad \xff byte"}, "exit status 2: bad \uFFFD byte"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
}
