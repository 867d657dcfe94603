package lease

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unique"

	"golang.org/x/time/rate"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

const (
	// The pool word packs the tokens held (low 32 bits) with a wrapping
	// count of the requests admitted from them (high 32 bits), so the hot
	// path counts its decision in the same compare-and-swap that spends.
	poolMask  = 1<<32 - 1
	admitUnit = 1 << 32
	// maxPool keeps the token half clear of the count half: crediting
	// never carries into it.
	maxPool = 1<<31 - 1
)

// Table is the lease state of every key one instance uses: the pure
// instance-side state machine (see the package documentation). It never
// reads the clock and never does I/O; every method that depends on time
// takes now. Safe for concurrent use: Allow may run on any number of
// goroutines while one owner drives the Prepare/Apply/Expire side.
type Table struct {
	opts TableOptions
	keys *keyMap
	// keyHoldOff is how long a key whose Redis Cluster node failed its
	// call is decided without calls (holdOffLocked): the breaker's
	// cooldown, set once by NewCore before any use.
	keyHoldOff time.Duration

	seq          atomic.Uint64 // last seq handed out
	degradedKeys atomic.Int64
	// unanswered: a key was decided by its on_failure policy and the
	// region has answered no call since. It outlives the key (forgotten
	// as idle), so degraded mode ends on an answer, never on idleness.
	unanswered  atomic.Bool
	episodes    atomic.Uint64 // times Degraded turned true
	closed      atomic.Bool
	giveBackDue atomic.Bool // some key's giveBack was set since GiveBackDue was last read
	// capHeldDue: a request took some key's pool across a cap-held mark
	// (lowWater above usualWater: capHeldWater) since PrepareRefill last
	// ran; the owner loop's wait for its next early refill is then the
	// shorter CapHeldSpacing (Core.RefillWait).
	capHeldDue atomic.Bool
	// unleased: the region's last answer said it runs with no global tier
	// (Grant.unleased), so its rate and cap for every key are its static
	// share for good (see waitCures). A fact of the region, not of a key,
	// so it costs no key anything.
	unleased atomic.Bool
	ownerDue atomic.Int64 // an instant (Table.at): the owner calls Expire again by then (see ExpireFor)

	mu  sync.Mutex
	rtt time.Duration // guarded by mu: smoothed round trip of lease RPCs

	originOnce sync.Once
	origin     time.Time // set once by originOnce: the zero of builtUS

	zeroOnce sync.Once
	zero     time.Time // set once by zeroOnce: the zero of the keys' owner-side times (at)

	statsMu sync.Mutex
	totals  map[statsLabels]*[resultSlots]uint64 // guarded by statsMu
}

// instant is a time as the table stores it per key: nanoseconds since
// the table's zero (see Table.at), 8 bytes instead of a time.Time's 24.
// The difference of two is the difference of the instants they were made
// of, on the monotonic clock when both readings carry it.
type instant int64

// never is the instant no time is before (none set).
const never instant = math.MinInt64

// keyInfo is what one key's hot path reads: an immutable snapshot published
// by the owner side whenever it changes. Every held key has one, so its
// fields are packed (see TestMemoryPerHeldKey).
type keyInfo struct {
	mode      Mode
	onFailure Policy
	shadow    bool
	// capKnown: cap is valid (see regionLeft).
	capKnown bool
	hasLease bool
	// checkClock is set once the deadline is near: from then on the hot
	// path is not allowed to skip reading the clock (see doc.go).
	checkClock bool
	// negNever: the region's negative answer (see negNeed) said no wait
	// will bring negNeed tokens, rather than naming a wait.
	negNever bool
	// giveBack: a grant told of more live instances than the one before,
	// and the pool holds more than the batch cap at that count; the owner
	// loop sends the key's report early (PrepareRefill) to give the
	// excess back, rather than at the next periodic Sync.
	giveBack bool
	// usualWater is the low-water mark sizing alone sets (at most
	// quota.MaxWant); lowWater is above it while the region's bucket is
	// held at its cap by this instance's unreported spending
	// (capHeldWater).
	usualWater int32
	// negNeed, while negUntil holds, is the need (tokens beyond the pool,
	// a report's min, at least 1, at most quota.MaxWant) the region's last
	// negative answer was about. A request needing more than it was not
	// answered: it asks the region (the wait named for fewer tokens would
	// send it back too early). With negNever, a request needing at least
	// negNeed is denied until negUntil, with RetryNever only when its
	// cost is beyond any wait (waitCures), and one needing less asks (the
	// "never" says nothing of it); otherwise one needing at most negNeed
	// is denied until negUntil less the time the region's rate refills
	// the tokens it needs fewer of (refillTime), and asks once that has
	// passed.
	negNeed int32
	// lowWater is at most maxPool: a pool never holds more, so a higher
	// mark would act the same.
	lowWater int32
	live     int32 // learned from the last grant, at most math.MaxInt32

	tier  unique.Handle[string] // zero: not learned yet (see tierName)
	limit int64                 // configured global burst; 0 until learned
	// Learned from the last grant.
	regionRate  float64
	regionBurst float64
	resetAt     time.Time
	// regionLeft is the tokens the region's bucket held at its last
	// answer; cap is the region's burst cap for the key in whole tokens,
	// at most limit, valid when capKnown (a grant told the region's burst
	// and the limit is known). They make Decision.Remaining and
	// Decision.Cap what this caller can expect (see expected).
	regionLeft int64
	cap        int64

	deadline instant // no token of the lease may be spent at or after it
	negUntil instant // no synchronous acquire before this (never: none)
}

