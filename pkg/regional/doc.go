// Package regional is the regional tier: the gRPC LeaseService that hands
// token leases to application instances out of the region's Redis, the
// guard that notices a Redis that restarted empty, and the bookkeeping the
// region leader reports to the global tier.
//
// # Invariants
//
//   - Every RPC input is validated before Redis is touched: a request that
//     fails validation changes nothing (DESIGN invariant 6) and is answered
//     InvalidArgument with a message that names the field.
//   - Redis state is changed only by the scripts of package luascripts;
//     this package never reads a clock for bucket maths.
//   - The static share is a lease (static.go): the region leader stores its
//     end in Redis ({static}:lease) from the global tier's answers; every
//     replica hands its scripts the static share only while its estimate
//     of Redis time (its last TIME reading plus the local time elapsed
//     since it sent that read, an upper bound) is a margin before that
//     end, else each key's floor. Options.Unleased, for a region with no
//     global tier, keeps static shares unconditional.
//   - A region that comes back from its floor (a lease conferred again
//     after it ended, a drain lifted) hands its scripts when (the rise,
//     {static}:lease:rise per shard, and each replica's own notice) with
//     the key's floor, so a bucket idle across the floor, or born after
//     it, is credited at most the floor before the rise: the global tier
//     may have given the rest of the share to other regions meanwhile.
//   - A script handed the static share acts on it only until its
//     deadline, the end of the static lease it was chosen under
//     (regionsync.ScriptDeadline). One that ran later, queued in a paused
//     Redis, changed nothing, and the caller is answered Unavailable as
//     for a Redis that did not answer. The floor needs no deadline.
//   - A bucket created after Redis (or one cluster node) lost its data is
//     not handed a free burst: the scripts read the born sentinel of the
//     bucket's data set in the call that creates it (writing it when it is
//     missing) and refill new buckets only from born + the restart wait;
//     RestartGuard stamps missing sentinels at start and every epoch and
//     counts the losses (see luascripts). A data set that went back in
//     time (an older snapshot restored, a lagging replica promoted) is
//     found by its write generation, below the highest this process saw,
//     and re-birthed in the call that finds it: its older buckets start
//     empty as after a loss (luascripts.Generations).
//
// # Units
//
// Tokens are whole int64 tokens on the wire, rates tokens per second,
// durations milliseconds on the wire.
//
// # Errors
//
// Bad input maps to codes.InvalidArgument, an unreachable or failing Redis
// to codes.Unavailable, an expired context to DeadlineExceeded or Canceled.
// Over quota is never an error: it is a Grant with granted 0 or a
// CheckResponse with allowed false.
package regional
