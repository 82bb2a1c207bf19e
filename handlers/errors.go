package handlers

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrNoRoute is returned, wrapped with the subject and marked Permanent, by
// Router.Process for a job whose subject matches no registered pattern.
var ErrNoRoute = errors.New("no handler for subject")

// Permanent marks err as not worth retrying: the job is dead-lettered at once.
// Permanent(nil) is nil. errors.Is and errors.As see through the mark, and the
// message is err's.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	if p, ok := err.(*permanentError); ok {
		return p
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was marked by
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// permanentError is the mark that Permanent puts on an error.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// ExitError reports that an Exec command exited with a non-zero status.
type ExitError struct {
	// Code is the exit status, or 128 plus the signal number when a signal
	// ended the command.
	Code int
	// Stderr is the tail of what the command wrote to stderr, at most 4 KiB.
	Stderr string

	err error // the *exec.ExitError, if any
}

// exitErrorTail bounds how much of Stderr ExitError.Error shows.
const exitErrorTail = 512

// Error returns "exit status N", followed by the last lines of stderr, at most
// 512 bytes of them, trimmed and joined with "; ".
func (e *ExitError) Error() string {
	msg := "exit status " + strconv.Itoa(e.Code)
	if t := stderrSummary(e.Stderr, exitErrorTail); t != "" {
		msg += ": " + t
	}
	return msg
}

// Unwrap returns the *exec.ExitError the command ended with, if any.
func (e *ExitError) Unwrap() error { return e.err }

// stderrSummary returns the last lines of s as one line of at most limit
// bytes: lines trimmed, blank ones dropped, control characters made spaces,
// joined with "; ". A last line longer than limit keeps its end.
func stderrSummary(s string, limit int) string {
	lines := strings.Split(strings.ToValidUTF8(s, "\uFFFD"), "\n")
	var keep []string
	n := 0 // bytes of keep once joined
	for i := len(lines) - 1; i >= 0; i-- {
		line := strings.TrimSpace(strings.Map(controlToSpace, lines[i]))
		if line == "" {
			continue
		}
		if len(keep) == 0 && len(line) > limit {
			line = line[len(line)-limit:]
			for len(line) > 0 && !utf8.RuneStart(line[0]) {
				line = line[1:]
			}
			line = strings.TrimSpace(line)
		}
		add := len(line)
		if len(keep) > 0 {
			add += len("; ")
		}
		if n+add > limit {
			break
		}
		n += add
		keep = append(keep, line)
	}
	slices.Reverse(keep)
	return strings.Join(keep, "; ")
}

// controlToSpace maps control characters to a space, for strings.Map.
func controlToSpace(r rune) rune {
	if r < 0x20 || r == 0x7f {
		return ' '
	}
	return r
}