// tierName is the key's tier as the region named it ("" until then).
func (in *keyInfo) tierName() string {
	if in.tier == (unique.Handle[string]{}) {
		return ""
	}
	return in.tier.Value()
}

// setTier names the key's tier; tier names are interned, so keys of one
// tier share one copy.
func (in *keyInfo) setTier(tier string) {
	if tier != in.tierName() {
		in.tier = unique.Make(tier)
	}
}

// clampWater is a low-water mark as keyInfo stores it: at most maxPool.
func clampWater(w int64) int32 { return int32(min(w, maxPool)) }

// entry is one key. The pool word and info are read and written without
// locks; everything else belongs to the owner side and is guarded by mu.
// Every held key has one: what only the paths other than the lease's
// admissions need is in rare, made on first use, and fields are ordered so
// that small ones share words (see TestMemoryPerHeldKey).
type entry struct {
	word  atomic.Uint64 // tokens (low 32 bits) | admitted requests (high 32 bits)
	info  atomic.Pointer[keyInfo]
	flags atomic.Uint32 // removedFlag, read without locks, and the owner's flags (see has, set)

	foldedAdmitted uint32 // guarded by Table.statsMu

	tenant string
	class  unique.Handle[string] // interned: the keys of a class share its name
	rare   atomic.Pointer[rare]  // nil until the key's first decision or wait the lease path does not cover

	mu    sync.Mutex
	draft *keyInfo // guarded by mu: the owner's changes to info not yet published (nil: none)
	// net is every token ever put in the pool less those taken out
	// unspent, so the pool and net give the tokens ever spent (spentLocked).
	net        int64               // guarded by mu
	returned   int64               // guarded by mu: tokens handed back in the current lease's reports
	toReturn   int64               // guarded by mu: removed from the pool, not yet reported
	lease      uint64              // guarded by mu: the seq of the current lease's first report (0: none yet)
	baseSpent  int64               // guarded by mu: the spent total when the lease began
	pending    *sluicev1.KeyReport // guarded by mu: sent, not acknowledged
	guard      time.Duration       // guarded by mu: checkClock is set this long before deadline
	rate       float64             // guarded by mu: EWMA of demand, tokens/s
	sizingRate float64             // guarded by mu: rate the last batch was sized with
	drainRate  float64             // guarded by mu: rate the last batch's cap was judged with (ratesLocked)
	// The region's demand window for this lease, as the region measures it
	// from the reports' build times (mirrorWindowLocked): when it opened
	// (Table.at), the used + denied total it opened at, and the rate the
	// region read over the last window it closed (tokens/s).
	winAt        time.Duration // guarded by mu
	winDemand    int64         // guarded by mu
	regionRead   float64       // guarded by mu
	sampleAt     time.Duration // guarded by mu: start of the current demand window (Table.at)
	sampleDemand int64         // guarded by mu: demand at sampleAt
	lastActive   time.Duration // guarded by mu: Table.at
	activityMark int64         // guarded by mu
}

// A key's flags (entry.flags). removedFlag is read without locks; the
// others are read and written under entry.mu only.
const (
	removedFlag  uint32 = 1 << iota // forgotten: a later lookup makes a fresh entry
	rebaseFlag                      // start a new lease when the report in flight ends
	grantedFlag                     // the region holds a lease record for us
	haveRateFlag                    // the demand EWMA (rate) has a first sample
	degradedFlag                    // last decided by the on_failure policy, not answered since
	inflightFlag                    // a report is in flight (see rare.done)
)

func (e *entry) has(f uint32) bool { return e.flags.Load()&f != 0 }

func (e *entry) set(f uint32, on bool) {
	if on {
		e.flags.Or(f)
	} else {
		e.flags.And(^f)
	}
}

// newKeyEntry returns an entry for key k with nothing else set.
func newKeyEntry(k quota.Key) *entry { return &entry{tenant: k.Tenant, class: unique.Make(k.Class)} }

// key is the entry's key.
func (e *entry) key() quota.Key { return quota.Key{Tenant: e.tenant, Class: e.class.Value()} }

// is reports whether the entry's key is k.
func (e *entry) is(k quota.Key) bool { return e.tenant == k.Tenant && e.class.Value() == k.Class }

// rare is what a key keeps for the paths other than the lease's
// admissions (which ride in the pool word): decision counts, the tokens
// those paths were asked for, the on_failure limiter and the channel
// requests wait on for a report in flight. It is made on the key's first
// such decision or wait, as most held keys only ever admit from their
// lease.
type rare struct {
	results [resultSlots]atomic.Uint64
	folded  [resultSlots]uint64 // guarded by Table.statsMu

	// Cumulative tokens.
	denied   atomic.Int64 // denied by the lease path (reported as denied)
	degraded atomic.Int64 // asked of the on_failure policy
	check    atomic.Int64 // asked of the strict path

	baseDenied int64         // guarded by entry.mu: denied when the lease began
	limiter    *rate.Limiter // guarded by entry.mu: the local on_failure limiter
	// checked is the tokens the region admitted on strict checks, and
	// charged the tokens admitted through the region (lease and strict
	// paths) the limiter has been charged for (see chargeLocked).
	checked int64         // guarded by entry.mu
	charged int64         // guarded by entry.mu
	done    chan struct{} // guarded by entry.mu: closed when the report in flight ends (nil: nobody waits)
	// heldOff is the instant until which the key's requests are decided
	// by its on_failure policy without a call: the region answered that
	// the key's Redis Cluster node failed (Table.holdOffLocked; 0: none).
	// Guarded by entry.mu.
	heldOff instant
}

