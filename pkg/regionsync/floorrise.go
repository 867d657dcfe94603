package regionsync

import (
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/shard"
)

// Coming back from a floor, the region's side: when it rose.
//
// A region that ran on its floor (its static lease ended, or a config in
// its chain drained it) may have been counted at that floor by the global
// tier, which then gave the rest of its static share to the other regions,
// who may have spent it just before the region came back. A bucket left
// idle across the floor must then not be credited its idle time at the
// restored static rate, nor a missing key born full: the region's
// admissions right after it came back would exceed b + r·t. So the region
// keeps, per global-tier shard, its rise: the Redis time (µs) from which
// its static share stands above its floor again, and hands it to the
// scripts with the key's floor (luascripts.Common.RiseUS, FloorRate,
// FloorBurst), which credit idle time before it at most at the floor.
//
// A rise happens when a static lease that had ended runs again (CameBack),
// or when a confirmation drops the last config of the chain that drains
// the region (DrainLifted). A later rise is always the safe side: it only
// credits more of a bucket's idle time at the floor.

// ShardRises is a region's rise per global-tier shard (Redis time, µs; 0
// for none), indexed by shard. Each only grows. A value: methods return
// new slices.
type ShardRises []int64

// Of is shard i's rise (0 when i is past the end or negative).
func (s ShardRises) Of(i int) int64 {
	if i < 0 || i >= len(s) {
		return 0
	}
	return s[i]
}

// With is s with shard i's rise raised to us (never lowered).
func (s ShardRises) With(i int, us int64) ShardRises {
	out := make(ShardRises, max(len(s), i+1))
	copy(out, s)
	out[i] = max(out[i], us)
	return out
}

// Merge is the elementwise later of s and o.
func (s ShardRises) Merge(o ShardRises) ShardRises {
	out := make(ShardRises, max(len(s), len(o)))
	copy(out, s)
	for i, us := range o {
		out[i] = max(out[i], us)
	}
	return out
}

// All is s with the rise of every shard below n, and of every shard s
// holds, raised to us: a rise of the whole region (a drain lifted).
func (s ShardRises) All(n int, us int64) ShardRises {
	out := make(ShardRises, max(len(s), n))
	copy(out, s)
	for i := range out {
		out[i] = max(out[i], us)
	}
	return out
}

// KeyRise is the rise key k runs under: the latest among the rises of its
// owners under every map in maps (the shards whose leases KeyLease takes
// the shortest of: the key ran on its floor while any of them had ended).
// With no map it is shard 0's rise.
func KeyRise(k quota.Key, maps []shard.Map, rises ShardRises) int64 {
	if len(rises) == 0 {
		return 0 // no rise known: the key is not hashed (every request asks)
	}
	if len(maps) == 0 {
		return rises.Of(0)
	}
	out := int64(0)
	for _, m := range maps {
		out = max(out, rises.Of(m.Of(k)))
	}
	return out
}

// CameBack says whether the region's view of a lease going from old to
// next at estUS (a conservative estimate of Redis time: an upper bound)
// saw it come back from an end the global tier may have counted: old had
// ended a grant validity (validity) before estUS, and next runs then. The
// global tier counts a silent region at its floor only once it heard
// nothing for region_lease + V + a margin, so no earlier than V after the
// end of the lease the region's last answered report conferred; a lease
// that runs again sooner was never counted at its floor, and a rise there
// would only credit its idle keys less. A lease never held (old.UntilUS 0:
// a fresh region, a new shard, or a view that never read one) is no come
// back: the global tier never counted the region at its floor for it (a
// region it never heard from counts at its static share or more). An
// estimate ahead of Redis time may see a lease as come back a little
// early: a later rise, the safe side.
func CameBack(old, next StaticLease, estUS int64, validity time.Duration) bool {
	return old.UntilUS > 0 && old.UntilUS+max(validity, 0).Microseconds() <= estUS && next.Valid(estUS)
}

// Noticed is s after a view of the shards' leases went from old to next
// at estUS: every shard whose lease CameBack (validity: the grant validity)
// rises at estUS.
func (s ShardRises) Noticed(old, next ShardLeases, estUS int64, validity time.Duration) ShardRises {
	out := s
	for i := range next {
		if CameBack(old.Of(i), next.Of(i), estUS, validity) {
			out = out.With(i, estUS)
		}
	}
	return out
}

// Drains says whether some config that counts in the chain's Share drains
// region: its static share there is then its floor.
func (c Chain) Drains(region string) bool {
	drains := false
	c.each(func(e Revision) {
		if e.Cfg != nil && e.Cfg.Regions[region].Drained {
			drains = true
		}
	})
	return drains
}

// DrainLifted says whether a region whose chain went from old to next
// came back from a drain: some config of old drains it and none of next
// does. Only a confirmation does that (Confirm drops configs; Adopt only
// adds one, or replaces or runs unlisted one never reported, which the
// global tier never heard drain the region, so never counted it at its
// floor for).
func DrainLifted(region string, old, next Chain) bool {
	return old.Drains(region) && !next.Drains(region)
}
