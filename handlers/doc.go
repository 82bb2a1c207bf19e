// Package handlers owns what runs a job: the Handler interface, HandlerFunc,
// Middleware, the subject Router and the built-in handlers Log, Exec and HTTP,
// with ParseSpec and ParseRoute for the --handler SUBJECT=SPEC flag.
//
// It imports only the standard library, zerolog and data, never NATS, so a
// handler test needs no server.
//
// # The handler contract
//
// A Handler gets a *data.Job and returns an error that decides the job's fate:
//
//   - nil: the job is done. Its completion is recorded and it is never handed
//     to a handler again.
//   - an error: the attempt failed. The job is retried until the consumer's
//     max deliver is reached, then dead-lettered with this error.
//   - Permanent(err): retrying will not help. The job is dead-lettered at once.
//     IsPermanent reports this through any wrapping.
//
// The ctx a handler gets ends when the worker shuts down past its shutdown
// timeout. A handler returns soon after ctx ends, with an error that wraps
// ctx.Err(); that attempt counts as cut off and the job is released for
// redelivery, not dead-lettered. A job may run more than once (see
// data.Job.Resumed), so handlers should be idempotent, keyed by data.Job.ID.
//
// # Routing
//
// A Router maps NATS subject patterns to handlers: tokens are separated by
// '.', '*' matches one token and '>' matches one or more trailing tokens. The
// most specific pattern wins, compared token by token from the left: a literal
// beats '*', which beats '>'. A job whose subject matches no pattern fails
// with ErrNoRoute, permanently.
//
// # Exec
//
// Exec runs "sh -c -- COMMAND" with the payload on stdin and JOBQ_JOB_ID,
// JOBQ_SUBJECT, JOBQ_ATTEMPT, JOBQ_SEQ and JOBQ_RESUMED ("1" or "0") in its
// environment. Its exit status decides:
//
//   - 0: done;
//   - ExitPermanent (65, EX_DATAERR from sysexits.h): permanent failure;
//   - any other status, ExitRetry (75, EX_TEMPFAIL) recommended: retry.
//
// Failures are *ExitError values carrying the status and the tail of stderr.
// A process killed by a signal reports 128 plus the signal number, as sh does.
// When ctx ends, the command's whole process group gets SIGTERM, then SIGKILL
// 5 seconds later if any of it is left, though the command's own sh ended at
// once.
//
// # HTTP
//
// HTTP POSTs the payload to a URL with the job in X-Jobq-* headers. The
// response status decides:
//
//   - 2xx: done;
//   - 4xx except 408 and 429: permanent failure;
//   - anything else (3xx, 408, 429, 5xx, transport errors, timeouts): retry.
package handlers