// rareFor returns the key's rare state, making it on first use.
func (e *entry) rareFor() *rare {
	r := e.rare.Load()
	if r == nil {
		r = new(rare)
		if !e.rare.CompareAndSwap(nil, r) {
			r = e.rare.Load()
		}
	}
	return r
}

// count adds one decision to slot i of the key's counts.
func (e *entry) count(i int) { e.rareFor().results[i].Add(1) }

// deniedTokens, degradedTokens and checkTokens are the tokens the lease
// path denied, and those asked of the on_failure policy and the strict
// path.
func (e *entry) deniedTokens() int64 {
	if r := e.rare.Load(); r != nil {
		return r.denied.Load()
	}
	return 0
}

func (e *entry) otherTokens() int64 {
	if r := e.rare.Load(); r != nil {
		return r.denied.Load() + r.degraded.Load() + r.check.Load()
	}
	return 0
}

const resultSlots = int(numResults) * 2 // × degraded or not

func slot(r Result, degraded bool) int {
	if degraded {
		return int(r)*2 + 1
	}
	return int(r) * 2
}

// NewTable returns an empty table.
func NewTable(opts TableOptions) (*Table, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &Table{opts: o, keys: newKeyMap(), totals: map[statsLabels]*[resultSlots]uint64{}}
	t.keys.ordered = o.OrderedScans
	t.seq.Store(o.SeqBase)
	t.ownerDue.Store(int64(never))
	return t, nil
}

// Options returns the table's options with defaults applied.
func (t *Table) Options() TableOptions { return t.opts }

func (e *entry) tokens() int64 { return int64(e.word.Load() & poolMask) }

// ownerHorizon is when the owner will next enforce deadlines at the
// latest: now, or later while it is busy (ExpireFor).
func (t *Table) ownerHorizon(now time.Time) instant {
	return max(t.instant(now), instant(t.ownerDue.Load()))
}

// take spends cost tokens if the pool holds them. crossed reports that this
// spend took the pool from above low to at or below it.
func (e *entry) take(cost, low int64) (remaining int64, crossed, ok bool) {
	for {
		old := e.word.Load()
		have := int64(old & poolMask)
		if have < cost {
			return have, false, false
		}
		if e.word.CompareAndSwap(old, old-uint64(cost)+admitUnit) {
			rem := have - cost
			return rem, have > low && rem <= low, true
		}
	}
}

// drainLocked takes up to max unspent tokens out of the pool and returns
// how many it took. Owner side only.
func (e *entry) drainLocked(max int64) int64 {
	for {
		old := e.word.Load()
		n := min(int64(old&poolMask), max)
		if n <= 0 {
			return 0
		}
		if e.word.CompareAndSwap(old, old-uint64(n)) {
			e.net -= n
			return n
		}
	}
}

// creditLocked adds n tokens to the pool; what would overflow it is
// returned instead of credited.
func (e *entry) creditLocked(n int64) (overflow int64) {
	room := maxPool - e.tokens() // only the owner adds, so room only grows meanwhile
	if n > room {
		overflow, n = n-room, room
	}
	if n > 0 {
		e.word.Add(uint64(n))
		e.net += n
	}
	return overflow
}

// spentLocked is every token ever admitted from the pool: the hot path only
// ever decrements it, and the owner books every other change.
func (e *entry) spentLocked() int64 { return e.net - e.tokens() }

func (e *entry) demandLocked() int64 {
	return e.spentLocked() + e.otherTokens()
}

// view is the owner's view of the key's info: its unpublished changes,
// else the published snapshot. Read only: changes go through own.
func (e *entry) view() *keyInfo {
	if e.draft != nil {
		return e.draft
	}
	return e.info.Load()
}

// own returns the owner's draft of the key's info to change, copying the
// published snapshot when no draft is open. A key keeps one copy of its
// info between changes, not two: published snapshots are never written.
func (e *entry) own() *keyInfo {
	if e.draft == nil {
		cp := *e.info.Load()
		e.draft = &cp
	}
	return e.draft
}

// publishLocked makes the owner's changes visible to the hot path.
func (e *entry) publishLocked() {
	if e.draft != nil {
		e.info.Store(e.draft)
		e.draft = nil
	}
}

func (t *Table) newEntry(now time.Time, key quota.Key) *entry {
	e := newKeyEntry(key)
	e.sampleAt, e.lastActive, e.guard = t.at(now), t.at(now), t.opts.Refresh
	in := &keyInfo{deadline: never, negUntil: never}
	if p, ok := t.opts.Classes[key.Class]; ok {
		in.mode, in.onFailure, in.shadow = p.Mode, p.OnFailure, p.Shadow
	}
	e.info.Store(in)
	return e
}

// entryFor returns key's entry, creating it (after validating the key) on
// first use.
func (t *Table) entryFor(now time.Time, key quota.Key) (*entry, error) {
	if e := t.keys.lookupFresh(key); e != nil {
		return e, nil
	}
	if t.closed.Load() {
		return nil, ErrClosed
	}
	if err := key.Validate(); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	e, _ := t.keys.loadOrStore(key, func() *entry { return t.newEntry(now, key) })
	return e, nil
}

