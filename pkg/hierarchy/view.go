package hierarchy

import (
	"container/heap"
	"slices"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// View is a read-only snapshot of an Allocator for status pages and the
// operator CLI. It shares nothing with the Allocator.
type View struct {
	At            time.Time
	Epoch         uint64
	Learning      bool
	LearningUntil time.Time
	// Regions in configuration order.
	Regions []RegionView
	// Keys that have demand or fencing state, sorted by key.
	Keys []KeyView
}

// RegionView is one region's reporting state.
type RegionView struct {
	Region
	// Reported is false until the first report since the Allocator was
	// created or became leader.
	Reported   bool
	LastReport time.Time
	// LastReportAge is At - LastReport (0 when never reported).
	LastReportAge time.Duration
	LastSeq       uint64
	// Silent regions (no report for longer than the silence timeout, or
	// never) keep the share they may be using; nobody else gets it.
	Silent bool
	// UnknownKeys are keys of the latest report that have no limit (the
	// first few, sorted); UnknownKeyCount counts all of them.
	UnknownKeys     []quota.Key
	UnknownKeyCount int
	// State is what the allocator knows about the region's static lease.
	State RegionState
	// StaticLease is what the allocator believes remains of the region's
	// static lease (an upper bound: the region counts it from the send
	// time of the report it last conferred it to); 0 when none.
	StaticLease time.Duration
	// Floored: the allocator reserves only the region's floor for it
	// without a grant (lapsed or drained). For a drained region that is so
	// only once its static share in the key limits is the drained one
	// (pkg/allocator holds the share of the revision it runs until it
	// reports the draining one).
	Floored bool
	// Lapsed: its static lease lapsed durably and it is counted at its
	// floor; also true for a drained region, whose State says drained.
	Lapsed bool
}

// KeyView is one key's allocation.
type KeyView struct {
	Key   quota.Key
	Limit KeyLimit
	// Contended: some reporting region wants more than its static share.
	Contended bool
	// Active: the key gets grants (contended, or some region may still
	// hold a non-static grant).
	Active bool
	// Regions in configuration order.
	Regions []KeyRegionView
}

// KeyRegionView is one key in one region. Rates are tokens/s, bursts
// tokens.
type KeyRegionView struct {
	// Demand is the EWMA of the region's demand readings (tokens/s).
	Demand float64
	// HeldDemand is the demand the allocation decides on (tokens/s):
	// Demand, except while the region reads none (at most 0.1% of the
	// key's rate) within a hold of its last reading above that, when it
	// still counts as asking (see docs/architecture.md, "Small keys").
	HeldDemand              float64
	StaticRate, StaticBurst float64
	// TargetRate and TargetBurst are the latest allocation (the static
	// shares for keys without fencing state).
	TargetRate, TargetBurst float64
	// GrantedRate and GrantedBurst are the newest grant issued and not yet
	// expired, GrantExpiry its expiry as the allocator bounds it (the
	// region's own expiry is no later); zero when there is none.
	GrantedRate, GrantedBurst float64
	GrantExpiry               time.Time
	// ReservedRate and ReservedBurst are the most the fencing assumes the
	// region may use from now on: what nobody else can be given.
	ReservedRate, ReservedBurst float64
	// FloorRate and FloorBurst are what the region runs on without a
	// static lease.
	FloorRate, FloorBurst float64
}

// View returns a snapshot at now. It is O(keys × regions) and allocates a
// view of every key with fencing state or demand: for the regions alone,
// RegionViews; for the count of contended keys, ContendedKeys.
func (a *Allocator) View(now time.Time) View {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.peek(now)
	a.refreshRank()
	v := a.regionsViewLocked(now, t)
	a.keyViewsLocked(t, &v)
	return v
}

// regionsViewLocked is View(now) without its keys, t being now on the
// allocator's clock. a.mu is held.
func (a *Allocator) regionsViewLocked(now time.Time, t int64) View {
	return View{
		At:            now,
		Epoch:         a.epochs,
		Learning:      t < a.learnUntil,
		LearningUntil: a.wall(a.learnUntil),
		Regions:       a.regionViewsLocked(t),
	}
}

// RegionViews returns View(now).Regions without the keys' views: a
// metrics scrape reads the regions' states every few seconds, and a whole
// view of a quarter of a million contended keys holds the allocator's lock
// (every report waits) while it allocates about a gigabyte.
func (a *Allocator) RegionViews(now time.Time) []RegionView {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.regionViewsLocked(a.peek(now))
}

// ContendedKeys returns how many keys View would show as contended, in
// O(keys with fencing state) and without allocating.
func (a *Allocator) ContendedKeys() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.contendedLocked()
}

