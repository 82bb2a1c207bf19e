// Package queue provisions jobq's JetStream objects and runs its producer,
// worker pool and dead-letter handling.
//
// It owns the stream JOB (work-queue retention, subjects job.>), the durable
// pull consumer WORKER, the ledger bucket processed and the dead-letter
// stream DLQ (see names.go), and the exactly-once protocol a worker follows
// for each job (see Pool). It bulk-imports jobs from NDJSON (Import) and
// counts what producers and workers do for Prometheus (Metrics,
// StatusCollector); a nil *Metrics counts nothing. An Observer
// (Config.Observer) is told how each job's attempt ended, for a live view
// such as the dashboard (package queue/dashboard).
//
// Invariants (DESIGN.md):
//  1. Nothing is lost: a job leaves JOB only when it is acked after its
//     completion or failure is recorded, or after a confirmed copy is in DLQ.
//     Jobs whose deliveries ran out without jobq seeing the last one are
//     found through the server's MAX_DELIVERIES advisory and a sweep.
//  2. Done means done: a job whose ledger record says done is acked without
//     running, whether redelivered or republished under the same ID.
//  3. One at a time: a handler runs only under a live claim in the ledger;
//     heartbeats renew it and reset the server's ack wait.
//  4. The honest boundary: a crash after a handler's effect and before its
//     completion is recorded runs the job again, with Job.Resumed set.
package queue
