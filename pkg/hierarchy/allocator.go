package hierarchy

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// DefaultDemandAlpha is the EWMA weight of one epoch's observation in the
// demand estimate. 0.5 halves the weight of the past every epoch: a step
// in demand is 97% visible after five epochs, while a single quiet or
// noisy epoch moves the estimate only half way.
const DefaultDemandAlpha = 0.5

// ErrStaleReport is wrapped by the error Report returns for a report whose
// sequence number is below the last one seen from its region (a delayed
// duplicate of an already superseded report).
var ErrStaleReport = errors.New("stale region report")

// KeyLimit is one key's global limit.
type KeyLimit struct {
	// Rate is required: tokens per second, finite, > 0.
	Rate float64
	// Burst is required: tokens, finite, > 0.
	Burst float64
	// Unit is optional: the largest cost one request of the key may carry
	// (tokens, finite, > 0; 0 means 1). Static bursts and the burst split
	// among regions are whole units (see StaticBursts), so a region that
	// holds any of the burst can admit such a request.
	Unit float64
	// StaticRate and StaticBurst are optional: what each region (in the
	// allocator's region order) may run on without a grant, when that is
	// not the key's share under the allocator's weights — while regions run
	// different config revisions (see regionsync.Confirmations.Reserve).
	// Each is nil or has one finite value >= 0 per region; nil means
	// Rate·w_r/Σw and StaticBursts (for a drained region, their floor).
	// Not kept across SetRegions.
	StaticRate, StaticBurst []float64
	// FloorShare is optional: the fraction of its static share (in [0, 1])
	// a region runs the key on without a static lease, and the one a
	// drained region runs it on (Floor). 0 means none.
	FloorShare float64
	// FloorRate and FloorBurst are optional: each region's floor when it is
	// not Floor of Rate·w_r/Σw and StaticBursts (while regions run
	// different config revisions). Each is nil or has one finite value >= 0
	// per region. When StaticRate (StaticBurst) is given and FloorRate
	// (FloorBurst) is not, the floor is taken to be the static share: a
	// lapsed region's share is then not re-divided. Not kept across
	// SetRegions.
	FloorRate, FloorBurst []float64
}

// same reports whether l and o are the same limit: every field equal (a
// Unit of 0 equal to 1), the per-region shares element by element.
func (l KeyLimit) same(o KeyLimit) bool {
	return l.Rate == o.Rate && l.Burst == o.Burst && l.unit() == o.unit() && l.FloorShare == o.FloorShare &&
		slices.Equal(l.StaticRate, o.StaticRate) && slices.Equal(l.StaticBurst, o.StaticBurst) &&
		slices.Equal(l.FloorRate, o.FloorRate) && slices.Equal(l.FloorBurst, o.FloorBurst)
}

func (l KeyLimit) unit() float64 {
	if l.Unit == 0 {
		return 1
	}
	return l.Unit
}

// Options configures an Allocator.
type Options struct {
	// Regions is required: at least one, valid per ValidateRegions.
	Regions []Region
	// Epoch is required: the allocation period P (>= 1ms). Used for the
	// default silence timeout, the EWMA time scale and the shortest useful
	// grant validity.
	Epoch time.Duration
	// Validity is required: the grant validity V, >= Epoch, whole
	// milliseconds (truncated). Grants above a region's static share get
	// at most V minus about two epochs (see doc.go), so V >= 4·Epoch is
	// needed for them to be continuous; the design default is 5·Epoch.
	Validity time.Duration
	// SilenceTimeout is optional: a region with no report for longer is
	// silent and its share is frozen. Default 2·Epoch.
	SilenceTimeout time.Duration
	// DemandAlpha is optional: EWMA weight in (0, 1] of one Epoch's worth
	// of observation. Default DefaultDemandAlpha.
	DemandAlpha float64
	// RegionLease is optional: the static lease conferred in every answer
	// (see Answer.StaticLease), and with it when a silent region lapses.
	// Whole milliseconds (truncated), at least Validity. Default
	// max(1 minute, 2·Validity).
	RegionLease time.Duration
	// Lapsed is optional: the durable lapsed set (regions whose static
	// lease a previous leader may have found lapsed; see LapseDurable).
	// None of them is conferred a static lease while learning. Unknown
	// names are ignored.
	Lapsed []string
	// PriorValidity is optional: the longest validity the grants regions
	// hold when the Allocator starts may have been issued with, when a
	// config change shortened Validity. While learning, a held grant above
	// the static shares is re-issued with the validity it has left (its
	// expiry) up to max(Validity, PriorValidity), not cut to Validity.
	// Truncated to whole milliseconds; >= 0. 0 means Validity.
	PriorValidity time.Duration
}

// KeyDemand is one key's part of a region report (mirror of the wire
// KeyDemand, in Go units).
type KeyDemand struct {
	Key quota.Key
	// Admitted and Denied are tokens since the region's previous report;
	// finite, >= 0. A region that reads its demand as a rate instead (see
	// the wire's demand_rate) gives rate × Window as Admitted.
	Admitted, Denied float64
	// Window is the time Admitted and Denied cover; > 0.
	Window time.Duration
	// HeldRate (tokens/s) and HeldBurst (tokens) are the grant the region
	// holds, exactly as it received them; ignored when HeldValid is 0.
	HeldRate, HeldBurst float64
	// HeldValid is the held grant's remaining validity when the report was
	// sent; 0 when the region runs on its static share. >= 0.
	HeldValid time.Duration
	// Holding is the tokens the region holds against its burst cap (bucket
	// plus unspent leases); finite, >= 0.
	Holding float64
	// Released is the tokens the region's bucket gave up since its
	// previous report because a grant lowered its cap (transfer.go);
	// finite, >= 0.
	Released float64
}

// SetDemandRate makes a region's own rate reading (tokens/s) the demand kd
// carries: rate × Window as Admitted, no Denied. Set Window first.
func (kd *KeyDemand) SetDemandRate(rate float64) {
	kd.Admitted, kd.Denied = rate*kd.Window.Seconds(), 0
}

// Answer is the Allocator's answer to one region report.
type Answer struct {
	// Grants, in the order Report documents. Kept to answer a retry:
	// callers must not modify them.
	Grants []Grant
	// StaticLease, when > 0, confers a static lease: the region may run on
	// its static shares until the send time of the report this answers +
	// StaticLease, on its own clock. 0: none conferred (the region keeps
	// what it holds and never extends it). Whole milliseconds.
	StaticLease time.Duration
}

// Report is one region's report for one epoch (mirror of the wire
// RegionReport).
type Report struct {
	Region string
	// Seq is the region's sequence number; a report with the last seen Seq
	// is a retry and gets the same answer.
	Seq  uint64
	Keys []KeyDemand
}

// Grant is a lease on part of one key's global rate and burst.
type Grant struct {
	Key quota.Key
	// Rate is the refill rate in tokens/s the region may use while the
	// grant is valid.
	Rate float64
	// Burst is the region's burst cap in tokens while the grant is valid.
	Burst float64
	// Valid is measured on the region's clock from when it sent the report
	// this grant answers. Always whole milliseconds.
	Valid time.Duration
	// Deposit is the tokens other regions released that the region adds
	// to its bucket when it installs this grant, once (transfer.go); Burst
	// counts them. >= 0.
	Deposit float64
}

// Allocator is the global tier's state machine. It is safe for concurrent
// use: every method takes the internal lock, so calls are serialized.
type Allocator struct {
	mu sync.Mutex // guards every field below

	origin         time.Time
	clock          int64 // latest time seen (ns since origin); time never runs backwards inside
	epochNS        int64
	perEpochSecond float64 // 1 / (Epoch in seconds)
	validity       int64
	reissueMax     int64 // longest validity a held grant above the static shares is re-issued with while learning
	minValidity    int64
	silence        int64
	alpha          float64
	alphaWindow    int64   // cache: window of the last alpha computed
	alphaValue     float64 // cache: its alpha
	learnUntil     int64
	epochs         uint64
	regionLease    int64 // static lease conferred, ns (whole ms)
	lapseAfter     int64 // silence after which a region's static lease surely lapsed

	regions     []regionState
	regionIndex map[string]int
	nr          int
	fracs       []float64 // regions[i].frac, in a slice of their own for loadShares

	// Keys, indexed by key slot.
	keyIndex  map[quota.Key]int32
	keys      []quota.Key
	limits    []KeyLimit
	keyLive   []bool
	freeKeys  []int32
	byRank    []int32 // live key slots sorted by key
	rankDirty bool
	blockOf   []int32   // slot -> block, -1 when the key has no fencing state
	demand    []float64 // slot*nr + region: EWMA tokens/s
	sburst    []float64 // slot*nr + region: static burst cap (StaticBursts)
	lastObs   []uint32  // slot*nr + region: region's report count at the last observation, 0 = never
	wantAt    []int64   // slot*nr + region: time of the last reading above unitDemandFloor, negInf = none (see wantHold)
	wantDem   []float64 // slot*nr + region: the demand estimate after that reading
	seenStamp []uint32  // slot -> stamp of the report that last listed it
	seenPos   []int32   // slot -> its position in that report
	// named is when a report last named the key or an answer last carried
	// a grant for it (slot -> ns since origin; a key's SetLimit counts as
	// naming it at the latest time seen): ForgetIdle forgets a key by it.
	named []int64
	// grantEnd bounds from above when every grant issued for the key so
	// far ends (slot -> ns since origin, negInf = none issued): the last
	// of their record's ue. Grants at a region's static share leave no
	// fencing state once the key is uncontended (its block is freed), so
	// when a static share the allocator counts falls, this says whether
	// the region may still hold one at the old share (holdLoweredShares).
	grantEnd []int64
	stamp    uint32

	// Blocks: fencing state of the keys that get grants (contended, or
	// some region may still hold a non-static grant). A key has a block
	// exactly while it is active.
	fences         [][]fence // region -> block: a region's report walks its own fences in order
	summaries      []summary // block*nr + region, kept equal to fences[...].summarize
	targetRate     []float64 // block*nr + region
	targetBurst    []float64 // block*nr + region
	blockKey       []int32
	blockContended []bool
	freeBlocks     []int32
	transfer       []inFlight // block: tokens released and not yet deposited (transfer.go)
	wanted         []int      // scratch for credit

	// Target memos (memo.go): per block, the inputs its targets were
	// computed from.
	memo      []targetMemo
	memoIn    []float64 // block*memoStride(): capacity, pool, demands
	targetGen uint64    // bumped whenever a region's config or lapse state changes
	memoOff   bool      // tests and benchmarks: always recompute
	// plainRegions: no region is drained, lapsed or returning (kept by
	// sharesChanged), so loadShares may take its short way.
	plainRegions bool
	memoCheck    *memoCheck

	// active lists the keys that get grants: in key order as Allocate set
	// it, then the keys reports made contended since.
	active []int32

	// Scratch, reused across calls.
	fs                  fillScratch
	rateLane, burstLane lane
	w, lo, hi, dem, out []float64
	silent              []bool
	// nudge marks the regions that should report now (nudge.go); TakeNudges
	// drains it. Indexed by region.
	nudge      []bool
	reportIdx  []int32
	regs       []Region // scratch for StaticBursts
	us         unitScratch
	sh         shares    // loadShares
	sbs, sts   []float64 // scratch: static bursts and rates of reporting regions
	bout, udem []float64 // scratch for splitBurst
	role       []int8
}

