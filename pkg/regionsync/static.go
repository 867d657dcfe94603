package regionsync

import (
	"fmt"
	"math"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

// StaticLease is a region's static lease: until when (Redis time, µs) the
// region may run on its static shares. Past it the region runs on its
// floor (each class's partition_share of the static share). The zero
// value holds no lease: a region whose Redis lost the lease, or that never
// had one, runs on its floor.
//
// The lease only ever grows (every method takes the max): a lease the
// global tier conferred, or that the region took while no global leader
// was elected, stays a promise the global tier keeps until it ends, so
// reordered answers, a late write by a deposed region leader and a merge
// of the leader's and Redis's copies are all safe. A value; safe to copy.
type StaticLease struct {
	// UntilUS is the end of the lease in the region's Redis time (µs); 0
	// for none.
	UntilUS int64
}

// Valid says whether the lease is still running at Redis time nowUS.
func (s StaticLease) Valid(nowUS int64) bool { return nowUS < s.UntilUS }

// ValidMs is the report's static_valid_ms for a report sent at sendUS:
// the lease's remaining validity in whole milliseconds (rounded down, so
// never more than the region holds), 0 when it runs on its floor.
func (s StaticLease) ValidMs(sendUS int64) int64 {
	if s.UntilUS <= sendUS {
		return 0
	}
	return (s.UntilUS - sendUS) / 1000
}

// Merge is the longer of two copies of the lease (the leader's and the one
// stored in Redis).
func (s StaticLease) Merge(o StaticLease) StaticLease {
	return StaticLease{UntilUS: max(s.UntilUS, o.UntilUS)}
}

// Answered is the lease after the global tier's answer g to the report sent
// at sendUS (Redis time, read before sending): when g confers a static
// lease (static_lease_ms > 0) it runs until sendUS + static_lease_ms,
// unless the lease already runs longer. Measured from the send time, the
// region's lease never ends after the one the global tier counts (from
// when it received the report). An answer conferring none (0) changes
// nothing: it neither shortens nor extends. Answers are ordered as grants
// are: an answer to an older report never shortens a lease a newer one
// conferred (max). A negative or oversized static_lease_ms is refused and
// changes nothing.
func (s StaticLease) Answered(g *sluicev1.RegionGrants, sendUS int64) (StaticLease, error) {
	ms := g.GetStaticLeaseMs()
	switch {
	case ms == 0:
		return s, nil
	case ms < 0 || ms > MaxWireMillis || sendUS > math.MaxInt64-ms*1000:
		return s, fmt.Errorf("%w: static_lease_ms %d must be in 0..%d", quota.ErrInvalid, ms, MaxWireMillis)
	}
	return s.Merge(StaticLease{UntilUS: sendUS + ms*1000}), nil
}

// NoGlobalLeader is the lease after the region leader read, linearizably
// from etcd, that no global leader was elected, the read sent at Redis
// time fromUS and answered at toUS (both read around it, so the read took
// effect between them). A global leader elected after the read starts
// counting the region's silence after fromUS, so it cannot find the lease
// lapsed before fromUS + regionLease + grant validity: the region may run
// on its static shares until fromUS + regionLease.
//
// Only a lease still running at toUS is extended: a leader that died
// before the read may have found the region lapsed and handed its share
// to other regions with grants still valid. That cannot have happened
// while the lease runs (the global tier finds a region lapsed no earlier
// than a grant validity after the end of the lease it last conferred), so
// a lapsed region is never revived this way; it waits for a global leader
// to confer a lease again. A non-positive regionLease, or toUS before
// fromUS, changes nothing.
func (s StaticLease) NoGlobalLeader(fromUS, toUS int64, regionLease time.Duration) StaticLease {
	if regionLease <= 0 || toUS < fromUS || !s.Valid(toUS) {
		return s
	}
	return s.Merge(StaticLease{UntilUS: fromUS + regionLease.Microseconds()})
}

// RedisClock is a replica's reading of its region's Redis time: TIME as
// Redis answered it, and the local (monotonic) time the request was sent.
// Redis read its clock after the request left, so RedisUS + the local time
// elapsed since Sent is an upper bound of Redis time now (up to the two
// clocks' rate difference, which StaticMargin covers).
type RedisClock struct {
	RedisUS int64
	Sent    time.Time
}

// Estimate is the conservative (upper) estimate of Redis time at local
// time now. A zero clock (never read) estimates the far future: no lease
// is known valid before the first reading.
func (c RedisClock) Estimate(now time.Time) int64 {
	if c.Sent.IsZero() {
		return math.MaxInt64
	}
	return c.RedisUS + max(0, now.Sub(c.Sent)).Microseconds()
}

// StaticMargin is how long before the end of its static lease a replica
// already hands its scripts the floor: one epoch. It covers a script that
// runs some time after the replica chose its share (bounded by the Redis
// timeout) and the drift between the replica's clock and Redis's between
// two readings. The global tier's own margin (it finds a region lapsed a
// grant validity and a clock margin after the end of the lease) comes on
// top.
func StaticMargin(epoch time.Duration) time.Duration { return epoch }

// ScriptDeadline is the deadline (Redis time, µs; luascripts.Common.
// DeadlineUS) of a script handed its settings when the replica's
// conservative estimate of Redis time was estUS: the end of the static
// lease when the script is handed the static share (the global tier counts
// the share until then, and a grant validity and a clock margin past it),
// so a script a paused Redis runs later changes nothing; 0 (none) when it
// is handed the floor, which is safe whenever it runs.
func ScriptDeadline(estUS int64, lease StaticLease, margin time.Duration) int64 {
	if OnStatic(estUS, lease, margin) {
		return lease.UntilUS
	}
	return 0
}

// OnStatic says whether a replica whose conservative estimate of Redis
// time is estUS may hand its scripts its static shares under lease:
// estUS + margin is still before the lease's end. Stale readings of the
// lease are safe: they only lag its extensions.
func OnStatic(estUS int64, lease StaticLease, margin time.Duration) bool {
	if estUS >= math.MaxInt64-margin.Microseconds() {
		return false
	}
	return estUS+margin.Microseconds() < lease.UntilUS
}

// Share is a static rate and burst.
type Share struct{ Rate, Burst float64 }

// Choose is the rate and burst a replica hands its scripts for one key: the
// static share while OnStatic, else the floor.
func Choose(estUS int64, lease StaticLease, margin time.Duration, static, floor Share) Share {
	if OnStatic(estUS, lease, margin) {
		return static
	}
	return floor
}

// Floor is the region's floor for a key: the smallest floor (config's
// FloorOf: the class's partition_share of the undrained static share,
// hierarchy.Floor) among cfg (res the key resolved there) and the chain's
// configs, the key resolved under each, as Share is the smallest static
// share. A config under which the key does not resolve counts as 0.
func (c Chain) Floor(region string, k quota.Key, cfg *config.Config, res config.Resolved) (rate, burst float64, err error) {
	rate, burst, err = cfg.FloorOf(region, res)
	if err != nil {
		return 0, 0, err
	}
	c.each(func(e Revision) {
		if e.Cfg == cfg {
			return
		}
		r, b := FloorUnder(e.Cfg, region, k)
		rate, burst = math.Min(rate, r), math.Min(burst, b)
	})
	return rate, burst, nil
}

// Leased is what a replica hands its scripts for a key under the static
// lease: Share while OnStatic(estUS, lease, margin), else Floor.
func (c Chain) Leased(region string, k quota.Key, cfg *config.Config, res config.Resolved, estUS int64, lease StaticLease, margin time.Duration) (rate, burst float64, err error) {
	if OnStatic(estUS, lease, margin) {
		return c.Share(region, k, cfg, res)
	}
	return c.Floor(region, k, cfg, res)
}

// FloorUnder is region's floor for k under cfg, 0 when k does not resolve
// there or the region is not in it.
func FloorUnder(cfg *config.Config, region string, k quota.Key) (rate, burst float64) {
	if cfg == nil {
		return 0, 0
	}
	res, err := cfg.Resolve(k)
	if err != nil {
		return 0, 0
	}
	r, b, err := cfg.FloorOf(region, res)
	if err != nil {
		return 0, 0
	}
	return r, b
}

// FloorOf is the floor of a static share of a key resolved to res
// (hierarchy.Floor under its class's partition_share), for a caller (the
// simulator) that holds the static share already.
func FloorOf(static Share, res config.Resolved) Share {
	r, b := hierarchy.Floor(static.Rate, static.Burst, res.Class.PartitionFraction(), res.Class.Unit())
	return Share{Rate: r, Burst: b}
}
