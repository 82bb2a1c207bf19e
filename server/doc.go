// Package server runs the embedded NATS JetStream server that jobq stores its
// jobs in.
//
// It owns the nats-server options, start-up until the server accepts
// connections, the in-process client connection the rest of jobq uses, the
// lock that keeps a second jobq off the same store directory, the adapter that
// sends nats-server's log lines to zerolog, and an orderly shutdown.
//
// Invariants:
//   - Start returns only once the server is ready for connections, or an error.
//   - StoreDir is never empty (nats-server would silently use a temp dir), and
//     while a Server runs it holds an exclusive lock on StoreDir.
//   - Listening on a non-loopback address needs authentication or an explicit
//     Insecure.
//   - Shutdown waits until the server has stopped and its files are closed.
//
// Only this package imports nats-server.
package server