type regionState struct {
	Region
	frac     float64 // Weight / Σ Weight
	reported bool
	lastSeq  uint64
	lastAt   int64
	nReports uint32
	sendLB   int64 // lower bound of the send time of its latest report
	// lastAnswerAt is when it was last answered: no report can prove a
	// later send-time bound than that.
	lastAnswerAt int64
	answer       []Grant
	// raisePending: the latest answer gave some key materially less than
	// its target because other regions had yet to acknowledge smaller
	// grants (see ReportAgain).
	raisePending bool
	unknown      []quota.Key // unknown keys in its latest report, sorted, at most maxUnknownShown
	unknownN     int
	prevOrder    []int32 // key slots in the order of its latest report
	lapseState
}

const maxUnknownShown = 16

// pendingShortfall is the fraction of a key's rate that a fenced grant
// must fall short of its target by to be worth an early report; smaller
// shortfalls wait for the next epoch.
const pendingShortfall = 0.05

// unitDemandFloor is the demand, as a fraction of a key's rate, above which
// a region whose static burst holds no whole unit makes the key contended
// (a decaying estimate never reaches zero on its own).
const unitDemandFloor = 1e-3

// NewAllocator validates opts and returns an Allocator in learning mode
// until now+Validity.
func NewAllocator(opts Options, now time.Time) (*Allocator, error) {
	if err := ValidateRegions(opts.Regions); err != nil {
		return nil, fmt.Errorf("hierarchy: options: %w", err)
	}
	if opts.Epoch < time.Millisecond {
		return nil, fmt.Errorf("hierarchy: options: %w: epoch %v must be at least 1ms", quota.ErrInvalid, opts.Epoch)
	}
	validity := opts.Validity.Truncate(time.Millisecond)
	if validity < opts.Epoch {
		return nil, fmt.Errorf("hierarchy: options: %w: validity %v must be at least the epoch %v", quota.ErrInvalid, opts.Validity, opts.Epoch)
	}
	if opts.SilenceTimeout < 0 {
		return nil, fmt.Errorf("hierarchy: options: %w: silence timeout %v is negative", quota.ErrInvalid, opts.SilenceTimeout)
	}
	silence := opts.SilenceTimeout
	if silence == 0 {
		silence = 2 * opts.Epoch
	}
	alpha := opts.DemandAlpha
	if alpha == 0 {
		alpha = DefaultDemandAlpha
	}
	if !finite(alpha) || alpha <= 0 || alpha > 1 {
		return nil, fmt.Errorf("hierarchy: options: %w: demand alpha %v must be in (0, 1]", quota.ErrInvalid, opts.DemandAlpha)
	}
	regionLease := opts.RegionLease.Truncate(time.Millisecond)
	if opts.RegionLease == 0 {
		regionLease = max(time.Minute, 2*validity)
	}
	if regionLease < validity {
		return nil, fmt.Errorf("hierarchy: options: %w: region lease %v must be at least the validity %v", quota.ErrInvalid, opts.RegionLease, validity)
	}
	if opts.PriorValidity < 0 {
		return nil, fmt.Errorf("hierarchy: options: %w: prior validity %v is negative", quota.ErrInvalid, opts.PriorValidity)
	}
	a := &Allocator{
		origin:         now,
		epochNS:        int64(opts.Epoch),
		perEpochSecond: float64(time.Second) / float64(opts.Epoch),
		validity:       int64(validity),
		reissueMax:     int64(max(validity, opts.PriorValidity.Truncate(time.Millisecond))),
		minValidity:    int64(min(opts.Epoch.Truncate(time.Millisecond), validity)),
		silence:        int64(silence),
		alpha:          alpha,
		alphaWindow:    int64(opts.Epoch),
		alphaValue:     alpha,
		keyIndex:       make(map[quota.Key]int32),
		regionLease:    int64(regionLease),
		lapseAfter:     int64(regionLease) + int64(validity) + LapseMargin(opts.Epoch, regionLease),
	}
	a.learnUntil = a.validity
	a.installRegions(opts.Regions)
	a.markLapsedSet(opts.Lapsed)
	a.fences = make([][]fence, a.nr)
	return a, nil
}

func (a *Allocator) installRegions(regions []Region) {
	a.nr = len(regions)
	a.regions = make([]regionState, len(regions))
	a.regionIndex = make(map[string]int, len(regions))
	var sum float64
	for _, r := range regions {
		sum += r.Weight
	}
	a.fracs = make([]float64, len(regions))
	for i, r := range regions {
		a.regions[i] = regionState{Region: r, frac: r.Weight / sum, sendLB: negInf, lastAnswerAt: negInf, lapseState: a.freshLapseState()}
		a.fracs[i] = a.regions[i].frac
		a.regionIndex[r.Name] = i
	}
	a.silent = make([]bool, a.nr)
	a.nudge = make([]bool, a.nr)
	a.resetMemo(len(a.blockKey))
}

// tick converts now to internal time, never moving backwards.
func (a *Allocator) tick(now time.Time) int64 {
	t := int64(now.Sub(a.origin))
	if t < a.clock {
		return a.clock
	}
	a.clock = t
	return t
}

// peek converts now like tick without moving the clock, for queries.
func (a *Allocator) peek(now time.Time) int64 { return max(int64(now.Sub(a.origin)), a.clock) }

func (a *Allocator) wall(t int64) time.Time { return a.origin.Add(time.Duration(t)) }

// Learning reports whether the Allocator is still in learning mode, only
// re-issuing what regions report they hold.
func (a *Allocator) Learning(now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peek(now) < a.learnUntil
}

// Epoch returns how many allocation epochs (Allocate calls) have run.
func (a *Allocator) Epoch() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epochs
}

// BecomeLeader forgets every grant, demand and report and restarts
// learning mode until now+Validity, keeping regions and limits. Call it
// when this process (re)gains leadership: while it was not leader another
// one may have issued grants it knows nothing about. lapsed is the durable
// lapsed set as read from the store (see LapseDurable): none of those
// regions is conferred a static lease while learning, and each counts as
// not heard from since now.
func (a *Allocator) BecomeLeader(now time.Time, lapsed ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tick(now)
	a.learnUntil = t + a.validity
	for b := range a.blockKey {
		if a.blockKey[b] >= 0 {
			a.freeBlock(int32(b))
		}
	}
	a.active = a.active[:0]
	clear(a.demand)
	clear(a.lastObs)
	clearWant(a.wantAt, a.wantDem)
	for i := range a.regions {
		r := a.regions[i].Region
		a.regions[i] = regionState{Region: r, frac: a.regions[i].frac, sendLB: negInf, lastAnswerAt: negInf, lapseState: a.freshLapseState()}
	}
	a.markLapsedSet(lapsed)
	a.sharesChanged()
}

// ExtendLearning keeps learning mode on until at least until, forgetting
// nothing, and reports whether it did: only an Allocator learning at now
// can extend (one that is not may have issued grants beyond what regions
// hold, so it must BecomeLeader first). It never shortens learning.
//
// A caller that must learn for longer than one Validity (grants issued
// under an older shard map or an older timing may outlive this
// Allocator's own learning) extends instead of calling BecomeLeader again
// when learning ends: that would forget the demand estimates and the
// grants re-issued so far and learn a whole Validity more.
//
// A region of the durable lapsed set that reported (returning) waits for
// the new end as it would have had it reported after it: a previous
// leader's grants may count it at its floor until learning ends.
func (a *Allocator) ExtendLearning(now, until time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tick(now)
	if t >= a.learnUntil {
		return false
	}
	end := int64(until.Sub(a.origin))
	if end <= a.learnUntil {
		return true
	}
	a.learnUntil = end
	for i := range a.regions {
		if rs := &a.regions[i]; rs.inSet && rs.returning {
			rs.confirmAt = max(rs.confirmAt, end)
		}
	}
	return true
}

// CheckReportKeys refuses rep, as Report would, when it names a key
// twice (an error wrapping quota.ErrInvalid that names both places), and
// changes nothing. The global daemon checks a report with it before the
// report changes anything there (the limits it sets, the config revisions
// it records): it finds each key where the region's previous report named
// it, as Report does, so a report whose keys keep their order costs no
// lookup in a map of its keys (the daemon's decoder kept one, which cost
// about a sixth of its epoch; BENCHMARKS.md, "The daemon's per-key maps").
func (a *Allocator) CheckReportKeys(rep Report) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var prev []int32
	if ri, ok := a.regionIndex[rep.Region]; ok {
		prev = a.regions[ri].prevOrder
	}
	seen := a.newReportSeenLocked()
	for j := range rep.Keys {
		key := rep.Keys[j].Key
		if first, dup := seen.note(a, j, a.slotLocked(prev, j, key), key); dup {
			return fmt.Errorf("%w: keys[%d].key %s duplicates keys[%d]", quota.ErrInvalid, j, key, first)
		}
	}
	return nil
}

// reportSeen finds the keys a report names twice, in one pass over its
// keys: a key with a slot by the slot's stamp (seenStamp, seenPos), a key
// without a limit by a map made only when the report has one.
type reportSeen struct {
	stamp     uint32
	unknownAt map[quota.Key]int
}

// newReportSeenLocked starts a pass with a fresh stamp. a.mu is held.
func (a *Allocator) newReportSeenLocked() reportSeen {
	return reportSeen{stamp: a.nextStampLocked()}
}

