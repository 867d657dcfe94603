// Package oracle checks a simulated (or live) run against DESIGN §2 as it
// happens and measures how well the system served its traffic.
//
// # Invariants checked
//
//  1. Conformance: per key, a GCRA over the tokens admitted by all regions
//     (lease and strict paths) in true-time order: TAT ← max(TAT, t) +
//     cost/r; the stream conforms to (r, b) over every interval exactly when
//     TAT − t never exceeds b/r. Excess tokens (r·(TAT − t) − b) up to the
//     key's crash error ε so far — tokens crashed instances spent but never
//     reported, which reclaiming hands out again — are counted in their own
//     column; beyond ε they are violations. Tokens admitted by the
//     on_failure policies (degraded mode, the region's Redis unreachable)
//     and in shadow mode are reported separately and not part of the check.
//  2. Σ over regions of the rate each region's bucket may refill at ≤ r at
//     every instant the sum can change: whenever a bucket applies a grant,
//     whenever a grant expires (the region falls back to its static share)
//     and when a Redis comes back empty.
//  3. Σ over regions of the burst caps ≤ b, at the same instants.
//
// # Tolerances
//
// Invariant 1 is exact: tokens in integer nanotokens, times in
// nanoseconds, the key's float64 rate taken exactly (exact.go); the
// refill since the virtual bucket was last empty is rounded up to a whole
// nanotoken, so the check is lenient by under 1e-9 token over any run.
// Static shares and grants are float products: invariants 2 and 3 allow
// 1e-9 relative plus 1e-6 per region. The per-region checks of
// BucketObserved allow the tokens' storage rounding, 1e-6 per call.
//
// # Measures
//
// Every measure counts from the end of warmup: the 10 s and 60 s windows
// start at the first whole second after it (a 60 s window must fit
// whole before the end of the run to count), the tokens and the
// comparison with the ideal bucket from that second on. A measure with
// no data (no whole window) is NaN, and a target on it reads n/a: it
// neither passes nor fails.
//
// Utilization over 1 s and 60 s windows is Σ_keys min(admitted, ideal) /
// Σ_keys ideal with ideal = min(offered, r·window); an ideal centralized
// token bucket per key, fed the same arrivals at the same instants, gives
// the reference line. False rejects are tokens denied in a region while it
// admitted less than its weighted max-min fair share of the key over that
// second. Fairness error is |admitted − fair share| / (r·window) per region
// over 10 s windows in which a key was contended. Convergence is, after each
// demand shift of a contended key, the number of epochs until every
// region's refill rate is first at least min(fair share, demand) minus the
// tolerance (sampled every epoch, up to the horizon, 30 epochs or the
// convergence target if longer, or the key's next shift or the run's end
// if sooner: a shift not converged by then is superseded or unfinished,
// not a miss of the horizon); the share of later samples still within it
// is reported as Held. The tolerance is the larger of a fraction of the key's rate
// and three standard deviations of the allocator's one-epoch demand
// estimate under Poisson arrivals, 3·sqrt(α/(2−α)·d/epoch) for the
// allocator's demand EWMA weight α: small keys are not
// judged on noise. Reclaim time is from an instance crash until the
// region's view of every lease it held has expired: the next script call
// on the key then reaps it before reading the bucket.
//
// # Units
//
// Times are time.Duration since the start of the run; tokens and rates are
// float64 tokens and tokens per second.
//
// Not safe for concurrent use: calls must come in non-decreasing time
// order from one goroutine (the live mode serialises them).
package oracle
