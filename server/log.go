package server

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/rs/zerolog"
)

// logAdapter sends nats-server's log lines to zerolog. nats-server formats
// its own messages, so the formatted text is the message.
// Its last fatal message is kept so Start can report why the server stopped.
type logAdapter struct {
	log   zerolog.Logger
	fatal atomic.Pointer[string]
	// storeError, if set, is told of a critical store write error.
	storeError func(msg string)
	// lastStoreError is the last critical store write error, if any.
	lastStoreError atomic.Pointer[string]
}

// Noticef lines (the start-up banner, "Server is ready") go to debug: jobq
// logs its own lifecycle at info.
func (a *logAdapter) Noticef(format string, v ...any) { a.log.Debug().Msg(fmt.Sprintf(format, v...)) }
func (a *logAdapter) Warnf(format string, v ...any)   { a.log.Warn().Msg(fmt.Sprintf(format, v...)) }
func (a *logAdapter) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	a.log.Error().Msg(msg)
	if strings.Contains(msg, "Critical write error") {
		a.lastStoreError.Store(&msg)
		if a.storeError != nil {
			a.storeError(msg)
		}
	}
}
func (a *logAdapter) Debugf(format string, v ...any) { a.log.Debug().Msg(fmt.Sprintf(format, v...)) }
func (a *logAdapter) Tracef(format string, v ...any) { a.log.Trace().Msg(fmt.Sprintf(format, v...)) }

// Fatalf is logged as an error: nats-server calls it for conditions it then
// handles by shutting down, and jobq must run its own defers.
func (a *logAdapter) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	a.fatal.Store(&msg)
	a.log.Error().Msg(msg)
}

// lastFatal returns the last fatal message, or "".
func (a *logAdapter) lastFatal() string {
	if p := a.fatal.Load(); p != nil {
		return *p
	}
	return ""
}