// note records that the report's keys[j] is key, at slot k (-1 for a key
// without a limit), and returns the place of an earlier mention of it,
// true when there is one. a.mu is held.
func (s *reportSeen) note(a *Allocator, j int, k int32, key quota.Key) (first int, dup bool) {
	if k < 0 {
		if s.unknownAt == nil {
			s.unknownAt = make(map[quota.Key]int)
		}
		if first, dup := s.unknownAt[key]; dup {
			return first, true
		}
		s.unknownAt[key] = j
		return 0, false
	}
	if a.seenStamp[k] == s.stamp {
		return int(a.seenPos[k]), true
	}
	a.seenStamp[k] = s.stamp
	a.seenPos[k] = int32(j)
	return 0, false
}

// nextStampLocked is a stamp no key slot carries yet (seenStamp), for one
// pass over a report's keys. a.mu is held.
func (a *Allocator) nextStampLocked() uint32 {
	a.stamp++
	if a.stamp == 0 { // wrapped: old stamps could collide
		clear(a.seenStamp)
		a.stamp = 1
	}
	return a.stamp
}

// slotLocked is the slot of key, the j-th key of a report of the region
// whose previous report's slots are prev: prev[j] when that holds key, as
// it does while the region keeps its keys' order, else the key map's, -1
// for a key without a limit. a.mu is held.
func (a *Allocator) slotLocked(prev []int32, j int, key quota.Key) int32 {
	if p := a.prevSlotLocked(prev, j, key); p >= 0 {
		return p
	}
	if p, ok := a.keyIndex[key]; ok {
		return p
	}
	return -1
}

// prevSlotLocked is prev[j] when that slot holds key, else -1. a.mu is
// held.
func (a *Allocator) prevSlotLocked(prev []int32, j int, key quota.Key) int32 {
	if j < len(prev) {
		if p := prev[j]; p >= 0 && a.keyLive[p] && a.keys[p] == key {
			return p
		}
	}
	return -1
}

// SetReportLimits sets the limit of each key rep names to limits[j], as
// SetLimit would one key after the other, ahead of reporting rep: the
// global daemon sets every reported key's limit from the config it serves
// the report under. It finds a key where the region's previous report
// named it, as Report does, so a report whose keys keep their limits costs
// no lookup in the key map (which, one SetLimit per key, cost the steady
// epoch as much again as the rest of it). len(limits) must be
// len(rep.Keys). On an error the limits before the failing key are set.
func (a *Allocator) SetReportLimits(rep Report, limits []KeyLimit) error {
	if len(limits) != len(rep.Keys) {
		return fmt.Errorf("hierarchy: set report limits: %w: %d limits for %d keys", quota.ErrInvalid, len(limits), len(rep.Keys))
	}
	var changed []int
	a.mu.Lock()
	var prev []int32
	if ri, ok := a.regionIndex[rep.Region]; ok {
		prev = a.regions[ri].prevOrder
	}
	for j := range rep.Keys {
		if p := a.prevSlotLocked(prev, j, rep.Keys[j].Key); p >= 0 && a.limits[p].same(limits[j]) {
			continue
		}
		changed = append(changed, j)
	}
	a.mu.Unlock()
	for _, j := range changed {
		if err := a.SetLimit(rep.Keys[j].Key, limits[j]); err != nil {
			return fmt.Errorf("keys[%d]: %w", j, err)
		}
	}
	return nil
}

// SetLimit sets or changes a key's global limit. A new limit applies to
// grants issued from now on; grants already issued stay valid until they
// expire (at most Validity). Setting the limit a key already has changes
// nothing: the daemon sets the limit of every key a report names (see
// SetReportLimits), and working the key's targets and summaries out again
// at every report cost five times the rest of the epoch (BENCHMARKS.md,
// "The daemon's limits set at every report").
func (a *Allocator) SetLimit(key quota.Key, l KeyLimit) error {
	// The limit a known key has was checked when it was set.
	a.mu.Lock()
	if k, ok := a.keyIndex[key]; ok && a.limits[k].same(l) {
		a.mu.Unlock()
		return nil
	}
	a.mu.Unlock()
	if err := key.Validate(); err != nil {
		return fmt.Errorf("hierarchy: set limit: %w", err)
	}
	if !finite(l.Rate) || l.Rate <= 0 {
		return fmt.Errorf("hierarchy: set limit %s: %w: rate %v must be a finite number > 0", key, quota.ErrInvalid, l.Rate)
	}
	if !finite(l.Burst) || l.Burst <= 0 {
		return fmt.Errorf("hierarchy: set limit %s: %w: burst %v must be a finite number > 0", key, quota.ErrInvalid, l.Burst)
	}
	if !finite(l.Unit) || l.Unit < 0 {
		return fmt.Errorf("hierarchy: set limit %s: %w: unit %v must be a finite number > 0 (0 means 1)", key, quota.ErrInvalid, l.Unit)
	}
	if !finite(l.FloorShare) || l.FloorShare < 0 || l.FloorShare > 1 {
		return fmt.Errorf("hierarchy: set limit %s: %w: floor share %v must be in [0, 1]", key, quota.ErrInvalid, l.FloorShare)
	}
	for _, v := range [][]float64{l.StaticRate, l.StaticBurst, l.FloorRate, l.FloorBurst} {
		if v == nil {
			continue
		}
		if len(v) != len(a.regions) {
			return fmt.Errorf("hierarchy: set limit %s: %w: %d static shares for %d regions", key, quota.ErrInvalid, len(v), len(a.regions))
		}
		for _, x := range v {
			if !finite(x) || x < 0 {
				return fmt.Errorf("hierarchy: set limit %s: %w: static share %v must be a finite number >= 0", key, quota.ErrInvalid, x)
			}
		}
	}
	l.StaticRate, l.StaticBurst = slices.Clone(l.StaticRate), slices.Clone(l.StaticBurst)
	l.FloorRate, l.FloorBurst = slices.Clone(l.FloorRate), slices.Clone(l.FloorBurst)
	a.mu.Lock()
	defer a.mu.Unlock()
	if k, ok := a.keyIndex[key]; ok {
		if a.limits[k].same(l) {
			return nil // set in between
		}
		before := a.countedShares(k)
		a.limits[k] = l
		a.setStaticBursts(k)
		a.holdLoweredShares(k, before)
		if b := a.blockOf[k]; b >= 0 {
			a.forgetTargets(b)
			a.resummarize(b)
		}
		return nil
	}
	var k int32
	if n := len(a.freeKeys); n > 0 {
		k = a.freeKeys[n-1]
		a.freeKeys = a.freeKeys[:n-1]
		a.keys[k] = key
		a.limits[k] = l
		a.keyLive[k] = true
		a.blockOf[k] = -1
		a.grantEnd[k] = negInf
		a.named[k] = a.clock
	} else {
		k = int32(len(a.keys))
		a.keys = append(a.keys, key)
		a.limits = append(a.limits, l)
		a.keyLive = append(a.keyLive, true)
		a.blockOf = append(a.blockOf, -1)
		a.seenStamp = append(a.seenStamp, 0)
		a.seenPos = append(a.seenPos, 0)
		a.named = append(a.named, a.clock)
		a.grantEnd = append(a.grantEnd, negInf)
		a.demand = append(a.demand, make([]float64, a.nr)...)
		a.sburst = append(a.sburst, make([]float64, a.nr)...)
		a.lastObs = append(a.lastObs, make([]uint32, a.nr)...)
		a.wantAt = append(a.wantAt, make([]int64, a.nr)...)
		a.wantDem = append(a.wantDem, make([]float64, a.nr)...)
		clearWant(a.wantAt[len(a.wantAt)-a.nr:], a.wantDem[len(a.wantDem)-a.nr:])
	}
	a.setStaticBursts(k)
	a.keyIndex[key] = k
	a.rankDirty = true
	return nil
}

// RemoveKey forgets a key. Grants already issued for it stay valid at the
// regions until they expire. Unknown keys are ignored.
func (a *Allocator) RemoveKey(key quota.Key) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.keyIndex[key]
	if !ok {
		return
	}
	a.removeLocked(k)
	a.compactLocked()
}

// removeLocked is RemoveKey for the live slot k, without the renumbering
// (compactLocked) that follows. a.mu is held.
func (a *Allocator) removeLocked(k int32) {
	key := a.keys[k]
	if b := a.blockOf[k]; b >= 0 {
		a.freeBlock(b)
	}
	delete(a.keyIndex, key)
	a.keys[k] = quota.Key{}
	a.keyLive[k] = false
	for i := 0; i < a.nr; i++ {
		a.demand[int(k)*a.nr+i] = 0
		a.lastObs[int(k)*a.nr+i] = 0
	}
	clearWant(a.wantAt[int(k)*a.nr:int(k+1)*a.nr], a.wantDem[int(k)*a.nr:int(k+1)*a.nr])
	a.freeKeys = append(a.freeKeys, k)
	a.rankDirty = true
}