func validateCost(key quota.Key, cost int64, in *keyInfo) error {
	if err := quota.ValidateCost(cost); err != nil {
		return fmt.Errorf("lease: key %s: %w", key, err)
	}
	if in != nil && in.limit > 0 && cost > in.limit {
		return fmt.Errorf("lease: key %s: %w: cost %d exceeds the key's burst %d, so it can never be admitted",
			key, quota.ErrInvalid, cost, in.limit)
	}
	return nil
}

// Allow decides a request of cost tokens on key at now from the tokens the
// instance holds. The decision is final when the action is ActNone or
// ActRefill; otherwise the caller must acquire or check (see Action).
// Errors mean bad input (wrapping quota.ErrInvalid) or ErrClosed, and
// change nothing.
func (t *Table) Allow(now time.Time, key quota.Key, cost int64) (quota.Decision, Action, error) {
	if err := validateCost(key, cost, nil); err != nil {
		return quota.Decision{}, ActNone, err
	}
	e, err := t.entryFor(now, key)
	if err != nil {
		return quota.Decision{}, ActNone, err
	}
	in := e.info.Load()
	if err := validateCost(key, cost, in); err != nil {
		return quota.Decision{}, ActNone, err
	}
	if in.mode == ModeStrict {
		return quota.Decision{}, ActCheck, nil
	}
	if in.hasLease && t.instant(now) >= in.deadline {
		e.mu.Lock()
		t.expireLocked(now, e)
		e.mu.Unlock()
		in = e.info.Load()
	}
	if in.hasLease {
		if rem, crossed, ok := e.take(cost, int64(in.lowWater)); ok {
			if crossed {
				t.noteCrossed(in)
				return admitted(in, rem), ActRefill, nil
			}
			return admitted(in, rem), ActNone, nil
		}
	}
	if at := t.instant(now); at < in.negUntil {
		need := cost - e.tokens()
		switch {
		case in.negNever && need >= int64(in.negNeed):
			// The region said no wait will bring this many tokens while
			// its cap, its rate and the leases out stay as they are. All
			// change without a config change (leases come back; the
			// global tier grants the region more burst, and gives a
			// region on its floor its rate back): a cost waitCures
			// admits waits for the next time the key asks (negUntil, a
			// refresh after the answer). Only a cost above the
			// configured burst, or above an unleased region's cap, is
			// never admitted.
			if in.waitCures(cost, t.unleased.Load()) {
				return t.deny(e, in, cost, time.Duration(in.negUntil-at)), ActNone, nil
			}
			d := t.deny(e, in, cost, 0)
			d.RetryNever = !d.Allowed
			return d, ActNone, nil
		case !in.negNever && need <= int64(in.negNeed):
			// A wait named for more tokens than this request needs is
			// longer than its own by the time the region's bucket takes
			// to refill the difference: denied until then, the key asks
			// the region once it has come. That is exact for a lone
			// instance; where others spend the bucket too, the region's
			// answer to the ask names the rest of the wait. Denied for
			// the whole wait, such a request was refused tokens the
			// region held (a large request denied made every small one
			// wait as long).
			if wait := time.Duration(in.negUntil-at) - in.refillTime(int64(in.negNeed)-need); wait > 0 {
				return t.deny(e, in, cost, wait), ActNone, nil
			}
		}
		// The answer was about a different need: a larger one after a
		// named wait, a smaller one after "never", or a smaller one whose
		// tokens the region's bucket may hold by now. Only the region can
		// say when this request's tokens come.
	}
	return quota.Decision{}, ActAcquire, nil
}

// allowFast is Allow's lock-free path: it succeeds only while the key's
// deadline is far (info.checkClock unset, which the owner sets by calling
// Expire on time) and at, the caller's clock reading as an instant (see
// Table.at), is before the deadline. The second test is what holds when
// the owner is late: a process resumed after a pause (SIGSTOP, a frozen
// VM, a long GC or cgroup throttle) runs requests before the owner's
// overdue wake-up, and without it spent an expired lease's tokens, which
// the region may already have reclaimed and handed to a peer. ok false
// means: call Allow. It returns the pieces of the decision rather than a
// built Decision, so the caller builds it once, in place.
func (t *Table) allowFast(key quota.Key, cost int64, at instant) (in *keyInfo, remaining int64, refill, ok bool) {
	if cost < 1 || cost > quota.MaxCost {
		return nil, 0, false, false
	}
	e := t.keys.load(key)
	if e == nil {
		return nil, 0, false, false
	}
	in = e.info.Load()
	if in.checkClock || (in.hasLease && at >= in.deadline) || (in.limit > 0 && cost > in.limit) {
		return nil, 0, false, false
	}
	remaining, refill, ok = e.take(cost, int64(in.lowWater))
	if refill {
		t.noteCrossed(in)
	}
	return in, remaining, refill, ok
}

// noteCrossed records that a request took a pool across the low-water
// mark of in: a cap-held mark (above the usual one) makes the owner's next
// early refill urgent, as every millisecond it waits is refill the
// region's full bucket loses (capHeldWater, Core.RefillWait). Allow and
// allowFast call it after entry.take rather than through a shared wrapper,
// which would be too large to inline into allowFast, the lock-free path.
func (t *Table) noteCrossed(in *keyInfo) {
	if in.lowWater > in.usualWater {
		t.capHeldDue.Store(true)
	}
}

