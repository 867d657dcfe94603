// Package hierarchy is the global tier's pure core: it divides each
// contended key's global rate r and burst b among regions and hands out
// grants that never oversubscribe them. It does no I/O and never reads the
// clock: every method takes now.
//
// # Units
//
// Rates are tokens per second, bursts and holdings tokens (float64).
// Durations are time.Duration; grant validities are whole milliseconds so
// they survive the wire's millisecond fields exactly.
//
// # API
//
//	WaterFill(rate, regions, demand, out) error   weighted max-min with floors and ceilings
//	StaticShares(total, regions, out)              s_r = total·w_r/Σw
//	ValidateRegions(regions) error
//	NewAllocator(opts, now) (*Allocator, error)    starts in learning mode
//	(*Allocator).SetLimit(key, limit) error / RemoveKey(key) / SetRegions(regions) error
//	(*Allocator).Report(now, report) (Answer, error)  grants and the static lease conferred
//	(*Allocator).Allocate(now)                     once per epoch
//	(*Allocator).BecomeLeader(now, lapsed...)      on (re)gaining leadership, with the durable lapsed set
//	(*Allocator).PendingLapses(now) / LapseDurable(now, region) / LapsedSet()
//	Floor(staticRate, staticBurst, share, unit)    what a region runs on without a static lease
//	(*Allocator).Learning(now) bool / Epoch() uint64 / View(now) View
//
// # Allocation
//
// WaterFill divides r by weighted max-min fairness over the regions'
// demands, with per-region floors and ceilings (MinShare, MaxShare as
// fractions of r). Capacity nobody demands is water-filled by weight into
// the room below the ceilings, so none is left unassigned.
//
// Bursts are split in proportion to the rate allocation: b_r = b·a_r/r.
// Every region's bucket then refills in the same time b/r as the global
// one, and Σb_r <= b whenever Σa_r <= r.
//
// Demand is an EWMA of (admitted+denied)/window per (key, region): a
// region's tokens over the window since its previous report, or its own
// rate reading times the window (the regional service reads demand as the
// sum of its instances' rates; see KeyDemand). The weight of one report is
// 1-(1-α)^(window/Epoch) (α = Options.DemandAlpha, default 0.5; the
// config's default is 1); a report that does not mention a key counts as a
// zero observation, so the demand of an idle region decays. A window
// shorter than half an Epoch is no observation: such a report leaves the
// estimate as it was, which lets a region acknowledge a grant at once
// without a demand reading.
//
// A key is contended when some reporting region's demand exceeds its
// static share. Only then does it get targets from the water-fill, with
// silent regions (no report for SilenceTimeout) frozen at what they may be
// using: max(their grant, s_r). Allocate decides contention and computes
// the targets once per epoch; in between, a report whose demand for a key
// exceeds the region's static share makes the key contended at once (one
// whose grants are winding down to the static shares too), and a
// region's report recomputes the targets of the contended keys it names
// from the newest estimates (and the regions heard from since) before
// answering, so a new hot key or a demand shift moves grants without
// waiting for the next Allocate. Targets only choose among safe grants:
// the fencing below never depends on them. A key that stops being
// contended gets grants at the static shares until no region may hold
// anything else, then none: control-plane work grows with contended keys
// only.
//
// An answer whose grant for some key falls short of its target, by more
// than pendingShortfall of the key's rate and more than three standard
// deviations of one epoch's Poisson demand reading, because other regions
// have yet to acknowledge smaller grants, makes ReportAgain return a third
// of an epoch: the donors report within an epoch and acknowledge at once,
// so the recipient's early report gets most of the rest. Smaller
// shortfalls are noise and wait for the next epoch, which keeps these
// early reports out of steady state.
//
// # The invariant
//
// At every instant and for every key, Σ_r (rate region r may refill at)
// <= r, where a region may refill at the rate of the newest grant it
// received while that grant is unexpired on its own clock (expiry = send
// time of the report it answered + Valid), else at s_r while it holds a
// static lease (see lapse.go), else at its floor. The same holds for burst
// caps: Σ_r cap_r <= b, and with the tokens released by lowered caps that
// are in flight to another region's bucket (the burst transfer,
// transfer.go): Σ_r cap_r + in flight <= b. All up to float rounding.
//
// It holds under message loss, duplication, reordering and arbitrary
// delays, silent regions and a change of leader, given the region contract
// below, equal clock rates (offsets do not matter) and that a new leader
// starts only after the old one stopped answering. A limit or weight
// change applies to new grants at once and to old ones when they expire.
//
// # How the fencing works
//
// Grants are leases. The region measures a grant's validity from when it
// sent its report, which was before the allocator answered, so the
// allocator's bound ue = answer time + Valid is never earlier than the
// region's expiry. For every (key, region) the allocator keeps the grants
// the region may hold or may still receive (candidates) and bounds what
// it may use at a future time t by
//
//	E(t) = max(largest candidate rate with ue > t, s_r once the region may have fallen back)
//
// The fallback time needs a lower bound on the region's expiry, which the
// allocator can only get from an acknowledgement: a report whose
// held_rate/held_burst equal a grant was sent after the allocator answered
// with that grant (at time `at`), so the held grant expires no earlier
// than at + held_valid, and every grant answering that report no earlier
// than at + its Valid. Until a region acknowledges a grant it may be at
// s_r at any time. Candidates older than the acknowledged one are dropped:
// a region never goes back to an older grant. To make acknowledgements
// unambiguous, a new grant whose values equal a candidate's is lowered by
// the smallest float steps.
//
// A grant for region x is issued only if it fits, at every instant of its
// validity, in the headroom H(t) = r − Σ_{y≠x} E_y(t) (other regions taken
// at a one-step over-approximation of E_y), and, if it lets x fall back to
// s_x earlier than before, s_x fits there too. x's own current grants are
// not counted as headroom, so nothing lost about x can become capacity.
// This one check implements the design's rules:
//
//   - capacity moves from a donor to a recipient only once the donor's
//     smaller grant is acknowledged (until then its larger candidate
//     counts) or the larger one expired (ue passed);
//   - a region the allocator cannot hear from keeps its candidates and,
//     once its fallback may have come, s_r: it is counted at max(grant,
//     s_r) until its grants expire and at s_r after;
//   - a grant above a region's static share never outlives the donors'
//     below-share grants that pay for it: once a donor may fall back its
//     deficit is no longer headroom, so the recipient's grant is made
//     shorter than Validity to end by then, or smaller;
//   - bursts follow the same rule with caps; in addition, when a donor
//     acknowledges a smaller cap while reporting a holding above it, its
//     older caps (and, if it may have been on its static share, that one)
//     keep counting, up to the holding, until a report shows the holding
//     within the cap or those caps expire.
//
// The target is tried first for as long as it fits (but at least one
// Epoch); otherwise the grant is what fits for the whole Validity, which is
// safe unless the region holds a grant re-issued in learning with a longer
// prior validity (see Learning mode): then a full-Validity grant too is
// issued only if the static share fits from its earlier fallback on.
// Because a donor's fallback is only known from its previous
// answer's time, an above-share grant ends about two epochs before the
// donor's own grant does: in steady state its Valid is between
// Validity−3·Epoch and Validity−2·Epoch, so Validity should be at least
// 4·Epoch (the default is 5·Epoch).
//
// At most three candidates are kept per (key, region). When a region has
// not acknowledged the last two grants for a key (its answers are lost),
// it gets no new grant for that key until the oldest expire.
//
// # Learning mode
//
// For one Validity after NewAllocator or BecomeLeader the Allocator only
// re-issues what each region reports it holds: the same rate and burst,
// with the same expiry if it is above the static shares (up to
// max(Validity, PriorValidity): a config change that shortened the
// validity does not cut a held grant short), or the longer of the full
// Validity and that expiry if it is at or below them (a region kept below
// its share longer is always safe; cut short, it could refill at its
// share while another region's re-issued grant it pays for runs). After
// learning, a grant that would end before such a longer grant's fallback
// is checked like a short one, or not issued. A region reporting nothing
// held gets no grant
// and runs on s_r. A held grant the allocator cannot place counts as
// reported until it surely expired.
//
// # Region contract
//
// Region daemons must
//   - measure a grant's validity from the moment they sent the report it
//     answers, and truncate validities to milliseconds, never round up;
//   - per key, apply a grant only if the report it answers has a higher
//     seq than the one that brought the grant last applied for that key
//     (remembered after it expired), and never fall back to an older
//     grant; a key absent from an answer keeps its current grant until it
//     expires, then runs on s_r;
//   - report every key they hold a grant for, echoing held rate and burst
//     bit for bit as received, with held_valid truncated, and holding =
//     bucket tokens + unspent leased tokens;
//   - compute s_r from the same configuration (StaticShares);
//   - when a cap falls, stop refilling above it (tokens already out in
//     leases are counted through holding until they are spent or expire);
//   - report as released only tokens a cap took out of the bucket, each
//     once, and only while the key still holds the grant whose cap took
//     them; add a grant's deposit at most once, up to its cap.
//
// # Idempotency and errors
//
// Report remembers each region's last (seq, answer): a retry gets the same
// answer and changes nothing; a lower seq is refused with ErrStaleReport.
// Invalid input (unknown region, negative or non-finite numbers, zero
// window, duplicate key, malformed key) is refused with an error wrapping
// quota.ErrInvalid and leaves the Allocator unchanged. Keys without a
// limit are skipped and listed in the View (RegionView.UnknownKeys).
//
// # Determinism and concurrency
//
// Outputs depend only on the sequence of calls and their arguments: no
// clock, no randomness, no map iteration order. Report answers keys in
// report order, then other active keys in key order. Allocator is safe for
// concurrent use (one internal mutex); the package-level functions are
// pure. The cost of an epoch is linear in the number of keys with demand;
// each grant is O(regions).
package hierarchy