// SetRegions replaces the region list (config reload). Regions are matched
// by name: a kept region keeps its reports, demand and grants; a new one
// starts silent; a removed one is forgotten together with the grants it
// holds, so remove a region only after it stopped serving. Weights take
// effect at once for static shares.
func (a *Allocator) SetRegions(regions []Region) error {
	if err := ValidateRegions(regions); err != nil {
		return fmt.Errorf("hierarchy: set regions: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	oldNR := a.nr
	old := a.regions
	oldFences := a.fences
	// What each key that may have live grants was counted at, by the
	// regions' old indices (holdLoweredShares).
	before := map[int32][]float64{}
	for k := range a.keys {
		if !a.keyLive[k] {
			continue
		}
		if sh := a.countedShares(int32(k)); sh != nil {
			before[int32(k)] = sh
		}
	}
	from := make([]int, len(regions)) // new index -> old index or -1
	for i, r := range regions {
		from[i] = -1
		if j, ok := a.regionIndex[r.Name]; ok {
			from[i] = j
		}
	}
	a.installRegions(regions)
	for i, j := range from {
		if j >= 0 {
			st := old[j]
			st.Region = regions[i]
			st.frac = a.regions[i].frac
			a.regions[i] = st
		}
	}
	nr := a.nr
	relayoutF := func(src []float64, stride int) []float64 {
		dst := make([]float64, len(src)/max(stride, 1)*nr)
		for k := 0; k < len(src)/max(stride, 1); k++ {
			for i, j := range from {
				if j >= 0 {
					dst[k*nr+i] = src[k*stride+j]
				}
			}
		}
		return dst
	}
	a.demand = relayoutF(a.demand, oldNR)
	a.sburst = make([]float64, len(a.keys)*nr)
	for k := range a.keys {
		a.limits[k].StaticRate, a.limits[k].StaticBurst = nil, nil
		a.limits[k].FloorRate, a.limits[k].FloorBurst = nil, nil
		a.setStaticBursts(int32(k))
	}
	lastObs := make([]uint32, len(a.keys)*nr)
	for k := range a.keys {
		for i, j := range from {
			if j >= 0 {
				lastObs[k*nr+i] = a.lastObs[k*oldNR+j]
			}
		}
	}
	a.lastObs = lastObs
	wantAt := make([]int64, len(a.keys)*nr)
	wantDem := make([]float64, len(a.keys)*nr)
	clearWant(wantAt, wantDem)
	for k := range a.keys {
		for i, j := range from {
			if j >= 0 {
				wantAt[k*nr+i], wantDem[k*nr+i] = a.wantAt[k*oldNR+j], a.wantDem[k*oldNR+j]
			}
		}
	}
	a.wantAt, a.wantDem = wantAt, wantDem
	nb := len(a.blockKey)
	fences := make([][]fence, nr)
	for i, j := range from {
		if j >= 0 {
			fences[i] = oldFences[j]
		} else {
			fences[i] = make([]fence, nb)
		}
	}
	a.fences = fences
	a.summaries = make([]summary, nb*nr)
	a.targetRate = relayoutF(a.targetRate, oldNR)
	a.targetBurst = relayoutF(a.targetBurst, oldNR)
	for b := 0; b < nb; b++ {
		if a.blockKey[b] < 0 {
			continue
		}
		k := a.blockKey[b]
		for i, j := range from {
			if j < 0 {
				a.targetRate[b*nr+i], a.targetBurst[b*nr+i] = a.fallback(k, i)
			}
		}
		a.resummarize(int32(b))
	}
	a.sharesChanged() // the kept regions' lapse states are back
	for k, sh := range before {
		kept := make([]float64, 2*nr)
		for i, j := range from {
			kept[2*i], kept[2*i+1] = math.Inf(-1), math.Inf(-1) // a new region held nothing
			if j >= 0 {
				kept[2*i], kept[2*i+1] = sh[2*j], sh[2*j+1]
			}
		}
		a.holdLoweredShares(k, kept)
	}
	return nil
}

// countedShares is what key slot k's regions are counted at without a
// grant (counted: rate, burst, for each region in order), or nil when no
// grant issued for k may still be held (grantEnd). a.mu is held.
func (a *Allocator) countedShares(k int32) []float64 {
	if a.grantEnd[k] <= a.clock {
		return nil
	}
	out := make([]float64, 2*a.nr)
	for i := 0; i < a.nr; i++ {
		out[2*i], out[2*i+1] = a.counted(k, i)
	}
	return out
}

// holdLoweredShares keeps counting a region at its former share of key
// slot k where the share it is counted at fell (a config change, or a
// revision the global tier now holds lowering Confirmations.Reserve)
// while a grant issued at the former share may still be held. A grant
// equal to a region's share leaves no fencing state once the key is
// uncontended (Allocate frees its block), so nothing else remembers it:
// the region may run that grant until it expires, above what the other
// regions' grants now leave it. So it gets a pseudo record of the former
// share up to the end of k's grants (grantEnd), with no known fallback;
// the key is active (it has a block) until that record ends. before is
// countedShares from before the change, by the current region indices
// (-Inf for a region that was not there). a.mu is held.
func (a *Allocator) holdLoweredShares(k int32, before []float64) {
	if before == nil || a.grantEnd[k] <= a.clock {
		return
	}
	b := a.blockOf[k]
	added := false
	for i := 0; i < a.nr; i++ {
		oldR, oldB := before[2*i], before[2*i+1]
		newR, newB := a.counted(k, i)
		lowerR := newR < oldR && !nearStatic(newR, oldR)
		lowerB := newB < oldB && !nearStatic(newB, oldB)
		if !lowerR && !lowerB {
			continue
		}
		if b < 0 {
			b = a.newBlock(k)
			a.active = append(a.active, k)
		}
		rec := grantRec{rate: max(oldR, newR), burst: max(oldB, newB), ue: a.grantEnd[k], le: negInf, at: negInf, flags: recPseudo}
		if f := &a.fences[i][b]; !f.covers(rec) {
			f.addOldest(rec)
			added = true
		}
	}
	if added {
		a.resummarize(b)
	}
}

// setStaticBursts computes key slot k's static burst caps (a free slot
// keeps whatever it had; it is recomputed when reused).
func (a *Allocator) setStaticBursts(k int32) {
	base := int(k) * a.nr
	a.regs = growRegions(a.regs, a.nr)
	for i := range a.regions {
		a.regs[i] = a.regions[i].Region
	}
	l := a.limits[k]
	if l.StaticBurst != nil {
		copy(a.sburst[base:base+a.nr], l.StaticBurst)
		return
	}
	StaticBursts(l.Burst, l.unit(), a.regs[:a.nr], a.sburst[base:base+a.nr])
}

func growRegions(s []Region, n int) []Region {
	if cap(s) < n {
		return make([]Region, n)
	}
	return s[:n]
}

// static is region i's static rate and burst cap for key slot k: what it
// may run on without a grant while it holds a static lease (a drained
// region's is its floor).
func (a *Allocator) static(k int32, i int) (float64, float64) {
	l := &a.limits[k]
	s, sb := l.Rate*a.regions[i].frac, a.sburst[int(k)*a.nr+i]
	if a.regions[i].Drained {
		fr, fb := Floor(s, sb, l.FloorShare, l.unit())
		if l.StaticRate == nil {
			s = fr
		}
		if l.StaticBurst == nil {
			sb = fb
		}
	}
	if l.StaticRate != nil {
		s = l.StaticRate[i]
	}
	return s, sb
}

// floorOf is region i's floor for key slot k: what it runs on without a
// static lease (see KeyLimit.FloorShare).
func (a *Allocator) floorOf(k int32, i int) (float64, float64) {
	l := &a.limits[k]
	s, sb := a.static(k, i)
	fr, fb := Floor(l.Rate*a.regions[i].frac, a.sburst[int(k)*a.nr+i], l.FloorShare, l.unit())
	switch {
	case l.FloorRate != nil:
		fr = l.FloorRate[i]
	case l.StaticRate != nil:
		fr = s
	}
	switch {
	case l.FloorBurst != nil:
		fb = l.FloorBurst[i]
	case l.StaticBurst != nil:
		fb = sb
	}
	return fr, fb
}

// fallback is what region i may run key slot k on once its grants expired,
// as far as its own grants are concerned: its floor while it may hold no
// static lease (lapsed, or returning and not yet conferred one), else its
// static share.
func (a *Allocator) fallback(k int32, i int) (float64, float64) {
	if rs := &a.regions[i]; rs.lapsed || rs.returning {
		return a.floorOf(k, i)
	}
	return a.static(k, i)
}

// counted is what the other regions' grants assume region i may run key
// slot k on without a grant: its floor once its lapse is durable, else its
// static share (a returning region counts at its static share from its
// first report on, so that its static lease can be conferred once the
// grants issued before are gone).
func (a *Allocator) counted(k int32, i int) (float64, float64) {
	if a.regions[i].lapsed {
		return a.floorOf(k, i)
	}
	return a.static(k, i)
}

// shares is one key's static, fallback and counted rate and burst in
// every region (static, fallback, counted), worked out once for the
// decisions one call makes about the key: they change only with its limit
// and with the regions' config and lease states, and none of those
// changes while a key is being decided.
type shares struct {
	sR, sB, fR, fB, cR, cB [MaxRegions]float64
	// sumR, sumB: Σ static shares in region order; freedR, freedB: what
	// they leave of the limit (0 within float rounding), for freed.
	sumR, sumB     float64
	freedR, freedB float64
	lapsed         bool // some region is lapsed
}

// loadShares computes a.sh for key slot k and returns it.
func (a *Allocator) loadShares(k int32) *shares {
	sh := &a.sh
	sh.lapsed = false
	var sumR, sumB float64
	l := &a.limits[k]
	if a.plainRegions && l.StaticRate == nil && l.StaticBurst == nil {
		// What static, fallback and counted come to when no region is
		// drained, lapsed or returning and the key has no per-region
		// static shares: Rate·w_r/Σw and the static burst, everywhere.
		// (Every slice is cut to the regions first, so that the loop
		// checks no index.)
		sb := a.sburst[int(k)*a.nr : int(k)*a.nr+a.nr]
		fracs := a.fracs[:len(sb)]
		sR, sB, fR, fB := sh.sR[:len(sb)], sh.sB[:len(sb)], sh.fR[:len(sb)], sh.fB[:len(sb)]
		cR, cB := sh.cR[:len(sb)], sh.cB[:len(sb)]
		for i, b := range sb {
			s := l.Rate * fracs[i]
			sR[i], sB[i] = s, b
			fR[i], fB[i] = s, b
			cR[i], cB[i] = s, b
			sumR += s
			sumB += b
		}
		return sh.summed(l, sumR, sumB)
	}
	for i := 0; i < a.nr; i++ {
		s, sb := a.static(k, i)
		sh.sR[i], sh.sB[i] = s, sb
		sumR += s
		sumB += sb
		fr, fb := s, sb
		if rs := &a.regions[i]; rs.lapsed || rs.returning {
			fr, fb = a.floorOf(k, i)
		}
		sh.fR[i], sh.fB[i] = fr, fb
		sh.cR[i], sh.cB[i] = s, sb
		if a.regions[i].lapsed {
			sh.cR[i], sh.cB[i] = fr, fb
			sh.lapsed = true
		}
	}
	return sh.summed(l, sumR, sumB)
}

// summed records the sums of the static shares (in region order) and what
// they leave of l, and returns sh.
func (sh *shares) summed(l *KeyLimit, sumR, sumB float64) *shares {
	sh.sumR, sh.sumB = sumR, sumB
	sh.freedR, sh.freedB = 0, 0
	if d := l.Rate - sumR; math.Abs(d) > 1e-9*l.Rate {
		sh.freedR = d
	}
	if d := l.Burst - sumB; math.Abs(d) > 1e-9*l.Burst {
		sh.freedB = d
	}
	return sh
}

// freed is what key slot k's static shares leave of its rate and burst
// (drained regions, or shares under several config revisions), plus what
// the regions counted below their static share (lapsed) leave, as seen
// from region x: the headroom a grant to x may use on top of the one-step
// summaries. Float rounding of the static shares (up to 1e-9 of the
// limit) counts as none.
func (a *Allocator) freed(x int, sh *shares) (rate, burst float64) {
	var adjR, adjB float64
	for y := 0; y < a.nr && sh.lapsed; y++ {
		if y != x && a.regions[y].lapsed {
			adjR += sh.sR[y] - sh.cR[y]
			adjB += sh.sB[y] - sh.cB[y]
		}
	}
	if sh.freedR != 0 {
		adjR += sh.freedR
	}
	if sh.freedB != 0 {
		adjB += sh.freedB
	}
	return adjR, adjB
}

func (a *Allocator) resummarize(b int32) {
	k := a.blockKey[b]
	for i := 0; i < a.nr; i++ {
		j := int(b)*a.nr + i
		s, sb := a.counted(k, i)
		a.summaries[j] = a.fences[i][b].summarize(a.clock, s, sb)
	}
}

// resummarizeAll recomputes every block's summaries, after a region's
// counted static share changed.
func (a *Allocator) resummarizeAll() {
	for b := range a.blockKey {
		if a.blockKey[b] >= 0 {
			a.resummarize(int32(b))
		}
	}
}

// newBlock gives key slot k fencing state, with static targets.
func (a *Allocator) newBlock(k int32) int32 {
	var b int32
	if n := len(a.freeBlocks); n > 0 {
		b = a.freeBlocks[n-1]
		a.freeBlocks = a.freeBlocks[:n-1]
	} else {
		b = int32(len(a.blockKey))
		a.blockKey = append(a.blockKey, -1)
		a.blockContended = append(a.blockContended, false)
		a.transfer = append(a.transfer, inFlight{})
		for i := range a.fences {
			a.fences[i] = append(a.fences[i], fence{})
		}
		a.summaries = append(a.summaries, make([]summary, a.nr)...)
		a.targetRate = append(a.targetRate, make([]float64, a.nr)...)
		a.targetBurst = append(a.targetBurst, make([]float64, a.nr)...)
		a.growMemo(len(a.blockKey))
	}
	a.forgetTargets(b)
	a.blockKey[b] = k
	a.blockContended[b] = false
	a.transfer[b] = inFlight{}
	a.blockOf[k] = b
	for i := 0; i < a.nr; i++ {
		j := int(b)*a.nr + i
		s, sb := a.counted(k, i)
		a.fences[i][b] = fence{}
		a.summaries[j] = a.fences[i][b].summarize(a.clock, s, sb)
		a.targetRate[j], a.targetBurst[j] = a.fallback(k, i)
	}
	return b
}

func (a *Allocator) freeBlock(b int32) {
	k := a.blockKey[b]
	if k >= 0 {
		a.blockOf[k] = -1
	}
	a.blockKey[b] = -1
	a.blockContended[b] = false
	a.transfer[b] = inFlight{}
	a.forgetTargets(b)
	for i := range a.fences {
		a.fences[i][b] = fence{}
	}
	a.freeBlocks = append(a.freeBlocks, b)
}

func (a *Allocator) refreshRank() {
	if !a.rankDirty {
		return
	}
	a.byRank = a.byRank[:0]
	for k, live := range a.keyLive {
		if live {
			a.byRank = append(a.byRank, int32(k))
		}
	}
	slices.SortFunc(a.byRank, func(x, y int32) int {
		kx, ky := a.keys[x], a.keys[y]
		if c := cmp.Compare(kx.Tenant, ky.Tenant); c != 0 {
			return c
		}
		return cmp.Compare(kx.Class, ky.Class)
	})
	a.rankDirty = false
}

// decay is (1-alpha)^n: the weight left to an estimate after n reports
// that did not mention the key (zero observations).
func (a *Allocator) decay(n uint32) float64 {
	switch n {
	case 0:
		return 1
	case 1:
		return 1 - a.alpha
	}
	return math.Pow(1-a.alpha, float64(n))
}

// alphaFor scales the EWMA weight to the report's window, so a report
// covering two epochs counts like two one-epoch reports.
func (a *Allocator) alphaFor(window int64) float64 {
	if window == a.alphaWindow {
		return a.alphaValue
	}
	v := 1 - math.Pow(1-a.alpha, float64(window)/float64(a.epochNS))
	a.alphaWindow, a.alphaValue = window, v
	return v
}

// effectiveDemand is region i's demand estimate for key slot k at t: the
// decayed EWMA, held up while the region asked recently (held).
func (a *Allocator) effectiveDemand(k int32, i int, t int64) float64 {
	j := int(k)*a.nr + i
	return a.held(a.estimate(k, i), a.wantAt[j], a.wantDem[j], t, &a.limits[k])
}

// estimate is region i's decayed demand estimate for key slot k, as its
// readings made it (what View shows).
func (a *Allocator) estimate(k int32, i int) float64 {
	j := int(k)*a.nr + i
	return a.decayed(a.demand[j], a.lastObs[j], a.regions[i].nReports)
}

// sparseRequests is how many requests a demand estimate must expect over a
// hold for a reading of none to be taken as none: a steady Poisson demand
// reads none over that long once in e^5 (about 150) such spans.
const sparseRequests = 5

// wantHold is how long, in ns, a region that asked for key l stays
// counted as asking after its last reading above unitDemandFloor: the
// longer of the grant validity and the time the key refills one unit
// (unit / rate). A key whose demand is below one request per epoch reads
// none in many epochs (a 1 s epoch sees 0 or 1 request of a 0.7/s key),
// and a slow key's unit is worth keeping where it was asked for: moved
// away, the region it went to starts it empty and refills it at the key's
// rate, so each move costs up to unit / rate of admissions, and readings
// that flip each epoch moved a 1/m key's only unit every few seconds and
// admitted nothing at all.
func (a *Allocator) wantHold(l *KeyLimit) int64 {
	h := l.unit() / l.Rate * 1e9
	if !(h < float64(math.MaxInt64/8)) {
		return math.MaxInt64 / 8
	}
	return max(a.validity, int64(h))
}

// held is demand estimate d of a region whose last reading above
// unitDemandFloor came at wantAt with estimate wantDem, at t, when d
// itself is at or below the floor (a reading of nothing). Within
// wantHold of it the region still counts as asking (above the floor, so
// it keeps or gets a unit), and at wantDem for the longer of
// sparseRequests / wantDem seconds and the time the key refills a unit
// (within the hold): an empty reading of sparse demand is not a sign that
// the demand stopped, and one over less than a unit's refill says nothing
// the unit's holder could use (while readings that fall to nothing move
// the rate, and with it a key's only units, between regions that all
// want them). Later, d as it is.
func (a *Allocator) held(d float64, wantAt int64, wantDem float64, t int64, l *KeyLimit) float64 {
	// A reading above the floor, the usual case of a contended key, is
	// taken as it is before the hold, and its division, is worked out.
	floor := unitDemandFloor * l.Rate
	if wantAt == negInf || d > floor {
		return d
	}
	age, hold := t-wantAt, a.wantHold(l)
	if age >= hold {
		return d
	}
	if float64(age) < min(max(sparseRequests/wantDem, l.unit()/l.Rate)*1e9, float64(hold)) {
		return max(d, wantDem, 2*floor)
	}
	return 2 * floor
}

// decayed is an estimate d last observed at report count last (0: never)
// of a region now at report count n: d less what the reports since that
// did not mention the key took away.
func (a *Allocator) decayed(d float64, last, n uint32) float64 {
	if last == 0 {
		return 0
	}
	if n == last {
		return d // × decay(0) = 1
	}
	return d * a.decay(n-last)
}

// effectiveDemands writes effectiveDemand(k, i) of every region i into
// dem[i], reading the key's row of estimates in one pass.
func (a *Allocator) effectiveDemands(k int32, dem []float64, t int64) {
	row := int(k) * a.nr
	demand, lastObs := a.demand[row:row+a.nr], a.lastObs[row:row+a.nr]
	wantAt, wantDem := a.wantAt[row:row+a.nr], a.wantDem[row:row+a.nr]
	regions := a.regions[:a.nr]
	l := &a.limits[k]
	floor := unitDemandFloor * l.Rate
	dem = dem[:a.nr]
	for i := range dem {
		d := a.decayed(demand[i], lastObs[i], regions[i].nReports)
		if d <= floor && wantAt[i] != negInf {
			// held takes any other reading as it is; a contended key's
			// regions mostly read above the floor, so the call is rare.
			d = a.held(d, wantAt[i], wantDem[i], t, l)
		}
		dem[i] = d
	}
}

// clearWant marks every (key, region) of wantAt and wantDem as never
// having asked.
func clearWant(wantAt []int64, wantDem []float64) {
	for i := range wantAt {
		wantAt[i] = negInf
	}
	clear(wantDem)
}

// aboveStatic reports whether region i's demand for key slot k needs a
// grant: it is above the region's fallback rate s, or the region has
// demand but its fallback burst sb holds no whole unit (only a grant can
// give it one).
func (a *Allocator) aboveStatic(k int32, i int, s, sb float64, t int64) bool {
	return needsGrant(a.effectiveDemand(k, i, t), s, sb, &a.limits[k])
}

// needsGrant is aboveStatic for demand d of a key limited by l.
func needsGrant(d, s, sb float64, l *KeyLimit) bool {
	return d > s || (sb < l.unit() && d > unitDemandFloor*l.Rate)
}

// Allocate runs one epoch: it recomputes the targets of every key from the
// current demand estimates and decides which keys need grants. Call it
// every Epoch. Keys whose demand fits in the static shares everywhere get
// no grants once no region may hold anything but its static share.
func (a *Allocator) Allocate(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tick(now)
	a.epochs++
	a.refreshRank()
	nr := a.nr
	a.markSilent(t)
	ensure(&a.dem, nr)
	a.active = a.active[:0]
	for _, k := range a.byRank {
		sh := a.loadShares(k)
		l := &a.limits[k]
		contended := false
		a.effectiveDemands(k, a.dem, t)
		for i := 0; i < nr; i++ {
			if !a.silent[i] && needsGrant(a.dem[i], sh.fR[i], sh.fB[i], l) {
				contended = true
			}
		}
		b := a.blockOf[k]
		if !contended {
			if b < 0 {
				continue
			}
			nonStatic := false
			for i := 0; i < nr && !nonStatic; i++ {
				nonStatic = a.fences[i][b].hasNonStatic(t, sh.fR[i], sh.fB[i])
			}
			if !nonStatic {
				a.freeBlock(b)
				continue
			}
			for i := 0; i < nr; i++ {
				a.targetRate[int(b)*nr+i], a.targetBurst[int(b)*nr+i] = sh.fR[i], sh.fB[i]
			}
			a.forgetTargets(b)
			a.blockContended[b] = false
			a.active = append(a.active, k)
			continue
		}
		if b < 0 {
			b = a.newBlock(k)
		}
		a.computeTargets(t, k, b, sh)
		a.blockContended[b] = true
		a.active = append(a.active, k)
	}
	a.compactLocked()
}

// markSilent sets a.silent: a region is silent at t when it never
// reported, its last report is older than the silence timeout, or its
// static lease lapsed.
func (a *Allocator) markSilent(t int64) {
	for i := range a.regions {
		rs := &a.regions[i]
		a.silent[i] = !rs.reported || t-rs.lastAt > a.silence || rs.lapsed
	}
}

// retarget recomputes a contended key's targets from the demand estimates
// as they are now, so a region's report is answered from its own newest
// demand instead of the one the last Allocate saw: a donor gets its
// smaller grant, and a recipient what headroom there is, one allocation
// period earlier after a demand shift. Which regions are silent is decided
// anew too (the caller ran markSilent at t): a region that reported since
// the last Allocate (the first report of a new key's donors) is not frozen
// at its static share. Targets never affect safety (every grant is
// fenced), only which of the safe grants is chosen.
func (a *Allocator) retarget(t int64, k, b int32, sh *shares) {
	ensure(&a.dem, a.nr)
	a.effectiveDemands(k, a.dem, t)
	a.computeTargets(t, k, b, sh)
}

// computeTargets water-fills key k's rate over the regions that report,
// with silent regions frozen at what they may be using (max of their
// grant and static share), and splits the burst in proportion to the
// rates, in whole units (splitUnits): regions with demand but no unit come
// first, so a small burst is where the requests are, and when only regions
// gaining rate could spare one, one of them is held a hair below its
// static rate instead (unitDonor).
func (a *Allocator) computeTargets(t int64, k, b int32, sh *shares) {
	nr := a.nr
	l := &a.limits[k]
	base := int(b) * nr
	dem := a.dem[:nr]
	capacity, pool := l.Rate, l.Burst
	// The silent regions' targets, what they leave, and the reporting
	// regions' demands packed to 0..n-1: all that may change from one
	// call to the next without the generation (see targetMemo). With no
	// region silent (the usual case) the demands are packed already and
	// the limit is left whole.
	var silent uint64
	n := nr
	if slices.Contains(a.silent[:nr], true) {
		n = 0
		for i := 0; i < nr; i++ {
			if !a.silent[i] {
				dem[n] = dem[i]
				n++
				continue
			}
			silent |= 1 << i
			f := &a.summaries[base+i]
			s, sb := sh.cR[i], sh.cB[i]
			fr, fb := s, sb
			if f.rateT > t {
				fr = max(f.rateV, s)
			}
			if f.burstT > t {
				fb = max(f.burstV, sb)
			}
			a.targetRate[base+i], a.targetBurst[base+i] = fr, fb
			capacity -= fr
			pool -= fb
		}
	}
	if n == 0 {
		return
	}
	capacity = max(capacity, 0)
	pool = max(pool, 0)
	if a.targetsCurrent(b, silent, capacity, pool, dem[:n]) {
		if a.memoCheck != nil {
			a.memoCheck.verify(a, k, b, func() { a.fillTargets(l, sh, base, n, capacity, pool) })
		}
		return
	}
	a.fillTargets(l, sh, base, n, capacity, pool)
	a.rememberTargets(b, silent, capacity, pool, dem[:n])
}

// fillTargets is computeTargets' water-fill and burst split over the n
// reporting regions, whose demands computeTargets packed into a.dem,
// writing their targets into block base/nr's. Besides those demands,
// capacity and pool it reads only the key's limit and shares and the
// regions' config: nothing that can change without changing what
// targetsCurrent compares.
func (a *Allocator) fillTargets(l *KeyLimit, sh *shares, base, n int, capacity, pool float64) {
	nr := a.nr
	unit, demandFloor := l.unit(), unitDemandFloor*l.Rate
	ensure(&a.w, nr)
	ensure(&a.lo, nr)
	ensure(&a.hi, nr)
	ensure(&a.out, nr)
	ensure(&a.sbs, nr)
	ensure(&a.sts, nr)
	w, lo, hi, dem, sbs, sts := a.w[:n], a.lo[:n], a.hi[:n], a.dem[:n], a.sbs[:n], a.sts[:n]
	// The reporting regions, packed to 0..n-1 as their demands: weights,
	// floors, ceilings, fallback rates and bursts, and the sums over them
	// (in region order, as every sum below).
	var sumLo, sumHi float64
	wanting := 0
	j := 0
	for i := 0; i < nr; i++ {
		if a.silent[i] {
			continue
		}
		rg := &a.regions[i]
		w[j] = rg.Weight
		lo[j] = rg.MinShare * l.Rate
		hi[j] = rg.maxShare() * l.Rate
		if rg.Drained {
			// Its share goes to the others: it is served up to its floor.
			s := sh.sR[i]
			hi[j] = min(hi[j], s)
			lo[j] = min(lo[j], hi[j])
		}
		sts[j], sbs[j] = sh.fR[i], sh.fB[i]
		sumLo += lo[j]
		sumHi += hi[j]
		if dem[j] > demandFloor {
			wanting++
		}
		j++
	}
	// A region with demand whose static burst holds no whole unit can
	// only admit once a grant gives it one, and a grant can raise its
	// burst only while it is not below its static rate (see splitUnits):
	// such a region gets at least a hair above its static rate, where it
	// fits, when the pool has a unit for every region with demand (else
	// units would only move between regions that all want them).
	ensure(&a.role, n)
	spare := float64(wanting) <= math.Floor(pool/unit)
	if spare {
		var cut float64
		hasCut := false // some region without demand may give units away
		for j := 0; j < n; j++ {
			s, sb := sts[j], sbs[j]
			has := dem[j] > demandFloor
			if sb < unit && has {
				if f := min(hi[j], s*(1+1e-9)); f > lo[j] && sumLo+f-lo[j] <= capacity {
					sumLo += f - lo[j]
					lo[j] = f
				}
			}
			if sb >= unit && !has {
				cut += hi[j] - max(lo[j], min(hi[j], s*(1-1e-9)))
				hasCut = true
			}
		}
		if hasCut && wanting > 0 && sumHi-cut >= capacity {
			// Regions without demand may give their units away: a hair
			// below their static rate, when the others can take the rest.
			for j := 0; j < n; j++ {
				if sbs[j] >= unit && !(dem[j] > demandFloor) {
					hi[j] = max(lo[j], min(hi[j], sts[j]*(1-1e-9)))
				}
			}
		}
	}
	ensure(&a.bout, n)
	ensure(&a.udem, n)
	// A region can give up units only while below its static rate
	// (splitUnits: a region gaining rate has a short grant, and a unit
	// lent on it would have to come back before the borrower's grant
	// could end), so when a region with demand is left without one, the
	// region that can spare the most units is held a hair below its
	// static rate and the rate is filled again. Each round caps one more
	// region, so this ends within n rounds.
	for round := 0; ; round++ {
		fairShare(capacity, w, lo, hi, dem, a.out[:n], &a.fs)
		a.splitBurst(pool, unit, demandFloor, n)
		if !spare || wanting == 0 || round >= n {
			break
		}
		c, capTo := a.unitDonor(l, n, capacity, sumHi)
		if c < 0 {
			break
		}
		sumHi -= hi[c] - capTo
		hi[c] = capTo
	}
	j = 0
	for i := 0; i < nr; i++ {
		if a.silent[i] {
			continue
		}
		a.targetRate[base+i] = a.out[j]
		a.targetBurst[base+i] = a.bout[j]
		j++
	}
}

// splitBurst sets the roles of the n reporting regions from their rates
// (a.out) against their static rates (a.sts) and splits the burst pool
// among them into a.bout (splitUnits), weighted by the rates, or by the
// region weights when no rate is assigned. Demand at or below floor counts
// as none.
func (a *Allocator) splitBurst(pool, unit, floor float64, n int) {
	out, sts, role, dem, udem := a.out[:n], a.sts[:n], a.role[:n], a.dem[:n], a.udem[:n]
	var sumA float64
	for j := range out {
		o := out[j]
		sumA += o
		switch s := sts[j]; {
		case nearStatic(o, s):
			role[j] = 0
		case o > s:
			role[j] = 1
		default:
			role[j] = -1
		}
		// Demand below the floor is none: such a region keeps no unit
		// for itself and is not served one.
		udem[j] = dem[j]
		if !(dem[j] > floor) {
			udem[j] = 0
		}
	}
	bw := a.out[:n]
	if !(sumA > 0) {
		bw = a.w[:n]
	}
	splitUnits(pool, unit, bw, a.sbs[:n], udem, role, a.bout[:n], &a.us)
}

// unitDonor returns the region to hold a hair below its static rate (and
// that rate) so that it may give a unit to a region with demand that
// splitBurst left without one, or -1 when none is left without one or no
// region can be made a donor. A region left without a unit counts if it
// may hold one: its rate is above its static rate (it may receive), or its
// static burst holds one (it keeps its own, but may have lost it to others
// served first). A candidate is at or above its static rate, holds a
// static unit more than it needs itself (one when it has demand), has no
// floor that keeps it at its static rate, and the others can still take
// the whole capacity without it; the one with the most units to spare goes
// first, then the one that gives up the least rate, then the first.
func (a *Allocator) unitDonor(l *KeyLimit, n int, capacity, sumHi float64) (int, float64) {
	unit, floor := l.unit(), unitDemandFloor*l.Rate
	short := false
	for j := 0; j < n && !short; j++ {
		short = a.dem[j] > floor && a.bout[j] < unit*(1-1e-12) && (a.role[j] > 0 || a.sbs[j] >= unit)
	}
	if !short {
		return -1, 0
	}
	best, bestTo, bestSpare, bestLoss := -1, 0.0, 0.0, 0.0
	for j := 0; j < n; j++ {
		if a.role[j] < 0 {
			continue
		}
		spareUnits := math.Floor(a.sbs[j] / unit)
		if a.dem[j] > floor {
			spareUnits--
		}
		capTo := max(a.lo[j], min(a.hi[j], a.sts[j]*(1-1e-9)))
		if spareUnits < 1 || capTo >= a.sts[j] || sumHi-(a.hi[j]-capTo) < capacity {
			continue
		}
		loss := a.out[j] - capTo
		if best < 0 || spareUnits > bestSpare || (spareUnits == bestSpare && loss < bestLoss) {
			best, bestTo, bestSpare, bestLoss = j, capTo, spareUnits, loss
		}
	}
	return best, bestTo
}

// badNumber reports whether x is not a finite number >= 0. It is
// !finite(x) || x < 0 in one range test (NaN fails both comparisons, -0
// passes both), since Report runs it five times per key.
func badNumber(x float64) bool { return !(x >= 0 && x <= math.MaxFloat64) }

// Report ingests one region report received at now and returns that
// region's answer: grants, one for each key in the report that needs one,
// in report order, then one for each other key that needs one, in key
// order (keys made contended by reports since the last Allocate last),
// and the static lease conferred (see Answer). A key without a
// grant runs on whatever the region holds until it expires, then on its
// static share (its floor without a static lease).
//
// A retry (same Seq as the region's previous report) gets the previous
// grants again, as they were issued and counted; a grant for a key
// removed since is left out only once the key table was renumbered (see
// compactLocked), which is safe either way. It counts as hearing from the
// region, and its static lease is decided anew. A lower Seq is refused with ErrStaleReport. Invalid
// input is refused with an error wrapping quota.ErrInvalid and changes
// nothing. Keys without a limit are skipped and listed in the View. The
// returned grants are kept to answer a retry: callers must not modify them
// (a retry gets a copy).
func (a *Allocator) Report(now time.Time, rep Report) (Answer, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ri, ok := a.regionIndex[rep.Region]
	if !ok {
		return Answer{}, fmt.Errorf("hierarchy: report: %w: unknown region %q", quota.ErrInvalid, rep.Region)
	}
	rs := &a.regions[ri]
	if rs.reported {
		if rep.Seq == rs.lastSeq {
			t := a.tick(now)
			a.heard(t, ri)
			for _, g := range rs.answer {
				if k, ok := a.keyIndex[g.Key]; ok {
					a.named[k] = t
				}
			}
			return Answer{Grants: slices.Clone(rs.answer), StaticLease: a.confer(t, ri)}, nil
		}
		if rep.Seq < rs.lastSeq {
			return Answer{}, fmt.Errorf("hierarchy: report from %q: %w: seq %d is below the last seen %d", rep.Region, ErrStaleReport, rep.Seq, rs.lastSeq)
		}
	}
	nr := a.nr

	// Pass 1: validate everything and find acknowledgements, changing
	// nothing that outlives a failed call.
	seen := a.newReportSeenLocked()
	stamp := seen.stamp
	idx := a.reportIdx[:0]
	// Any grant the report acknowledges bounds its send time from below;
	// the latest answer is the best bound there can be, so stop looking
	// once it is found.
	sendLB := rs.sendLB
	probing := sendLB < rs.lastAnswerAt
	var unknown []quota.Key
	for j := range rep.Keys {
		kd := &rep.Keys[j]
		k := a.slotLocked(rs.prevOrder, j, kd.Key)
		if err := a.validateKeyDemand(j, kd, k >= 0); err != nil {
			return Answer{}, fmt.Errorf("hierarchy: report from %q: %w", rep.Region, err)
		}
		if first, dup := seen.note(a, j, k, kd.Key); dup {
			return Answer{}, fmt.Errorf("hierarchy: report from %q: %w: keys[%d] %s duplicates keys[%d]", rep.Region, quota.ErrInvalid, j, kd.Key, first)
		}
		if k < 0 {
			unknown = append(unknown, kd.Key)
			idx = append(idx, -1)
			continue
		}
		if probing {
			if b := a.blockOf[k]; b >= 0 {
				sendLB = max(sendLB, a.fences[ri][b].heldSince(heldOf(kd)))
				probing = sendLB < rs.lastAnswerAt
			}
		}
		idx = append(idx, k)
	}
	a.reportIdx = idx

	// Pass 2: commit.
	t := a.tick(now)
	rs.raisePending = false
	rs.reported = true
	rs.lastSeq = rep.Seq
	rs.lastAt = t
	a.heard(t, ri)
	rs.nReports++
	rs.sendLB = sendLB
	rs.unknownN = len(unknown)
	if len(unknown) > 0 {
		slices.SortFunc(unknown, func(x, y quota.Key) int {
			if c := cmp.Compare(x.Tenant, y.Tenant); c != 0 {
				return c
			}
			return cmp.Compare(x.Class, y.Class)
		})
		unknown = unknown[:min(len(unknown), maxUnknownShown)]
	}
	rs.unknown = unknown
	learning := t < a.learnUntil
	if !learning {
		// Which regions are silent is decided anew for retarget (see
		// there); nothing below changes it.
		a.markSilent(t)
	}
	answer := make([]Grant, 0, len(a.active)+8)
	freed := false // some key counts ri lower than before this report
	for j := range rep.Keys {
		k := idx[j]
		if k < 0 {
			continue
		}
		kd := &rep.Keys[j]
		a.named[k] = t
		a.observe(k, ri, kd, t)
		held := heldOf(kd)
		// The key's shares, for this report's decisions about it: its
		// limit and the regions' states stay as they are until the
		// report is answered.
		sh := a.loadShares(k)
		s, sb := sh.fR[ri], sh.fB[ri]
		cr, cb := sh.cR[ri], sh.cB[ri]
		b := a.blockOf[k]
		switch {
		case b >= 0:
			if !learning && !a.blockContended[b] && a.aboveStatic(k, ri, s, sb, t) {
				// A key winding down to its static shares (the last
				// Allocate found it uncontended) is contended again
				// from this report on, like a key with no block: a
				// shift whose fall was read before its rise would
				// otherwise hand the donor its static share back and
				// keep the recipient at its own until the next
				// Allocate. The key is listed in active already
				// (Allocate lists a winding-down key); listing it again
				// is harmless (seenStamp).
				a.forgetTargets(b)
				a.blockContended[b] = true
				a.active = append(a.active, k)
			}
		case !learning && a.aboveStatic(k, ri, s, sb, t):
			// The key is contended from this report on, not from the
			// next Allocate: its targets now, and the other regions'
			// next reports get their grants for it (the fence decides
			// what is safe, whatever the targets).
			b = a.newBlock(k)
			a.blockContended[b] = true
			a.active = append(a.active, k)
		case held.valid <= 0 || (nearStatic(held.rate, s) && nearStatic(held.burst, sb)):
			continue
		default:
			b = a.newBlock(k)
		}
		f := &a.fences[ri][b]
		m := f.match(held)
		if m >= 0 && f.recs[m].flags&recPseudo == 0 && f.recs[m].at > sendLB {
			sendLB = f.recs[m].at
			rs.sendLB = sendLB
		}
		before := a.summaries[int(b)*nr+ri]
		f.acknowledge(t, held, m, cb, learning)
		if !learning && kd.Released > 0 {
			a.credit(t, b, ri, kd.Released, before, f.summarize(t, cr, cb), cb, sh)
		}
		var g Grant
		issued := false
		if learning {
			g, issued = a.reissue(t, f, k, held, s, sb, sendLB)
		} else {
			if a.blockContended[b] {
				a.retarget(t, k, b, sh)
			}
			g, issued = a.fencedGrant(t, b, ri, sendLB, sh)
		}
		after := f.summarize(t, cr, cb)
		a.summaries[int(b)*nr+ri] = after
		// Compared over the same horizon: did this report lower what ri
		// may use of the key (an acknowledgement)?
		r0, b0 := a.peakUse(t, before, cr, cb)
		r1, b1 := a.peakUse(t, after, cr, cb)
		if l := &a.limits[k]; r1 < r0-1e-9*l.Rate || b1 < b0-1e-9*l.Burst {
			freed = true
			if !learning && a.blockContended[b] {
				a.nudgeRaises(t, b, ri, sh)
			}
		}
		if issued {
			answer = appendGrant(answer, &g)
		}
	}
	if freed && !learning {
		a.nudgeWaiting(ri)
	}
	if !learning {
		for _, k := range a.active {
			if a.seenStamp[k] == stamp {
				continue
			}
			// At most one grant per key: a slot freed by RemoveKey and
			// reused by a key made contended at a report may be listed
			// twice until the next Allocate.
			a.seenStamp[k] = stamp
			b := a.blockOf[k]
			if b < 0 {
				continue
			}
			f := &a.fences[ri][b]
			f.prune(t)
			sh := a.loadShares(k)
			g, issued := a.fencedGrant(t, b, ri, sendLB, sh)
			cr, cb := sh.cR[ri], sh.cB[ri]
			a.summaries[int(b)*nr+ri] = f.summarize(t, cr, cb)
			if issued {
				a.named[k] = t
				answer = appendGrant(answer, &g)
			}
		}
	}
	rs.prevOrder = append(rs.prevOrder[:0], idx...)
	rs.answer = answer
	rs.lastAnswerAt = t
	return Answer{Grants: answer, StaticLease: a.confer(t, ri)}, nil
}

// ReportAgain is how soon region should report again, 0 meaning at its
// next epoch. It is a third of an epoch (whole milliseconds, at least 1)
// when the latest answer to region gave some key materially less than its
// target because other regions had yet to acknowledge smaller grants: each
// of them reports within an epoch and acknowledges at once, so an early
// report gets most of the rest before the region's next epoch. A retried
// report gets the same answer and the same delay. 0 for an unknown region
// or one that never reported.
func (a *Allocator) ReportAgain(region string) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	ri, ok := a.regionIndex[region]
	if !ok || !a.regions[ri].raisePending {
		return 0
	}
	return max(time.Millisecond, (time.Duration(a.epochNS) / 3).Truncate(time.Millisecond))
}

// appendGrant is append(answer, *g), copying field by field: a Grant is
// too large to be copied in registers, so append would copy it with the
// runtime's generic typed copy, which while the collector marks runs a
// bulk write barrier over the type's pointer map; the key's two strings
// stored as fields take two plain write barriers instead.
func appendGrant(answer []Grant, g *Grant) []Grant {
	n := len(answer)
	if n == cap(answer) {
		return append(answer, *g)
	}
	answer = answer[:n+1]
	p := &answer[n]
	p.Key = g.Key
	p.Rate, p.Burst, p.Valid, p.Deposit = g.Rate, g.Burst, g.Valid, g.Deposit
	return answer
}

func heldOf(kd *KeyDemand) heldReport {
	return heldReport{rate: kd.HeldRate, burst: kd.HeldBurst, valid: int64(kd.HeldValid), holding: kd.Holding}
}

func (a *Allocator) validateKeyDemand(j int, kd *KeyDemand, known bool) error {
	if !known {
		if err := kd.Key.Validate(); err != nil {
			return fmt.Errorf("keys[%d]: %w", j, err)
		}
	}
	switch {
	case badNumber(kd.Admitted):
		return fmt.Errorf("%w: keys[%d] %s: admitted %v must be a finite number >= 0", quota.ErrInvalid, j, kd.Key, kd.Admitted)
	case badNumber(kd.Denied):
		return fmt.Errorf("%w: keys[%d] %s: denied %v must be a finite number >= 0", quota.ErrInvalid, j, kd.Key, kd.Denied)
	case kd.Window <= 0:
		return fmt.Errorf("%w: keys[%d] %s: window %v must be positive", quota.ErrInvalid, j, kd.Key, kd.Window)
	case badNumber(kd.HeldRate):
		return fmt.Errorf("%w: keys[%d] %s: held rate %v must be a finite number >= 0", quota.ErrInvalid, j, kd.Key, kd.HeldRate)
	case badNumber(kd.HeldBurst):
		return fmt.Errorf("%w: keys[%d] %s: held burst %v must be a finite number >= 0", quota.ErrInvalid, j, kd.Key, kd.HeldBurst)
	case kd.HeldValid < 0:
		return fmt.Errorf("%w: keys[%d] %s: held valid %v is negative", quota.ErrInvalid, j, kd.Key, kd.HeldValid)
	case badNumber(kd.Holding):
		return fmt.Errorf("%w: keys[%d] %s: holding %v must be a finite number >= 0", quota.ErrInvalid, j, kd.Key, kd.Holding)
	case badNumber(kd.Released):
		return fmt.Errorf("%w: keys[%d] %s: released %v must be a finite number >= 0", quota.ErrInvalid, j, kd.Key, kd.Released)
	}
	return nil
}

// observe folds one report's demand reading ((admitted+denied)/window)
// into the key's demand estimate for region ri. Reports that skipped the
// key count as zero.
func (a *Allocator) observe(k int32, ri int, kd *KeyDemand, t int64) {
	j := int(k)*a.nr + ri
	n := a.regions[ri].nReports
	last := a.lastObs[j]
	if int64(kd.Window) < a.epochNS/2 {
		// An acknowledgement sent right after the previous report: it
		// only acknowledges grants (a count over so short a window would
		// be noise), and the estimate stays as it was, current as of this
		// report.
		if last != 0 {
			a.demand[j] *= a.decay(n - 1 - last)
			a.lastObs[j] = n
		}
		return
	}
	obs := (kd.Admitted + kd.Denied) / kd.Window.Seconds()
	if last == 0 {
		a.demand[j] = obs
	} else {
		d := a.demand[j] * a.decay(n-1-last)
		a.demand[j] = d + a.alphaFor(int64(kd.Window))*(obs-d)
	}
	a.lastObs[j] = n
	if obs > unitDemandFloor*a.limits[k].Rate {
		a.wantAt[j], a.wantDem[j] = t, a.demand[j]
	}
}

// reissue is learning mode: hand back exactly what the region holds. A
// grant at or below the static shares may be extended to the full
// validity (keeping a region below its share longer is always safe), but
// never cut short of its expiry (rounded up to the millisecond, up to the
// prior validity): what it leaves below the share may pay for another
// region's grant until then. One above keeps its expiry, since the donors
// that paid for it are unknown.
func (a *Allocator) reissue(t int64, f *fence, k int32, held heldReport, s, sb float64, sendLB int64) (Grant, bool) {
	if held.valid <= 0 || f.full() {
		return Grant{}, false
	}
	// Its own expiry: up to the longest validity it may have been issued
	// with, which a config change may have made longer than this
	// Allocator's.
	const msNS = int64(time.Millisecond)
	left := min(held.valid, a.reissueMax) // reissueMax is whole ms: no overflow rounding up
	valid := max(a.validity, (left+msNS-1)/msNS*msNS)
	if held.rate > s || held.burst > sb {
		valid = left / msNS * msNS
	}
	if valid <= 0 {
		return Grant{}, false
	}
	rate, burst := f.distinct(held.rate, held.burst)
	f.add(grantRec{rate: rate, burst: burst, ue: t + valid, le: sendLB + valid, at: t})
	a.grantEnd[k] = max(a.grantEnd[k], t+valid)
	return Grant{Key: a.keys[k], Rate: rate, Burst: burst, Valid: time.Duration(valid)}, true
}

// fencedGrant chooses, records and returns region ri's grant for block b.
//
// A grant (a, Valid) is safe when, at every instant of its validity, a
// fits in the headroom H(t) the other regions leave (their summaries),
// and when, if it makes the region's fallback to its static share
// possible earlier than before, the static share fits there too. The
// target, capped by the headroom of the next minValidity, is tried first
// for as long as it fits, which may be shorter than Validity when donors
// may fall back before then; if that is not safe, the grant is what fits
// for the whole Validity. Its fallback is never earlier than the region's
// current one, except after a grant re-issued while learning with a
// longer prior validity (Options.PriorValidity): then a Validity from the
// send-time bound can end before that grant's, and the static share must
// fit from there on as for a short grant; when it does not, there is no
// grant and the region keeps the one it holds, which is counted.
func (a *Allocator) fencedGrant(t int64, b int32, ri int, sendLB int64, sh *shares) (Grant, bool) {
	nr := a.nr
	k := a.blockKey[b]
	l := &a.limits[k]
	base := int(b) * nr
	f := &a.fences[ri][b]
	if f.full() {
		return Grant{}, false
	}
	rl, bl := &a.rateLane, &a.burstLane
	a.lanesFor(t, b, ri, sh)
	end := t + a.validity
	wantRate, wantBurst := a.targetRate[base+ri], a.targetBurst[base+ri]
	rate := max(0, min(wantRate, rl.minHeadroom(t, t+a.minValidity)))
	burst := max(0, min(wantBurst, bl.minHeadroom(t, t+a.minValidity)))
	until := min(rl.fitsUntil(rate, t, end), bl.fitsUntil(burst, t, end))
	valid := (until - t) / int64(time.Millisecond) * int64(time.Millisecond)
	fallback := f.fallbackAt()
	if !a.fallbackSafe(t, valid, sendLB, fallback, rate, burst) {
		rate = max(0, min(wantRate, rl.minHeadroom(t, end)))
		burst = max(0, min(wantBurst, bl.minHeadroom(t, end)))
		valid = a.validity
		if !a.fallbackSafe(t, valid, sendLB, fallback, rate, burst) {
			return Grant{}, false
		}
	}
	if a.materiallyShort(wantRate, wantRate-rate, l.Rate) {
		// The donors' acknowledgements will free the rest before the
		// next epoch.
		a.regions[ri].raisePending = true
		a.nudgeDonors(t, b, ri, sh)
	}
	deposit := a.deposit(t, b, ri, rate, burst, t+valid, sh)
	burst += deposit
	rate, burst = f.distinct(rate, burst)
	f.add(grantRec{rate: rate, burst: burst, ue: t + valid, le: sendLB + valid, at: t})
	a.grantEnd[k] = max(a.grantEnd[k], t+valid)
	return Grant{Key: a.keys[k], Rate: rate, Burst: burst, Valid: time.Duration(valid), Deposit: deposit}, true
}

// materiallyShort says whether a rate short of want, a target of a key
// of rate limit, is worth an early report: by more than pendingShortfall
// of the key's rate and more than a demand reading's noise (three
// standard deviations of one epoch's Poisson count, sqrt(want/epoch)).
func (a *Allocator) materiallyShort(want, short, limit float64) bool {
	return short > pendingShortfall*limit && short*short > 9*want*a.perEpochSecond
}

// lanesFor sets the rate and burst lanes to the headroom the other regions
// leave region ri for block b: the others are taken at their summaries
// over what they are counted at, and what the static shares and the
// lapsed regions leave of the limit is added (freed).
//
// The share ri falls back to, which fallbackSafe checks, is its static
// share even while ri is returning and runs on its floor: its static lease
// may be conferred (confer) before a grant decided now ends, and from then
// on it falls back to the static share, at the fallback time this grant
// sets. The other regions' grants counted it at its static share only from
// the fallback time it had when they were decided, so a grant that moves
// that time earlier must leave room for the static share, not the floor.
func (a *Allocator) lanesFor(t int64, b int32, ri int, sh *shares) {
	base := int(b) * a.nr
	rl, bl := &a.rateLane, &a.burstLane
	s, sb := sh.sR[ri], sh.sB[ri]
	rl.reset(s)
	bl.reset(sb)
	// Cut to the regions first, so that the loop checks no index.
	sums := a.summaries[base : base+a.nr]
	cR, cB := sh.cR[:len(sums)], sh.cB[:len(sums)]
	for y := range sums {
		if y == ri {
			continue
		}
		fy := &sums[y]
		rl.addOther(t, fy.rateV, fy.rateT, cR[y])
		bl.addOther(t, fy.burstV, fy.burstT, cB[y])
	}
	if dr, db := a.freed(ri, sh); dr != 0 || db != 0 {
		rl.base += dr
		bl.base += db
	}
	// Tokens in flight are reserved as a cap is, for as long as they may
	// be deposited (transfer.go): a grant's fallback, or a returning
	// region's static share, after they are dropped does not meet them.
	if p := a.inFlightAt(b, t); p > 0 {
		bl.addOther(t, p, a.transfer[b].at+a.epochNS+1, 0)
	}
}

// fallbackSafe checks the other side of a grant: the region may fall
// back to its static share when it expires, earlier than its current
// grants let it (a grant shorter than Validity, or any grant while a
// re-issued one with a longer prior validity sets the fallback), so the
// static share must fit wherever that is new (outside the grant itself).
func (a *Allocator) fallbackSafe(t, valid, sendLB, fallback int64, rate, burst float64) bool {
	if valid < a.minValidity {
		return false
	}
	newFallback := sendLB + valid
	if fallback == negInf || newFallback >= fallback {
		return true
	}
	rl, bl := &a.rateLane, &a.burstLane
	grantEnd := t + valid
	ok := func(at int64) bool {
		rc, bc := rl.headroom(at), bl.headroom(at)
		if at < grantEnd {
			rc, bc = max(rc, rate), max(bc, burst)
		}
		// The slack forgives the last-bit differences distinct() and
		// rounding leave between a grant and the static share it equals.
		return rl.static <= rc+1e-12*rl.static && bl.static <= bc+1e-12*bl.static
	}
	from := max(t, newFallback)
	if !ok(from) {
		return false
	}
	if grantEnd > from && grantEnd < fallback && !ok(grantEnd) {
		return false
	}
	for _, l := range []*lane{rl, bl} {
		for _, u := range l.until[:l.n] {
			if u > from && u < fallback && !ok(u) {
				return false
			}
		}
	}
	return true
}
