// Package dashboard serves jobq's web page on jobq serve's --http address:
// queue depth (jobs in JOB, pending, ack pending), jobs in flight, completed,
// retried and dead-lettered counts, a throughput chart of the last 15
// minutes as inline SVG, the most recent jobs, the dead letters with a Retry
// button each, and a job lookup in the ledger.
//
// The page is server-rendered from embedded templates (templates/), with no
// external resource; it reloads itself, and everything but that reload works
// without JavaScript. A Recorder, set as the pool's queue.Config.Observer,
// keeps the counts, the throughput history and the recent jobs in memory.
//
// Invariants:
//   - GET never changes state; re-drives and removals are POSTs, rejected with 403
//     when a browser sent them from another origin (Sec-Fetch-Site, Origin,
//     Referer), and answered with a 303 back to the page.
//   - With an Auth enabled, every request must present it (401 otherwise);
//     secrets are compared in constant time and never logged.
package dashboard
