// Package memlisten is a net.Listener whose connections live in memory:
// only code holding the Listener can dial it, so a process can serve
// itself (the regional daemon's in-process LeaseService, see
// docs/architecture.md) without a socket any other process could reach.
//
// Invariant:
//   - Dial hands one end of a fresh in-memory connection (net.Pipe:
//     synchronous, unbuffered, deadlines honoured) to exactly one Accept
//     and returns the other end. It waits until an Accept takes it, its
//     context ends (ctx.Err()) or the listener closes (ErrClosed); when it
//     fails it closes both ends it made.
//   - Close is idempotent and never blocks. An Accept or Dial that begins
//     after Close has returned fails with ErrClosed, which matches
//     net.ErrClosed; one pending when Close is called returns at once,
//     with ErrClosed or with the connection it was being handed at that
//     instant. Close does not close connections already handed over:
//     their owners do, as with a socket listener.
//   - Neither the listener nor its connections start goroutines, so
//     nothing outlives Close and the connections' own Close.
package memlisten