// contendedLocked is ContendedKeys. a.mu is held.
func (a *Allocator) contendedLocked() int {
	n := 0
	for b, k := range a.blockKey {
		if k >= 0 && a.blockContended[b] {
			n++
		}
	}
	return n
}

// regionViewsLocked is View's regions at t. a.mu is held.
func (a *Allocator) regionViewsLocked(t int64) []RegionView {
	views := make([]RegionView, a.nr)
	for i := range a.regions {
		rs := &a.regions[i]
		rv := RegionView{
			Region:          rs.Region,
			Reported:        rs.reported,
			LastSeq:         rs.lastSeq,
			Silent:          !rs.reported || t-rs.lastAt > a.silence,
			UnknownKeys:     append([]quota.Key(nil), rs.unknown...),
			UnknownKeyCount: rs.unknownN,
			State:           a.regionStateAt(t, i),
			Floored:         rs.lapsed || rs.Drained,
			Lapsed:          rs.lapsed,
		}
		if rs.conferredAt != negInf && !rs.lapsed && !rs.returning {
			rv.StaticLease = max(0, time.Duration(rs.conferredAt+a.regionLease-t))
		}
		if rs.reported {
			rv.LastReport = a.wall(rs.lastAt)
			rv.LastReportAge = time.Duration(t - rs.lastAt)
		}
		views[i] = rv
	}
	return views
}

// keyViewsLocked appends View's keys at t to v. a.mu is held and the rank
// refreshed.
func (a *Allocator) keyViewsLocked(t int64, v *View) {
	for _, k := range a.byRank {
		if a.viewedLocked(k) {
			v.Keys = append(v.Keys, a.keyViewLocked(k, t))
		}
	}
}

// viewedLocked says whether View shows slot k: it has fencing state or a
// region's demand reading. a.mu is held.
func (a *Allocator) viewedLocked(k int32) bool {
	if a.blockOf[k] >= 0 {
		return true
	}
	for i := 0; i < a.nr; i++ {
		if a.lastObs[int(k)*a.nr+i] != 0 {
			return true
		}
	}
	return false
}

// keyViewLocked is View's entry for slot k at t. a.mu is held.
func (a *Allocator) keyViewLocked(k int32, t int64) KeyView {
	b := a.blockOf[k]
	l := a.limits[k]
	kv := KeyView{Key: a.keys[k], Limit: l, Regions: make([]KeyRegionView, a.nr)}
	if b >= 0 {
		kv.Contended = a.blockContended[b]
		kv.Active = true
	}
	for i := range a.regions {
		s, sb := a.static(k, i)
		fr, fb := a.fallback(k, i)
		cr, cb := a.counted(k, i)
		flr, flb := a.floorOf(k, i)
		rv := KeyRegionView{
			Demand:     a.estimate(k, i),
			HeldDemand: a.effectiveDemand(k, i, t),
			StaticRate: s, StaticBurst: sb,
			TargetRate: fr, TargetBurst: fb,
			ReservedRate: cr, ReservedBurst: cb,
			FloorRate: flr, FloorBurst: flb,
		}
		if b >= 0 {
			f := &a.fences[i][b]
			rv.TargetRate = a.targetRate[int(b)*a.nr+i]
			rv.TargetBurst = a.targetBurst[int(b)*a.nr+i]
			for j := int(f.n) - 1; j >= 0; j-- {
				r := &f.recs[j]
				if r.flags&recPseudo == 0 && r.ue > t {
					rv.GrantedRate, rv.GrantedBurst = r.rate, r.burst
					rv.GrantExpiry = a.wall(r.ue)
					break
				}
			}
			sm := &a.summaries[int(b)*a.nr+i]
			if sm.rateT > t {
				rv.ReservedRate = max(sm.rateV, cr)
			}
			if sm.burstT > t {
				rv.ReservedBurst = max(sm.burstV, cb)
			}
		}
		kv.Regions[i] = rv
	}
	return kv
}

