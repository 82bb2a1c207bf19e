// Package data holds jobq's job and ledger types and the ledger itself.
//
// A Job is what a handler sees; a Record is a job's entry in the processed
// bucket, keyed by Key(job ID). The types live in files without NATS imports;
// Ledger is the one type here that talks to JetStream.
//
// A job's state machine, as its ledger record shows it (no record: pending):
//
//	            claim (create)             handler ok: Done
//	pending ──────────────────► running ─────────────────────► done
//	   ▲                         │  ▲ │                         (final while the
//	   │                         │  │ │ handler failed, or       record lives)
//	   │ dlq retry               │  │ │ shutdown cut it off:
//	   │                         │  │ ▼ Retry
//	   │                         │  retrying
//	   │                         │     (claimed again on redelivery)
//	   │     last attempt failed,│
//	   │     or permanent: Fail  ▼
//	   └──────────────────────  failed (in the DLQ stream with its last error)
//
// A running claim carries a lease. A worker that dies leaves the lease to
// lapse; the next delivery takes the claim over and marks the attempt
// Resumed, since the dead worker may have had effects.
//
// A job that failed for good is first recorded retrying, awaiting its dead
// letter (AwaitingDeadLetter), with a compare-and-set on its claim; only
// then is its dead letter stored, and the record made failed. So a holder
// whose claim was taken over stores no dead letter, and a delivery in
// between is dead-lettered without running (ErrAwaitingDeadLetter).
//
// Invariants the Ledger keeps:
//   - At most one live claim per job ID: claims are creates or
//     compare-and-sets on the record's revision.
//   - A done record is never replaced by a claim: Claim returns
//     ErrAlreadyDone.
//   - A holder whose claim was taken over cannot write: its compare-and-set
//     fails with ErrClaimLost.
package data