func admitted(in *keyInfo, remaining int64) quota.Decision {
	return quota.Decision{Allowed: true, Limit: in.limit, Cap: in.cap, CapKnown: in.capKnown, Remaining: in.expected(remaining), ResetAt: in.resetAt, Refill: in.regionRate}
}

// expected is what this caller can expect to spend now, with pool tokens
// left in the instance: those plus what the region's bucket held at its
// last answer, at most the region's cap.
func (in *keyInfo) expected(pool int64) int64 {
	r := max(pool, 0) + in.regionLeft
	if in.capKnown {
		r = min(r, in.cap)
	}
	return r
}

// WaitCures reports whether a request of cost tokens the region answered
// "never" can still be admitted by waiting while the config stays as it
// is. limit is the key's configured burst (0: not known yet); unleased
// says the region runs with no global tier; known that the answer carried
// the region's rate and burst for the key (regionRate, regionBurst: its
// cap, fractional where a static share splits a small burst). The region's
// "never" speaks of its bucket now: its current cap less the tokens out in
// leases, at its current rate. Leases come back (released, expired). A
// region with a global tier is given more without a config change: grants
// raise its cap up to the key's configured burst, and its rate is zero
// only on its floor (partition_share 0) while its static lease lapsed,
// until the global tier answers it again, or while it is drained, until it
// is restored or stopped. The key's own rate is never zero: the config
// refuses it (config.checkLimit), and the region answers only keys its
// config resolves. So a cost within the key's configured burst waits,
// unless the region is unleased: its rate and cap are its static share
// for good, and a cost above that cap, or a zero rate, waits in vain. A
// cost above the configured burst, or one whose burst is not known yet,
// is never admitted (docs/architecture.md, "No edge promises a wait that
// cannot be honoured").
// It is how the lease client decides, and what sluicectl tells its user.
func WaitCures(cost, limit int64, unleased, known bool, regionRate, regionBurst float64) bool {
	switch {
	case limit <= 0 || cost > limit:
		return false
	case unleased:
		return known && cost <= wholeCap(regionBurst, limit) && regionRate > 0
	}
	return true
}

// refillTime is how long the region's bucket takes to refill n tokens at
// the region's rate for the key (0 for n <= 0 or an unknown or zero rate:
// nothing is known of the difference; at most MaxInt64 ns).
func (in *keyInfo) refillTime(n int64) time.Duration {
	if n <= 0 || !(in.regionRate > 0) {
		return 0
	}
	s := float64(n) / in.regionRate * float64(time.Second)
	if !(s < math.MaxInt64) {
		return math.MaxInt64
	}
	return time.Duration(s)
}

// waitCures is WaitCures for the key's last answer: its cap is
// wholeCap(regionBurst, limit) whenever capKnown.
func (in *keyInfo) waitCures(cost int64, unleased bool) bool {
	return WaitCures(cost, in.limit, unleased, in.capKnown, in.regionRate, in.regionBurst)
}

// wholeCap is the region's burst cap in whole tokens, at most the
// configured limit; 0 while the limit is unknown.
func wholeCap(regionBurst float64, limit int64) int64 {
	if limit <= 0 || !(regionBurst >= 0) {
		return 0
	}
	// A cap is a whole number of tokens unless a static share splits a
	// small burst; the tolerance keeps float error from losing a token.
	c := int64(math.Floor(regionBurst + 1e-9))
	return min(max(c, 0), limit)
}

// deny records a lease-path denial and builds its decision.
func (t *Table) deny(e *entry, in *keyInfo, cost int64, retry time.Duration) quota.Decision {
	e.rareFor().denied.Add(cost)
	// A denial says fewer than cost tokens can be had now, whatever the
	// region's bucket held at its last answer.
	rem := min(in.expected(e.tokens()), cost-1)
	d := quota.Decision{WouldDeny: true, Limit: in.limit, Cap: in.cap, CapKnown: in.capKnown, Remaining: rem, ResetAt: in.resetAt, Refill: in.regionRate, RetryAfter: retry}
	if in.shadow {
		d.Allowed = true
		e.count(slot(ResultShadowDenied, false))
	} else {
		e.count(slot(ResultDenied, false))
	}
	return d
}

// Exhausted denies a request whose key still has no usable tokens after
// the synchronous acquires the caller was willing to make (other requests
// took the fresh batch first). RetryAfter is one smoothed round trip.
func (t *Table) Exhausted(now time.Time, key quota.Key, cost int64) (quota.Decision, error) {
	e, err := t.entryFor(now, key)
	if err != nil {
		return quota.Decision{}, err
	}
	return t.deny(e, e.info.Load(), cost, max(t.RTT(), time.Millisecond)), nil
}

