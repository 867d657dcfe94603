package oracle

import (
	"container/heap"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// Source says where a decision came from.
type Source uint8

const (
	// SourceLease: admitted from leased tokens in an instance's memory.
	SourceLease Source = iota
	// SourceStrict: admitted by a strict Check in the regional Redis.
	SourceStrict
	// SourceDegraded: admitted by the class's on_failure policy while the
	// region could not be reached.
	SourceDegraded
	// SourceShadow: admitted only because the class is in shadow mode.
	SourceShadow
	// SourceDenied: denied.
	SourceDenied
	// SourceUnanswered: a strict Check the region decided whose caller
	// was answered an error instead: denied to the caller, and the
	// region's decision stays undelivered in the books (RegionPending), as
	// one whose answer was lost: counted there, never admitted.
	SourceUnanswered
)

// Tier names a control-plane hop for RPC counting.
type Tier uint8

const (
	// TierInstance: instance → regional service (Acquire, Sync, Release,
	// Check).
	TierInstance Tier = iota
	// TierGlobal: region leader → global allocator (one report).
	TierGlobal
	// TierRedis: regional service → Redis (one script call).
	TierRedis
	numTiers
)

// Region describes one region.
type Region struct {
	Name                       string
	Weight, MinShare, MaxShare float64
}

// Key describes one key: its global limit and the static shares of every
// region (in Setup.Regions order).
type Key struct {
	Key                     quota.Key
	Rate, Burst             float64
	StaticRate, StaticBurst []float64
	// FloorRate and FloorBurst are what each region runs on once its
	// static lease lapsed (hierarchy.Floor of the static share). Optional
	// (nil: the static share, a region's static lease never lapsing).
	FloorRate, FloorBurst []float64
	// Closed: the key's class fails closed (on_failure: closed), so it
	// must never admit in degraded mode.
	Closed bool
}

// Shift is a demand shift of a key: from At on, the expected demand per
// region is Demand (tokens/s).
type Shift struct {
	At     time.Duration
	Key    int
	Demand []float64
}

// Setup is what the oracle knows before the run.
type Setup struct {
	// Regions, required: at least one, valid hierarchy regions.
	Regions []Region
	// Keys, required: every key observations may name, by index.
	Keys []Key
	// Epoch, required: the allocation period (convergence samples).
	Epoch time.Duration
	// Duration, required: the length of the run.
	Duration time.Duration
	// Warmup is left out of the measures (not of the invariants).
	// Optional, default 0.
	Warmup time.Duration
	// ConvergenceTolerance is a fraction of the key's rate. Optional,
	// default 0.05.
	ConvergenceTolerance float64
	// DemandAlpha is the allocator's EWMA weight of one epoch's demand
	// reading, in (0, 1]; it sets how noisy the estimate the tolerance
	// allows for is. Optional, default 1 (the config's default).
	DemandAlpha float64
	// ConvergenceHorizon is how many epochs after a demand shift its
	// convergence is watched, at most (the key's next shift, or the end of
	// the run, may come first). Optional, default 30.
	ConvergenceHorizon int
	// Shifts, optional: demand shifts to measure convergence after.
	Shifts []Shift
	// Focus keys get per-region time series. Optional.
	Focus []int
	// Step is the time-series resolution. Optional, default
	// max(1s, Duration/720) rounded to whole seconds.
	Step time.Duration
	// Changes are the instants the system is disturbed (a fault's start
	// and end, a failover, an operator's event), for the recovered
	// measures. Optional.
	Changes []Change
	// Recovery is the time given after each change before the recovered
	// measures count again. Optional (0: every second after warmup
	// counts).
	Recovery time.Duration
	// RecoveredLevel is the admitted/ideal ratio a change's recovery time
	// is measured against. Optional, default 0.97.
	RecoveredLevel float64
}

// Change is one disturbance, for the recovered measures.
type Change struct {
	At    time.Duration
	Label string
}

// Fault is an injected failure, for the report.
type Fault struct {
	At, Until time.Duration
	Label     string
}

// Note is a noteworthy event (a leader change), for the report.
type Note struct {
	At   time.Duration
	Text string
}

const (
	relTol       = 1e-9
	perRegionTol = 1e-6
	// holdTol is the storage rounding of a bucket's tokens (six decimals).
	holdTol = 1e-6
)

// DefaultConvergenceHorizon is Setup.ConvergenceHorizon's default.
const DefaultConvergenceHorizon = 30

type grantState struct {
	rate, burst float64
	expiry      time.Duration
	has         bool
}

type keyState struct {
	gcra, gcraAll gcraState // virtual buckets: bucket-backed tokens; all admitted tokens
	rate          rateNT
	burst         u128    // b in nanotokens
	eps           float64 // crash error so far (whole tokens)
	inViolation   bool
	idealTokens   float64
	idealAt       float64
	grants        []grantState // per region
	issued        []int64      // per region: issue time (µs, region clock) of the last grant applied
	nextExpiry    time.Duration
	expiryPending bool
	// Per region, what the region runs on without a grant, while its
	// static lease holds and after (config changes move them).
	static, floor []grantState
}

// Oracle checks the invariants and computes the measures of one run. Not
// safe for concurrent use (see the package documentation).
type Oracle struct {
	s    Setup
	nr   int
	keys []keyState
	down []bool // region's Redis unreachable
	// staticUntil is, per region, the true time until which it may run on
	// its static shares (its static lease); after it, its floors.
	staticUntil []time.Duration
	now         time.Duration
	timers      timerHeap
	seq         uint64
	fill        []float64 // scratch for water-fills

	// Per (key, region), index key*nr+region: what the instances decided
	// and what the region's bucket counts.
	books []regionBooks

	res Result

	w1, w10, w60 *window
	series       *series

	util1, util60  stat
	idealUtil60    stat
	conv           []convState
	fairSum        []float64
	fairN          []int
	falseTok       float64
	offeredAfterWU float64

	// Per whole second of the run, fleet totals after warmup (the
	// recovered measures).
	secAdm, secIdeal, secOff, secFalse []float64
}

// New prepares an oracle. Invalid setups are errors.
func New(s Setup) (*Oracle, error) {
	if len(s.Regions) == 0 || s.Epoch <= 0 || s.Duration <= 0 {
		return nil, fmt.Errorf("oracle: setup needs regions, an epoch and a duration")
	}
	if s.Step == 0 {
		s.Step = max(time.Second, (s.Duration / 720).Round(time.Second))
	}
	if s.ConvergenceTolerance == 0 {
		s.ConvergenceTolerance = 0.05
	}
	if s.DemandAlpha == 0 {
		s.DemandAlpha = 1
	}
	if s.ConvergenceHorizon == 0 {
		s.ConvergenceHorizon = DefaultConvergenceHorizon
	}
	if s.ConvergenceHorizon < 2 {
		return nil, fmt.Errorf("oracle: convergence horizon %d must be at least 2 epochs", s.ConvergenceHorizon)
	}
	if !(s.DemandAlpha > 0 && s.DemandAlpha <= 1) {
		return nil, fmt.Errorf("oracle: demand alpha %v must be in (0, 1]", s.DemandAlpha)
	}
	if s.RecoveredLevel == 0 {
		s.RecoveredLevel = 0.97
	}
	o := &Oracle{s: s, nr: len(s.Regions), down: make([]bool, len(s.Regions)), staticUntil: make([]time.Duration, len(s.Regions))}
	for r := range o.staticUntil {
		o.staticUntil[r] = math.MaxInt64
	}
	secs := int((s.Duration + time.Second - 1) / time.Second)
	o.secAdm, o.secIdeal, o.secOff, o.secFalse = make([]float64, secs), make([]float64, secs), make([]float64, secs), make([]float64, secs)
	for _, r := range s.Regions {
		if !(r.Weight > 0) || math.IsInf(r.Weight, 0) || !(r.MinShare >= 0 && r.MinShare <= 1) ||
			!(r.MaxShare >= 0 && r.MaxShare <= 1) || (r.MaxShare > 0 && r.MinShare > r.MaxShare) {
			return nil, fmt.Errorf("oracle: region %q: bad weight or shares", r.Name)
		}
	}
	o.keys = make([]keyState, len(s.Keys))
	for i, k := range s.Keys {
		if !(k.Rate > 0) || math.IsInf(k.Rate, 0) || !(k.Burst > 0) || len(k.StaticRate) != o.nr || len(k.StaticBurst) != o.nr ||
			(k.FloorRate != nil && len(k.FloorRate) != o.nr) || (k.FloorBurst != nil && len(k.FloorBurst) != o.nr) {
			return nil, fmt.Errorf("oracle: key %s: bad limit, static shares or floors", k.Key)
		}
		o.keys[i].grants = make([]grantState, o.nr)
		o.keys[i].static = make([]grantState, o.nr)
		o.keys[i].floor = make([]grantState, o.nr)
		for r := 0; r < o.nr; r++ {
			o.keys[i].static[r] = grantState{rate: k.StaticRate[r], burst: k.StaticBurst[r]}
			o.keys[i].floor[r] = o.keys[i].static[r]
			if k.FloorRate != nil {
				o.keys[i].floor[r].rate = k.FloorRate[r]
			}
			if k.FloorBurst != nil {
				o.keys[i].floor[r].burst = k.FloorBurst[r]
			}
		}
		o.keys[i].idealTokens = k.Burst
		o.keys[i].rate = exactRate(k.Rate)
		o.keys[i].burst = floatNT(k.Burst)
	}
	o.books = make([]regionBooks, len(s.Keys)*o.nr)
	nk := len(s.Keys)
	// The 1 s windows stay on whole seconds (the recovered measures index
	// them by second); the longer ones start at the first whole second
	// after warmup, where the 1 s windows measured start too.
	warm := (s.Warmup + time.Second - 1) / time.Second * time.Second
	o.w1 = newWindow(time.Second, 0, nk, o.nr)
	o.w10 = newWindow(10*time.Second, warm, nk, o.nr)
	o.w60 = newWindow(time.Minute, warm, nk, o.nr)
	o.series = newSeries(s, o.nr)
	o.fairSum = make([]float64, o.nr)
	o.fairN = make([]int, o.nr)
	o.fill = make([]float64, o.nr)
	o.res.Regions = make([]string, o.nr)
	for i, r := range s.Regions {
		o.res.Regions[i] = r.Name
	}
	o.res.Keys = nk
	o.scheduleShifts()
	return o, nil
}

// --- Timers. ---

type timerKind uint8

const (
	timerExpiry timerKind = iota
	timerConv
	timerSeries
)

type timer struct {
	at   time.Duration
	seq  uint64
	kind timerKind
	a, b int
}

type timerHeap []timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

func (o *Oracle) addTimer(at time.Duration, kind timerKind, a, b int) {
	o.seq++
	heap.Push(&o.timers, timer{at: at, seq: o.seq, kind: kind, a: a, b: b})
}

// Advance moves the oracle's clock to t, running every check and window
// that falls due on the way. Every observation calls it; the simulator
// also calls it every epoch so quiet periods are checked too.
func (o *Oracle) Advance(t time.Duration) {
	if t < o.now {
		t = o.now // observations may tie; never run backwards
	}
	for len(o.timers) > 0 && o.timers[0].at <= t {
		tm := heap.Pop(&o.timers).(timer)
		o.closeWindows(tm.at)
		o.now = tm.at
		switch tm.kind {
		case timerExpiry:
			// A timer armed for a later expiry stays queued when an
			// earlier one is armed before it, and the key's check after
			// that earlier expiry arms the later one again: only the
			// timer of the expiry now armed checks, so no instant is
			// checked (or its violation counted) twice.
			ks := &o.keys[tm.a]
			if !ks.expiryPending || ks.nextExpiry != tm.at {
				continue
			}
			ks.expiryPending = false
			o.checkKey(tm.a)
			o.armExpiry(tm.a)
		case timerConv:
			o.sampleConvergence(tm.a, tm.b)
		}
	}
	o.closeWindows(t)
	o.now = t
}

// --- Invariants 2 and 3. ---

func (o *Oracle) rateAt(k, r int, t time.Duration) (rate, burst float64) {
	rate, burst, _ = o.rateFrom(k, r, t)
	return rate, burst
}

// rateSource is what gives a region its rate and burst at an instant.
type rateSource int8

const (
	fromDown   rateSource = iota // its Redis is down: nothing refills
	fromGrant                    // a grant still valid
	fromStatic                   // its static share, under its static lease
	fromFloor                    // its floor, off its static lease
)

// rateFrom is region r's rate and burst cap for key k at t, and where they
// come from.
func (o *Oracle) rateFrom(k, r int, t time.Duration) (rate, burst float64, src rateSource) {
	if o.down[r] {
		return 0, 0, fromDown
	}
	ks := &o.keys[k]
	g := &ks.grants[r]
	if g.has && t < g.expiry {
		return g.rate, g.burst, fromGrant
	}
	if t < o.staticUntil[r] {
		return ks.static[r].rate, ks.static[r].burst, fromStatic
	}
	return ks.floor[r].rate, ks.floor[r].burst, fromFloor
}

// StaticLease records that region may run on its static shares until
// until (true time), on its floors after. A region's static lease holds
// for ever until the first call. Invariants 2 and 3 are checked at once
// for every key (the lease may have been extended).
func (o *Oracle) StaticLease(t time.Duration, region int, until time.Duration) {
	o.Advance(t)
	if o.staticUntil[region] == until {
		return
	}
	o.staticUntil[region] = until
	for k := range o.keys {
		o.checkKey(k)
	}
}

// StaticShares records that region's static share of key and its floor
// are now rate and burst, floorRate and floorBurst (the region adopted
// another config), and checks invariants 2 and 3 for the key.
func (o *Oracle) StaticShares(t time.Duration, region, key int, rate, burst, floorRate, floorBurst float64) {
	o.Advance(t)
	ks := &o.keys[key]
	ks.static[region] = grantState{rate: rate, burst: burst}
	ks.floor[region] = grantState{rate: floorRate, burst: floorBurst}
	o.checkKey(key)
}

func (o *Oracle) checkKey(k int) {
	key := &o.s.Keys[k]
	var sumR, sumB float64
	for r := 0; r < o.nr; r++ {
		a, b := o.rateAt(k, r, o.now)
		sumR += a
		sumB += b
	}
	o.res.Rates.Checks++
	o.res.Bursts.Checks++
	slack := perRegionTol * float64(o.nr)
	if ratio := sumR / key.Rate; ratio > o.res.Rates.MaxRatio {
		o.res.Rates.MaxRatio = ratio
	}
	if ratio := sumB / key.Burst; ratio > o.res.Bursts.MaxRatio {
		o.res.Bursts.MaxRatio = ratio
	}
	if sumR > key.Rate*(1+relTol)+slack {
		if o.res.Rates.note(o.now, key.Key, sumR, key.Rate) {
			o.res.Rates.FirstParts = o.parts(k)
		}
	}
	if sumB > key.Burst*(1+relTol)+slack {
		if o.res.Bursts.note(o.now, key.Key, sumB, key.Burst) {
			o.res.Bursts.FirstParts = o.parts(k)
		}
	}
}

// parts says what each region may use of key k now and where it comes from
// (rateFrom), for the report of a violation of invariant 2 or 3.
func (o *Oracle) parts(k int) string {
	ks := &o.keys[k]
	var b strings.Builder
	for r := 0; r < o.nr; r++ {
		if r > 0 {
			b.WriteString(", ")
		}
		rate, burst, src := o.rateFrom(k, r, o.now)
		fmt.Fprintf(&b, "%s %.4g/s burst %.4g", o.s.Regions[r].Name, rate, burst)
		switch src {
		case fromDown:
			b.WriteString(" (Redis down)")
		case fromGrant:
			fmt.Fprintf(&b, " (grant until %v)", ks.grants[r].expiry.Round(time.Millisecond))
		case fromStatic:
			if o.staticUntil[r] == math.MaxInt64 {
				b.WriteString(" (static share)")
			} else {
				fmt.Fprintf(&b, " (static share, lease until %v)", o.staticUntil[r].Round(time.Millisecond))
			}
		default:
			b.WriteString(" (floor)")
		}
	}
	return b.String()
}

// armExpiry schedules a check at the earliest grant expiry of key k still
// ahead.
func (o *Oracle) armExpiry(k int) {
	ks := &o.keys[k]
	next := time.Duration(math.MaxInt64)
	for r := range ks.grants {
		if g := &ks.grants[r]; g.has && g.expiry > o.now && g.expiry < next {
			next = g.expiry
		}
	}
	if next == time.Duration(math.MaxInt64) || (ks.expiryPending && ks.nextExpiry <= next) {
		return
	}
	ks.nextExpiry, ks.expiryPending = next, true
	o.addTimer(next, timerExpiry, k, 0)
}

// GrantApplied records that region's bucket of key applied a grant at t:
// it refills at rate with cap burst (as stored) until expiry (true time).
func (o *Oracle) GrantApplied(t time.Duration, region, key int, rate, burst float64, expiry time.Duration) {
	o.Advance(t)
	o.keys[key].grants[region] = grantState{rate: rate, burst: burst, expiry: expiry, has: true}
	o.res.GrantsApplied++
	o.checkKey(key)
	o.armExpiry(key)
}

// RedisDown records that region's Redis became unreachable: nothing
// refills there until it is back.
func (o *Oracle) RedisDown(t time.Duration, region int) {
	o.Advance(t)
	o.down[region] = true
}

// RedisUp records that region's Redis is back, empty: every grant is gone,
// and so is the region's static lease: buckets refill at the floors until
// the region stores a new one (StaticLease).
func (o *Oracle) RedisUp(t time.Duration, region int) {
	o.Advance(t)
	o.down[region] = false
	o.staticUntil[region] = 0
	for k := range o.keys {
		o.keys[k].grants[region] = grantState{}
		if o.keys[k].issued != nil {
			o.keys[k].issued[region] = 0
		}
		o.BucketGone(region, k)
		o.checkKey(k)
	}
}

// --- Invariant 1 and the reference bucket. ---

// CrashError adds tokens to key's crash error ε.
func (o *Oracle) CrashError(t time.Duration, key int, tokens float64) {
	o.Advance(t)
	if tokens <= 0 {
		return
	}
	if o.keys[key].eps == 0 {
		o.res.Conformance.CrashKeys++
	}
	o.keys[key].eps += tokens
	o.res.Conformance.CrashError += tokens
}

// Offered records n requests of cost tokens arriving at region for key at
// t, and feeds them to the ideal centralized bucket.
func (o *Oracle) Offered(t time.Duration, region, key int, n, cost int64) {
	o.Advance(t)
	tokens := float64(n * cost)
	ks := &o.keys[key]
	kd := &o.s.Keys[key]
	ts := t.Seconds()
	ks.idealTokens = min(kd.Burst, ks.idealTokens+(ts-ks.idealAt)*kd.Rate)
	ks.idealAt = ts
	admit := math.Min(float64(n), math.Floor(ks.idealTokens/float64(cost)+1e-9))
	ks.idealTokens -= admit * float64(cost)
	ideal := admit * float64(cost)
	o.res.Offered += tokens
	o.res.IdealAdmitted += ideal
	if o.afterWarmup(t) {
		o.res.AfterWarmup.Offered += tokens
		o.res.AfterWarmup.IdealAdmitted += ideal
	}
	o.w1.add(key, region, tokens, 0, 0, ideal)
	o.w10.add(key, region, tokens, 0, 0, ideal)
	o.w60.add(key, region, tokens, 0, 0, ideal)
	o.series.offered(t, key, region, tokens, ideal)
}

// Unserved records requests that found no live instance (denied).
func (o *Oracle) Unserved(t time.Duration, region, key int, tokens int64) {
	o.Decided(t, region, key, tokens, SourceDenied)
	o.res.Unserved += float64(tokens)
	if o.afterWarmup(t) {
		o.res.AfterWarmup.Unserved += float64(tokens)
	}
}

// Decided records tokens decided at t in region for key.
func (o *Oracle) Decided(t time.Duration, region, key int, tokens int64, src Source) {
	o.Advance(t)
	v := float64(tokens)
	bk := &o.books[key*o.nr+region]
	switch src {
	case SourceDenied, SourceUnanswered:
		if src == SourceDenied {
			bk.denied += tokens
		}
		o.res.Denied += v
		if o.afterWarmup(t) {
			o.res.AfterWarmup.Denied += v
		}
		o.w1.add(key, region, 0, 0, v, 0)
		o.w10.add(key, region, 0, 0, v, 0)
		o.w60.add(key, region, 0, 0, v, 0)
		o.series.decided(t, key, region, 0, v)
		return
	case SourceShadow:
		// Admitted, though the region would have denied it: either count
		// may carry it.
		bk.admitted += tokens
		bk.denied += tokens
		o.res.Shadow += v
		return
	case SourceDegraded:
		o.res.Degraded += v
		if o.s.Keys[key].Closed {
			o.closedAdmitted(t, key, v)
		}
	case SourceStrict:
		bk.admitted += tokens
		o.res.Strict += v
		if o.afterWarmup(t) {
			o.res.AfterWarmup.Strict += v
		}
	case SourceLease:
		bk.admitted += tokens
	}
	o.res.Admitted += v
	if o.afterWarmup(t) {
		o.res.AfterWarmup.Admitted += v
	}
	o.w1.add(key, region, 0, v, 0, 0)
	o.w10.add(key, region, 0, v, 0, 0)
	o.w60.add(key, region, 0, v, 0, 0)
	o.series.decided(t, key, region, v, 0)
	o.gcra(t, key, tokens, src != SourceDegraded)
}

// closedAdmitted records a degraded-mode admission of a class that fails
// closed: a violation of the class's on_failure contract, counted with
// invariant 1.
func (o *Oracle) closedAdmitted(t time.Duration, key int, tokens float64) {
	c := &o.res.Conformance
	c.ClosedAdmitted += tokens
	c.Violations++
	if c.Violations == 1 {
		c.FirstAt = t
		c.FirstKey = o.s.Keys[key].Key.String() + " (on_failure: closed admitted in degraded mode)"
	}
}

// gcra runs key's virtual buckets over tokens admitted at t. Exact: the
// check flags any excess over b + r·t (+ ε) of one nanotoken or more.
func (o *Oracle) gcra(t time.Duration, key int, tokens int64, bucketBacked bool) {
	if tokens <= 0 {
		return
	}
	ks := &o.keys[key]
	kd := &o.s.Keys[key]
	if all := excessTokens(ks.gcraAll.admit(ks.rate, t, uint64(tokens)), ks.burst); all > o.res.Conformance.MaxExcessWithDegraded {
		o.res.Conformance.MaxExcessWithDegraded = all
	}
	if !bucketBacked {
		return
	}
	c := &o.res.Conformance
	c.Checks++
	level := ks.gcra.admit(ks.rate, t, uint64(tokens))
	excess := excessTokens(level, ks.burst)
	if excess > c.MaxExcessRaw {
		c.MaxExcessRaw = excess
	}
	switch {
	case ks.burst.add(floatNT(ks.eps)).less(level):
		if beyond := excess - ks.eps; beyond > c.MaxExcess {
			c.MaxExcess = beyond
			c.WorstKey = kd.Key.String()
		}
		if !ks.inViolation {
			ks.inViolation = true
			c.Violations++
			if c.Violations == 1 {
				c.FirstAt = t
				c.FirstKey = kd.Key.String()
			}
		}
	case ks.burst.less(level):
		c.CoveredByEps++
		ks.inViolation = false
	default:
		ks.inViolation = false
	}
}

// --- Other observations. ---

// Reclaimed records that a crashed instance's leases (tokens unspent as
// the region saw them) were all reclaimed by doneAt.
func (o *Oracle) Reclaimed(crashAt, doneAt time.Duration, tokens float64) {
	o.res.Reclaim.Crashes++
	o.res.Reclaim.Tokens += tokens
	if d := doneAt - crashAt; d > o.res.Reclaim.Max {
		o.res.Reclaim.Max = d
	}
}

// RPC counts n calls on a control-plane tier.
func (o *Oracle) RPC(tier Tier, n int) { o.res.RPC[tier] += int64(n) }

// GrantsSent counts n grants the global tier's answers carried (see
// Result.GrantsSent).
func (o *Oracle) GrantsSent(n int) { o.res.GrantsSent += int64(n) }

// Fault records an injected failure.
func (o *Oracle) Fault(at, until time.Duration, label string) {
	o.res.Faults = append(o.res.Faults, Fault{At: at, Until: until, Label: label})
}

// Note records a noteworthy event.
func (o *Oracle) Note(t time.Duration, text string) {
	o.res.Notes = append(o.res.Notes, Note{At: t, Text: text})
}

// --- Windows and measures. ---

func (o *Oracle) closeWindows(t time.Duration) {
	o.w1.closeUntil(t, o.onWindow1)
	o.w10.closeUntil(t, o.onWindow10)
	o.w60.closeUntil(t, o.onWindow60)
	o.series.closeUntil(t, o)
}

// afterWarmup says whether an observation at t counts in the measures.
func (o *Oracle) afterWarmup(t time.Duration) bool { return t >= o.s.Warmup }

func (o *Oracle) measured(start time.Duration, w *window) bool {
	return start >= o.s.Warmup && start+w.size <= o.s.Duration
}

// utilization of one closed window: Σ min(admitted, ideal) / Σ ideal.
func (o *Oracle) utilization(w *window) (num, den, idealAdm, adm float64) {
	secs := w.size.Seconds()
	for _, k := range w.dirty {
		ideal := math.Min(w.keyOff[k], o.s.Keys[k].Rate*secs)
		num += math.Min(w.keyAdm[k], ideal)
		den += ideal
		idealAdm += w.keyIdeal[k]
		adm += w.keyAdm[k]
	}
	return
}

func (o *Oracle) onWindow1(start time.Duration, w *window) {
	if !o.measured(start, w) {
		return
	}
	num, den, idealAdm, adm := o.utilization(w)
	if den > 0 {
		o.util1.add(num / den)
	}
	sec := int(start / time.Second)
	falseBefore := o.falseTok
	defer func() {
		if sec < len(o.secAdm) {
			o.secAdm[sec], o.secIdeal[sec] = adm, idealAdm
			o.secFalse[sec] = o.falseTok - falseBefore
		}
	}()
	secs := w.size.Seconds()
	for _, k := range w.dirty {
		o.offeredAfterWU += w.keyOff[k]
		if sec < len(o.secOff) {
			o.secOff[sec] += w.keyOff[k]
		}
		base := k * o.nr
		anyDenied := false
		for r := 0; r < o.nr; r++ {
			if w.den[base+r] > 0 {
				anyDenied = true
				break
			}
		}
		if !anyDenied {
			continue
		}
		fair := o.fairShares(k, w.off[base:base+o.nr], secs)
		for r := 0; r < o.nr; r++ {
			if d := w.den[base+r]; d > 0 {
				room := fair[r]*secs - w.adm[base+r] - 1
				if room > 0 {
					o.falseTok += math.Min(d, room)
				}
			}
		}
	}
}

// fairShares is the weighted max-min fair division of key k's rate over
// the regions' demands (tokens offered over secs), in tokens/s.
func (o *Oracle) fairShares(k int, offered []float64, secs float64) []float64 {
	dem := make([]float64, o.nr)
	for r := range dem {
		dem[r] = offered[r] / secs
	}
	fairReference(o.s.Keys[k].Rate, o.s.Regions, dem, o.fill)
	return o.fill
}

func (o *Oracle) onWindow10(start time.Duration, w *window) {
	if !o.measured(start, w) {
		return
	}
	secs := w.size.Seconds()
	for _, k := range w.dirty {
		rate := o.s.Keys[k].Rate
		if w.keyOff[k] <= rate*secs {
			continue
		}
		base := k * o.nr
		fair := o.fairShares(k, w.off[base:base+o.nr], secs)
		for r := 0; r < o.nr; r++ {
			if w.off[base+r] <= 0 {
				continue
			}
			o.fairSum[r] += math.Abs(w.adm[base+r]-fair[r]*secs) / (rate * secs)
			o.fairN[r]++
		}
	}
}

func (o *Oracle) onWindow60(start time.Duration, w *window) {
	if !o.measured(start, w) {
		return
	}
	num, den, idealAdm, _ := o.utilization(w)
	if den > 0 {
		o.util60.add(num / den)
		o.idealUtil60.add(math.Min(idealAdm, den) / den)
	}
}

// --- Convergence. ---

type convState struct {
	shift   int
	target  []float64
	tol     []float64 // per region, tokens/s
	horizon int
	cut     ShiftEnd // what ended the watch before the full horizon
	ok      []bool
}

func (o *Oracle) scheduleShifts() {
	next := map[int]time.Duration{}
	for i := len(o.s.Shifts) - 1; i >= 0; i-- {
		sh := o.s.Shifts[i]
		k := &o.s.Keys[sh.Key]
		gap, hasNext := next[sh.Key]
		next[sh.Key] = sh.At
		contended := false
		for r := 0; r < o.nr; r++ {
			if sh.Demand[r] > k.StaticRate[r]*(1+1e-9) {
				contended = true
			}
		}
		if !contended || sh.At < o.s.Warmup {
			continue
		}
		full := o.s.ConvergenceHorizon
		end, cut := o.s.Duration, ShiftRunEnded
		if hasNext && gap <= end {
			end, cut = gap, ShiftSuperseded
		}
		h := int((end - sh.At) / o.s.Epoch)
		if h >= full {
			h, cut = full, ShiftWatched
		}
		if h < 2 {
			continue
		}
		fair := make([]float64, o.nr)
		fairReference(k.Rate, o.s.Regions, sh.Demand, fair)
		tol := make([]float64, o.nr)
		for r := range fair {
			fair[r] = math.Min(fair[r], sh.Demand[r])
			// One epoch's reading of Poisson traffic of rate d has variance
			// d/epoch; the allocator's EWMA of weight α leaves α/(2-α) of
			// it. Three standard deviations is noise, not a missed target.
			a := o.s.DemandAlpha
			noise := 3 * math.Sqrt(a/(2-a)*sh.Demand[r]/o.s.Epoch.Seconds())
			tol[r] = math.Max(o.s.ConvergenceTolerance*k.Rate, noise)
		}
		o.conv = append(o.conv, convState{shift: i, target: fair, tol: tol, horizon: h, cut: cut, ok: make([]bool, h+1)})
	}
	sort.Slice(o.conv, func(i, j int) bool { return o.conv[i].shift < o.conv[j].shift })
	for ci := range o.conv {
		c := &o.conv[ci]
		at := o.s.Shifts[c.shift].At
		for j := 0; j <= c.horizon; j++ {
			o.addTimer(at+time.Duration(j)*o.s.Epoch, timerConv, ci, j)
		}
	}
}

func (o *Oracle) sampleConvergence(ci, j int) {
	c := &o.conv[ci]
	k := o.s.Shifts[c.shift].Key
	ok := true
	for r := 0; r < o.nr; r++ {
		rate, _ := o.rateAt(k, r, o.now)
		if rate < c.target[r]-c.tol[r] {
			ok = false
			break
		}
	}
	c.ok[j] = ok
}

// --- Finishing. ---

// Finish closes every window up to end and returns the result.
func (o *Oracle) Finish(end time.Duration) *Result {
	o.Advance(end)
	r := &o.res
	r.Duration = end
	r.Util1sMean, r.Util1sMin = o.util1.mean(), o.util1.minimum()
	r.Util60sMean, r.Util60sMin = o.util60.mean(), o.util60.minimum()
	r.IdealUtil60sMean = o.idealUtil60.mean()
	r.Windows60 = o.util60.n
	r.VsIdeal = math.NaN()
	var adm, ideal float64
	for i := range o.secAdm {
		adm += o.secAdm[i]
		ideal += o.secIdeal[i]
	}
	if ideal > 0 {
		r.VsIdeal = adm / ideal
	}
	if o.offeredAfterWU > 0 {
		r.FalseRejects = o.falseTok / o.offeredAfterWU
	}
	r.FalseRejectTokens = o.falseTok
	r.Fairness = make([]float64, o.nr)
	r.FairnessWindows = make([]int, o.nr)
	for i := range r.Fairness {
		if o.fairN[i] > 0 {
			r.Fairness[i] = o.fairSum[i] / float64(o.fairN[i])
		}
		r.FairnessWindows[i] = o.fairN[i]
	}
	var epochs []float64
	var held, after int
	for _, c := range o.conv {
		conv := -1
		for j, ok := range c.ok {
			if ok {
				conv = j
				break
			}
		}
		if conv >= 0 {
			for _, ok := range c.ok[conv:] {
				after++
				if ok {
					held++
				}
			}
		}
		sh := o.s.Shifts[c.shift]
		out := ShiftOutcome{Key: o.s.Keys[sh.Key].Key.String(), At: sh.At, Epochs: conv, Watched: c.horizon}
		if conv < 0 {
			out.End = c.cut
		}
		r.Convergence.Each = append(r.Convergence.Each, out)
		if conv < 0 {
			switch c.cut {
			case ShiftSuperseded:
				r.Convergence.Superseded++
			case ShiftRunEnded:
				r.Convergence.Unfinished++
			default:
				r.Convergence.NotConverged++
				if r.Convergence.FirstMiss == "" {
					r.Convergence.FirstMiss = fmt.Sprintf("%s at %v", o.s.Keys[sh.Key].Key, sh.At)
				}
			}
			continue
		}
		epochs = append(epochs, float64(conv))
	}
	r.Convergence.Shifts = len(o.conv)
	r.Convergence.Horizon = o.s.ConvergenceHorizon
	if after > 0 {
		r.Convergence.Held = float64(held) / float64(after)
	}
	if len(epochs) > 0 {
		sort.Float64s(epochs)
		r.Convergence.Max = epochs[len(epochs)-1]
		r.Convergence.P50 = epochs[len(epochs)/2]
	}
	r.Series = o.series.result()
	o.recovered(r)
	return r
}

// stat accumulates a mean and a minimum.
type stat struct {
	sum, lo float64
	n       int
}

func (s *stat) add(v float64) {
	if s.n == 0 || v < s.lo {
		s.lo = v
	}
	s.sum += v
	s.n++
}

func (s *stat) mean() float64 {
	if s.n == 0 {
		return math.NaN()
	}
	return s.sum / float64(s.n)
}

func (s *stat) minimum() float64 {
	if s.n == 0 {
		return math.NaN()
	}
	return s.lo
}
