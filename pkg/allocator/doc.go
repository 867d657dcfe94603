// Package allocator is the global tier's daemon around the pure allocator of
// package hierarchy: the gRPC AllocatorService that region leaders Sync
// with, leader election in etcd, the allocation loop, config hot reload,
// metrics, and the Client regions use to reach whichever replica leads.
//
// # Invariants
//
//   - At most one replica grants at any instant. A replica answers Sync as
//     leader only while it holds the etcd election and the lease under its
//     election key was confirmed alive recently: every refresh of the lease
//     is timed from when it was sent, and a replica stops granting at
//     sent + TTL/2 of its newest confirmed refresh. etcd cannot expire the
//     lease (and so cannot let another replica win) before sent + TTL, so a
//     replica cut off from etcd stops granting half a TTL before any other
//     replica can start. Losing the session (Session.Done) ends leadership
//     at once too.
//   - A replica that (re)gains leadership starts in learning mode for at
//     least one grant validity (hierarchy.Allocator.BecomeLeader): grants
//     issued by the previous leader are re-issued as held, never added to.
//     When the config changes the epoch or the grant validity the allocator
//     is rebuilt, and learning lasts until grants issued under the old
//     validity have expired.
//   - A Sync is validated completely before anything changes (DESIGN
//     invariant 6): a report naming an unconfigured region, an invalid or
//     unresolvable key, a duplicate key, or a negative or non-finite number
//     is answered InvalidArgument with a message naming the field, and the
//     allocator is left exactly as it was.
//   - (region, seq) idempotency is the allocator's: a retry gets the same
//     answer; an older seq is refused with Aborted.
//   - No etcd read runs under the allocator's lock: the configs of
//     revisions regions report that this replica never held, and at its
//     election those committed before its live one, are read back by one
//     background goroutine, each read bounded (history.go); until one
//     lands, reserves follow the configs held (docs/architecture.md,
//     "Static shares that change: make before break").
//
// # Units
//
// Rates are tokens per second and bursts tokens (float64); durations on the
// wire are milliseconds, grant validities are measured by the region from
// when it sent its report. Metric durations are seconds.
//
// # Errors and status codes
//
// Bad input is InvalidArgument; a replica that does not lead answers
// FailedPrecondition with the message "not leader; leader=HOST:PORT" (the
// leader's advertised gRPC address, empty when unknown); a report older
// than the region's last one is Aborted.
package allocator