// TopView is View(now) with only the n keys under the most pressure, in
// that order: the sum of the regions' demand estimates (KeyRegionView.
// Demand) over the key's rate, highest first, ties by tenant then class.
// It also returns how many keys View shows as contended (ContendedKeys).
// It holds the lock for O(keys × regions) reads and O(keys·log n)
// comparisons but builds the views of n keys only: the leader's Status
// (sluicectl status) showed the top keys of a View of every key, which at
// 100,000 contended keys held every report off for about 150 ms and
// allocated about 160 MB per call. n <= 0 shows no key.
func (a *Allocator) TopView(now time.Time, n int) (View, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.peek(now)
	v := a.regionsViewLocked(now, t)
	contended := a.contendedLocked()
	if n <= 0 {
		return v, contended
	}
	// h holds the n highest-ranked keys so far, lowest first: the one a
	// higher key replaces.
	h := &rankHeap{a: a, keys: make([]rankedKey, 0, min(n, len(a.keyIndex)))}
	for k := range a.keys {
		k := int32(k)
		if !a.keyLive[k] || !a.viewedLocked(k) {
			continue
		}
		var d float64
		for i := 0; i < a.nr; i++ {
			d += a.estimate(k, i)
		}
		r := rankedKey{k: k, pressure: d / a.limits[k].Rate}
		switch {
		case h.Len() < n:
			heap.Push(h, r)
		case a.ranksAbove(r, h.keys[0]):
			h.keys[0] = r
			heap.Fix(h, 0)
		}
	}
	top := h.keys
	slices.SortFunc(top, func(x, y rankedKey) int {
		switch {
		case a.ranksAbove(x, y):
			return -1
		case a.ranksAbove(y, x):
			return 1
		}
		return 0
	})
	v.Keys = make([]KeyView, len(top))
	for i, r := range top {
		v.Keys[i] = a.keyViewLocked(r.k, t)
	}
	return v, contended
}

// rankedKey is a key slot and its pressure for TopView: the sum of the
// regions' demand estimates over the key's rate.
type rankedKey struct {
	k        int32
	pressure float64
}

// ranksAbove says whether x comes before y in TopView: higher pressure
// first, ties by tenant then class. a.mu is held.
func (a *Allocator) ranksAbove(x, y rankedKey) bool {
	if x.pressure != y.pressure {
		return x.pressure > y.pressure
	}
	kx, ky := a.keys[x.k], a.keys[y.k]
	if kx.Tenant != ky.Tenant {
		return kx.Tenant < ky.Tenant
	}
	return kx.Class < ky.Class
}

// rankHeap is a container/heap of ranked keys, the lowest-ranked at the
// root.
type rankHeap struct {
	a    *Allocator
	keys []rankedKey
}

func (h *rankHeap) Len() int           { return len(h.keys) }
func (h *rankHeap) Less(i, j int) bool { return h.a.ranksAbove(h.keys[j], h.keys[i]) }
func (h *rankHeap) Swap(i, j int)      { h.keys[i], h.keys[j] = h.keys[j], h.keys[i] }
func (h *rankHeap) Push(x any)         { h.keys = append(h.keys, x.(rankedKey)) }
func (h *rankHeap) Pop() any {
	last := h.keys[len(h.keys)-1]
	h.keys = h.keys[:len(h.keys)-1]
	return last
}