// Fallback decides a request with the key's on_failure policy, for when the
// region cannot be reached: local (a token bucket at this instance's share
// of the region's learned rate and burst, or, for a key the region never
// described, FallbackLimit bounded by the live config's static share of
// the key, TableOptions.StaticShare), open or closed. The policy, and whether the class is in shadow mode, are the
// live config's (TableOptions.Policies) when it names the class, else what
// the region last said of the key, else TableOptions.Classes. The decision
// is marked Degraded and the key counts as degraded until the region
// answers for it again.
func (t *Table) Fallback(now time.Time, key quota.Key, cost int64) (quota.Decision, error) {
	if err := validateCost(key, cost, nil); err != nil {
		return quota.Decision{}, err
	}
	e, err := t.entryFor(now, key)
	if err != nil {
		return quota.Decision{}, err
	}
	if err := validateCost(key, cost, e.info.Load()); err != nil {
		return quota.Decision{}, err
	}
	live, haveLive := t.livePolicy(key.Class)
	share, haveShare := t.staticShare(key, e.info.Load(), live, haveLive)
	e.mu.Lock()
	in := *e.view()
	if haveLive {
		in.onFailure, in.shadow = live.OnFailure, live.Shadow
	}
	d := quota.Decision{Degraded: true, Limit: in.limit, ResetAt: now}
	switch in.onFailure {
	case PolicyOpen:
		// Nothing limits the caller while the policy decides: it can
		// spend any number of tokens now, which readers show as all of
		// the limit they show (a Remaining of 0 beside a ResetAt of now
		// said nothing was left and that the cap was back already).
		d.Allowed, d.Remaining = true, math.MaxInt64
	case PolicyClosed:
		d.RetryAfter = t.opts.Refresh
	default:
		lim := t.localLimiterLocked(now, e, share, haveShare)
		e.chargeLocked(now, lim)
		if d.Limit == 0 {
			d.Limit = int64(lim.Burst())
		}
		// Degraded, this instance can expect its local bucket only.
		d.Cap, d.CapKnown = min(int64(lim.Burst()), d.Limit), true
		d.Allowed = lim.AllowN(now, int(cost))
		have := lim.TokensAt(now)
		d.Remaining = max(0, int64(math.Floor(have)))
		if r := float64(lim.Limit()); r > 0 {
			d.Refill = r
			switch {
			case d.Allowed:
			case cost > int64(lim.Burst()):
				// No wait fills the local bucket past its burst: only
				// the region, answering again, can admit this cost
				// (within the key's burst, it is not RetryNever). Retry
				// when the key asks it again, as closed answers.
				d.RetryAfter = t.opts.Refresh
			default:
				d.RetryAfter = time.Duration((float64(cost) - have) / r * float64(time.Second))
			}
			d.ResetAt = now.Add(time.Duration((float64(lim.Burst()) - have) / r * float64(time.Second)))
		}
	}
	firstKey := false
	if !e.has(degradedFlag) {
		e.set(degradedFlag, true)
		firstKey = t.degradedKeys.Add(1) == 1
	}
	if !t.unanswered.Load() && !t.unanswered.Swap(true) && firstKey {
		// Neither a degraded key nor an unanswered degraded decision
		// before this one: a new episode.
		t.episodes.Add(1)
	}
	e.mu.Unlock()

	e.rareFor().degraded.Add(cost)
	d.WouldDeny = !d.Allowed
	switch {
	case d.Allowed:
		e.count(slot(ResultAllowed, true))
	case in.shadow:
		d.Allowed = true
		e.count(slot(ResultShadowDenied, true))
	default:
		e.count(slot(ResultDenied, true))
	}
	return d, nil
}

// livePolicy is the live config's policy of class (TableOptions.Policies);
// false when there is none, or it names no class or an unknown policy.
func (t *Table) livePolicy(class string) (ClassPolicy, bool) {
	if t.opts.Policies == nil {
		return ClassPolicy{}, false
	}
	p, ok := t.opts.Policies(class)
	if !ok || p.OnFailure > PolicyClosed || p.Mode > ModeStrict {
		return ClassPolicy{}, false
	}
	return p, true
}

// staticShare is the live config's static share of key in this instance's
// region (TableOptions.StaticShare), asked only when the local policy
// decides (the live config's, else the key's) and the region never
// described the key (in, its published info, names no region rate or
// burst): false otherwise, or when the config names no usable share.
func (t *Table) staticShare(key quota.Key, in *keyInfo, live ClassPolicy, haveLive bool) (quota.Limit, bool) {
	if t.opts.StaticShare == nil || (in.regionRate > 0 && in.regionBurst > 0) {
		return quota.Limit{}, false
	}
	policy := in.onFailure
	if haveLive {
		policy = live.OnFailure
	}
	if policy != PolicyLocal {
		return quota.Limit{}, false
	}
	share, ok := t.opts.StaticShare(key)
	if !ok || !(share.Rate > 0) || math.IsInf(share.Rate, 0) || share.Burst < 0 {
		return quota.Limit{}, false
	}
	return share, true
}

// localLimiterLocked returns the key's local limiter, set to this
// instance's share of what the region last said or, for a key the region
// never described, FallbackLimit, each of its rate and burst no higher
// than share's when haveShare (the live config's static share of the key
// in this region; the burst at least 1, as a learned share's, so that the
// bucket can admit).
func (t *Table) localLimiterLocked(now time.Time, e *entry, share quota.Limit, haveShare bool) *rate.Limiter {
	lim := t.opts.FallbackLimit
	switch {
	case e.view().regionRate > 0 && e.view().regionBurst > 0:
		live := float64(max(1, e.view().live))
		lim = quota.Limit{Rate: e.view().regionRate / live, Burst: max(1, int64(e.view().regionBurst/live))}
	case haveShare:
		lim = quota.Limit{Rate: min(lim.Rate, share.Rate), Burst: max(1, min(lim.Burst, share.Burst))}
	}
	r := e.rareFor()
	if r.limiter == nil {
		r.limiter = rate.NewLimiter(rate.Limit(lim.Rate), int(lim.Burst))
		return r.limiter
	}
	if r.limiter.Limit() != rate.Limit(lim.Rate) {
		r.limiter.SetLimitAt(now, rate.Limit(lim.Rate))
	}
	if r.limiter.Burst() != int(lim.Burst) {
		r.limiter.SetBurstAt(now, int(lim.Burst))
	}
	return r.limiter
}

