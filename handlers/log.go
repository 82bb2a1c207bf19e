package handlers

import (
	"context"
	"errors"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/jobq/jobq/data"
)

// logPayloadMax bounds how much of the payload Log writes.
const logPayloadMax = 256

// Log returns a Handler that logs each job at info with the message
// "job processed" and the fields job_id, subject, seq, attempt, resumed,
// payload_bytes and payload, the payload as a string cut to its first 256
// bytes. It always returns nil.
func Log(log zerolog.Logger) Handler { return &logHandler{log: log} }

type logHandler struct{ log zerolog.Logger }

// Process logs job.
func (h *logHandler) Process(_ context.Context, job *data.Job) error {
	if job == nil {
		return Permanent(errors.New("log: nil job"))
	}
	h.log.Info().
		Str("job_id", job.ID).
		Str("subject", job.Subject).
		Uint64("seq", job.Seq).
		Int("attempt", job.Attempt).
		Bool("resumed", job.Resumed).
		Int("payload_bytes", len(job.Payload)).
		Str("payload", truncate(job.Payload, logPayloadMax)).
		Msg("job processed")
	return nil
}

// truncate returns b as a string cut to at most limit bytes, not splitting a
// UTF-8 sequence that starts within the limit.
func truncate[T ~string | ~[]byte](b T, limit int) string {
	if len(b) <= limit {
		return string(b)
	}
	cut := limit
	for i := limit; i > limit-utf8.UTFMax && i > 0; i-- {
		if utf8.RuneStart(b[i]) {
			cut = i
			break
		}
	}
	return string(b[:cut])
}
