// Package luascripts holds the Lua scripts that are the only writers of a
// region's Redis state, typed Go wrappers that run them, and Model, a pure
// Go twin of the same maths.
//
// # State
//
// Every quota key owns a bucket hash, which holds its lease records too
// (one field per instance), and while it has more than a few leases a
// sorted set of their expiries; both share one hash tag (so scripts run on
// Redis Cluster). Older scripts kept the records in a lease hash of their
// own, which the first call that loads such a key moves into the bucket.
// lua/lib.lua documents every field.
//
// # Invariants
//
//   - Redis TIME is the only clock (microseconds). The Go side never passes
//     a time in; the regional service converts durations to Redis time with
//     the now_us every reply carries.
//   - A script acts on the settings its caller chose (the static share or
//     floor, a grant) only up to Common.DeadlineUS, the end of the bound
//     the caller chose them for: one that runs later (it waited in a
//     paused or overloaded Redis) changes nothing and answers
//     ErrTooLate (the Model: TooLate), as if Redis had not answered.
//   - Tokens in the bucket plus unspent tokens out in live leases never
//     exceed the region's current burst cap (DESIGN invariant 3).
//   - Tokens appear only by refill at the current rate over elapsed time
//     (the granted rate while a grant is valid, the static share after) or
//     by reclaiming a lease's unspent tokens; a bucket recreated after a
//     Redis restart is not handed a free burst: every script reads the
//     born sentinel of the key's data set (Keys.Born: one per Redis, one
//     per hash slot on a cluster) in the call that creates a bucket, and
//     writes it when it is missing (Common.RestartWait); nor is a bucket
//     of a data set that went back in time (an older snapshot restored, a
//     lagging replica promoted): its write generation (Keys.Gen) is below
//     the one the caller passes (Generations), and the call re-births the
//     data set, so buckets written before the new birth start empty.
//   - Calls that can only undo (release, reap, a report of an unknown
//     lease asking for nothing) create no bucket and no lease record.
//   - A usage report is applied at most once per (instance, key, seq).
//   - Every key carries a TTL of at least the grant's remaining validity
//     plus 2 x cap / static rate, and at least 2 x lease TTL, so idle keys
//     disappear but never reset early.
//   - Scripts are O(1) plus reaping bounded by Common.ReapBudget.
//   - Floats are stored with '%.6f'; integers with '%.0f'.
//
// # Units
//
// Tokens are float64 inside the bucket and whole int64 tokens in leases;
// rates are tokens per second; Redis times are int64 microseconds; TTLs and
// waits are milliseconds on the wire and time.Duration in Go.
//
// # The twin
//
// Model implements the same operations on an in-memory map with an explicit
// now. A differential test drives random operation sequences through both
// against a real redis-server and requires identical replies and state. The
// simulator runs Model on virtual time.
package luascripts