// chargeLocked books against the key's local limiter lim, at now, the
// tokens the key admitted through the region (its lease and strict
// answers) since the limiter last saw them, so that a degraded period
// right after heavy use of the region does not start from a full bucket:
// the instance's admissions through the region and its degraded ones
// share the local bound (burst/live + rate/live·t). The hot path spends
// without touching the limiter; its spending is read here, from the spent
// total, and booked late, which only leaves the bucket lower than booking
// each token as it was spent would have. The bucket may go into debt by
// up to its burst: an instance whose lease kept being served between
// degraded decisions (one replica of several hung, its other calls
// answered) had its bucket refill beside the lease and admitted both, 27
// a second over a 20/s key; with the debt, what the lease spent since the
// last degraded decision comes out of the local refill first. What the
// region granted beyond the local share is carried at most one burst into
// degraded mode (a bucket full when the episode begins is emptied and
// nothing more), so degraded mode then admits at the local rate.
func (e *entry) chargeLocked(now time.Time, lim *rate.Limiter) {
	r := e.rareFor()
	total := e.spentLocked() + r.checked
	n := total - r.charged
	r.charged = total
	if n <= 0 {
		return
	}
	// At most the burst, so the reservation is granted; the tokens it
	// takes beyond the bucket's are a debt the refill pays first.
	lim.ReserveN(now, int(min(n, int64(lim.Burst()))))
}

// ApplyCheck turns the region's answer to a strict Check into a decision
// and learns the key's limit from it.
func (t *Table) ApplyCheck(now time.Time, key quota.Key, cost int64, resp *sluicev1.CheckResponse) (quota.Decision, error) {
	if err := validateCost(key, cost, nil); err != nil {
		return quota.Decision{}, err
	}
	if resp == nil {
		return quota.Decision{}, fmt.Errorf("lease: key %s: empty check response", key)
	}
	e, err := t.entryFor(now, key)
	if err != nil {
		return quota.Decision{}, err
	}
	t.Answered()
	e.mu.Lock()
	if resp.Limit > 0 && resp.Limit != e.view().limit {
		e.own().limit = resp.Limit
	}
	e.own().shadow = resp.Shadow
	e.own().resetAt = now.Add(time.Duration(max(0, resp.ResetMs)) * time.Millisecond)
	e.own().regionLeft = max(0, resp.Remaining)
	t.unleased.Store(resp.Unleased)
	if resp.RegionRate != nil && resp.RegionBurst != nil && *resp.RegionRate >= 0 && *resp.RegionBurst >= 0 {
		// The region's bucket as this check found it, so even the first
		// answer on a key says what the caller can spend (its cap), not
		// the global limit.
		e.own().regionRate, e.own().regionBurst = *resp.RegionRate, *resp.RegionBurst
		e.own().capKnown = e.view().limit > 0
	}
	if e.view().capKnown {
		// The limit may have changed; the region's burst is this check's,
		// or the last grant's from a server that does not send it.
		e.own().cap = wholeCap(e.view().regionBurst, e.view().limit)
	}
	capped, capKnown, refill := e.view().cap, e.view().capKnown, e.view().regionRate
	waitCures := e.view().waitCures(cost, resp.Unleased)
	if resp.Allowed {
		e.rareFor().checked += cost
	}
	t.clearDegradedLocked(e)
	e.publishLocked()
	e.mu.Unlock()

	e.rareFor().check.Add(cost)
	d := quota.Decision{
		Allowed:   resp.Allowed,
		WouldDeny: !resp.Allowed,
		Limit:     resp.Limit,
		Cap:       capped,
		CapKnown:  capKnown,
		Remaining: max(0, resp.Remaining),
		ResetAt:   now.Add(time.Duration(max(0, resp.ResetMs)) * time.Millisecond),
		Refill:    refill,
	}
	if capKnown {
		d.Remaining = min(d.Remaining, capped)
	}
	switch {
	case resp.Allowed:
		e.count(slot(ResultAllowed, false))
	case resp.Shadow:
		d.Allowed = true
		e.count(slot(ResultShadowDenied, false))
	default:
		d.RetryAfter = time.Duration(max(0, resp.RetryAfterMs)) * time.Millisecond
		switch {
		case resp.RetryAfterMs >= 0:
		case waitCures:
			// The region's bucket cannot hold cost now, but a wait can
			// cure it (waitCures): tokens out in leases come back, and
			// the global tier may grant the region more of the burst or
			// give a region on its floor its rate back. The refresh is
			// the period after which this instance asks the region
			// again, so it is the earliest time the answer can differ.
			d.RetryAfter = t.opts.Refresh
		default:
			d.RetryNever = true // cost above the configured burst, or above an unleased region's cap: no wait will do
		}
		d.Remaining = min(d.Remaining, cost-1)
		e.count(slot(ResultDenied, false))
	}
	return d, nil
}

func (t *Table) clearDegradedLocked(e *entry) {
	if r := e.rare.Load(); r != nil {
		r.heldOff = 0 // the region answered for the key
	}
	if e.has(degradedFlag) {
		e.set(degradedFlag, false)
		t.degradedKeys.Add(-1)
	}
}

// removeLocked forgets e: later lookups create a fresh entry.
func (t *Table) removeLocked(e *entry) {
	if e.has(removedFlag) {
		return
	}
	e.set(removedFlag, true)
	t.keys.delete(e.key(), e)
	t.clearDegradedLocked(e)
	t.statsMu.Lock()
	t.foldLocked(e)
	t.statsMu.Unlock()
}

// DegradedEpisodes is how many times the table entered degraded mode:
// Degraded turned true. It counts episodes too short for a scrape of
// Degraded to see.
func (t *Table) DegradedEpisodes() uint64 { return t.episodes.Load() }

// DegradedKeys is how many keys the table holds that last decided with
// their on_failure policy and have not been answered by the region since.
func (t *Table) DegradedKeys() int64 { return t.degradedKeys.Load() }

// Degraded reports whether the table is in degraded mode: some key it
// holds is degraded (DegradedKeys), or a key was decided by its
// on_failure policy and the region has answered no call since (Answered),
// whether or not that key is still held. Degraded mode ends only on
// evidence that the region answers: keys that idle out while it does not
// are forgotten, but the mode stays, since the next request would try the
// region and, finding it as it was last seen, decide degraded again.
func (t *Table) Degraded() bool {
	return t.degradedKeys.Load() > 0 || t.unanswered.Load()
}

// Answered records that the region answered a call: Apply and ApplyCheck
// call it, and the owner for an answered Release (Core.ReleaseDone). A
// degraded decision made before it is no longer evidence
// that the region does not answer. Keys still degraded stay so until the
// region answers for them.
func (t *Table) Answered() {
	if t.unanswered.Load() {
		t.unanswered.Store(false)
	}
}

// Len is the number of keys the table holds.
func (t *Table) Len() int { return t.keys.len() }

// HeldTokens is the sum of tokens in every key's pool.
func (t *Table) HeldTokens() int64 {
	var n int64
	for _, e := range t.keys.entries() {
		n += e.tokens()
	}
	return n
}

// RTT is the smoothed round trip of applied lease RPCs (0 before any).
func (t *Table) RTT() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.rtt
}

func (t *Table) observeRTT(d time.Duration) {
	if d < 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rtt == 0 {
		t.rtt = d
		return
	}
	t.rtt += (d - t.rtt) / 5
}

// Cap returns the region's burst cap for key in whole tokens as of the
// region's last answer (Decision.Cap) without deciding or charging
// anything. For a key the table does not hold (never answered, or
// forgotten as idle) or whose cap is not known yet it is the live
// config's static share of the key in this region
// (TableOptions.StaticShare, its burst in whole tokens: the cap a region
// answers for a key it holds no grant of); false without one. For
// describing a request decided without the region (a cost no wait
// admits) with the cap the key's decisions report, not the configured
// burst. The caller bounds it by the key's limit.
func (t *Table) Cap(key quota.Key) (int64, bool) {
	if e := t.keys.lookupFresh(key); e != nil {
		if in := e.info.Load(); in != nil && in.capKnown {
			return in.cap, true
		}
	}
	if t.opts.StaticShare == nil {
		return 0, false
	}
	share, ok := t.opts.StaticShare(key)
	if !ok || share.Burst < 0 {
		return 0, false
	}
	return share.Burst, true
}

// KeyState is a copy of one key's state, for tests, the simulator and
// debugging.
type KeyState struct {
	Tokens      int64
	HasLease    bool
	Deadline    time.Time
	CheckClock  bool
	LowWater    int64
	NegUntil    time.Time
	Mode        Mode
	OnFailure   Policy
	Shadow      bool
	Tier        string
	Limit       int64
	RegionRate  float64
	RegionBurst float64
	Live        int64
	Pending     *sluicev1.KeyReport // the unacknowledged report, if any (do not modify)
	InFlight    bool
	Degraded    bool
	ToReturn    int64   // tokens taken out of the pool for the next report
	Spent       int64   // tokens ever admitted from leases
	Rate        float64 // demand EWMA, tokens/s
}

// State returns a copy of key's state; false when the table does not hold
// the key.
func (t *Table) State(key quota.Key) (KeyState, bool) {
	e := t.keys.lookupFresh(key)
	if e == nil {
		return KeyState{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return KeyState{
		Tokens: e.tokens(), HasLease: e.view().hasLease, Deadline: t.timeOf(e.view().deadline), CheckClock: e.view().checkClock,
		LowWater: int64(e.view().lowWater), NegUntil: t.timeOf(e.view().negUntil), Mode: e.view().mode, OnFailure: e.view().onFailure,
		Shadow: e.view().shadow, Tier: e.view().tierName(), Limit: e.view().limit, RegionRate: e.view().regionRate,
		RegionBurst: e.view().regionBurst, Live: int64(e.view().live), Pending: e.pending, InFlight: e.has(inflightFlag),
		Degraded: e.has(degradedFlag), ToReturn: e.toReturn, Spent: e.spentLocked(), Rate: e.rate,
	}, true
}
