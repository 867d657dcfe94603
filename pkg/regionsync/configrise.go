package regionsync

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Shares raised by a config: when they rose, and from what.
//
// A confirmation lets the region's static shares rise to a newer config's
// (a weight or a limit raised: Chain). The other regions adopted their
// decreases before it, but may have spent their old, larger shares just
// before; a bucket of this region idle across the confirmation, credited
// its idle time at the raised rate up to the raised cap, hands out at once
// more than the region held before, and the window exceeds b + r·t by the
// raise. So the region remembers, for a few recent confirmations, when it
// applied each (RiseUS, on its upper estimate of Redis time) and its chain
// just before (Before): for a key, the smallest share under that chain is
// what the region ran before the rise, and the scripts credit idle time
// before it at most that (luascripts.Common.RiseUS, FloorRate, FloorBurst),
// exactly as for a rise off a floor (ShardRises). A key whose share did not
// rise gets no rise: nothing changes for it.
//
// This is a process's own memory, not stored: a replica applies each
// confirmation itself (its own rise is later than the leader's, which only
// credits less), and a process that starts knows no confirmation before
// its start (docs/architecture.md, "Coming back from a floor").

// MaxConfigRises is how many recent confirmations a region remembers; an
// older one is forgotten (its rise matters only for keys that refill their
// share slower than the confirmations came).
const MaxConfigRises = 4

// ConfigRise is one confirmation that may have raised static shares: when
// the process applied it (Redis time, µs, an upper estimate) and the chain
// before it.
type ConfigRise struct {
	RiseUS int64
	Before Chain
}

// ConfigRises are a region's recent confirmations, oldest first, at most
// MaxConfigRises. A value: methods return a new slice.
type ConfigRises []ConfigRise

// Confirmed is r after a confirmation took the chain from old to next at
// riseUS: a confirmation that dropped a config from the chain (the only
// way a share rises) is remembered; one that dropped nothing changes
// nothing.
func (r ConfigRises) Confirmed(old, next Chain, riseUS int64) ConfigRises {
	if !MayRaise(old, next) {
		return r
	}
	out := make(ConfigRises, 0, MaxConfigRises)
	if len(r) >= MaxConfigRises {
		r = r[len(r)-MaxConfigRises+1:]
	}
	out = append(out, r...)
	return append(out, ConfigRise{RiseUS: riseUS, Before: old})
}

// ran is the share the region ran for k under the chain, as the floor of a
// rise: the smallest under its configs other than cfg (the config the
// request is served under, whose share the caller holds), except that a
// config that does not know k's class at all is left out. Under such a
// config no region had a share of the class, so nothing was spent there
// that the rise must make up for; and a key of a class the region awaited
// is born full once its share comes (docs/architecture.md, "A key first
// used while its share is awaited"). A config that lacks the region
// counts, as in Share, as a share of 0: the others ran the whole limit
// there. +Inf for none. memo keeps each config's share for the call, as
// consecutive confirmations' chains share most of their configs.
func (c Chain) ran(region string, k quota.Key, cfg *config.Config, memo *shareMemo) Share {
	out := Share{Rate: math.Inf(1), Burst: math.Inf(1)}
	c.each(func(e Revision) {
		if e.Cfg == cfg || e.Cfg == nil {
			return
		}
		if _, ok := e.Cfg.Classes[k.Class]; !ok {
			return
		}
		sh := memo.of(e.Cfg, region, k)
		out = Share{Rate: math.Min(out.Rate, sh.Rate), Burst: math.Min(out.Burst, sh.Burst)}
	})
	return out
}

// shareMemo is ShareUnder per config for one key, kept for one RiseFor
// call (on its stack: up to a chain's worth of configs, then recomputed).
type shareMemo struct {
	n   int
	cfg [MaxChain]*config.Config
	sh  [MaxChain]Share
}

func (m *shareMemo) of(cfg *config.Config, region string, k quota.Key) Share {
	for i := range m.n {
		if m.cfg[i] == cfg {
			return m.sh[i]
		}
	}
	r, b := ShareUnder(cfg, region, k)
	sh := Share{Rate: r, Burst: b}
	if m.n < len(m.cfg) {
		m.cfg[m.n], m.sh[m.n] = cfg, sh
		m.n++
	}
	return sh
}

// MayRaise says whether a confirmation that took the chain from old to
// next may have raised a share: it dropped a config (Share is the smallest
// under the chain's configs, so only a config leaving it can raise it).
func MayRaise(old, next Chain) bool {
	return next.Confirmed() != old.Confirmed() || next.Len() < old.Len()
}

// Rise is what the scripts are told of a key's rises: the latest rise that
// can still matter and the floor before it (luascripts.Common.RiseUS,
// FloorRate, FloorBurst). The zero value is none.
type Rise struct {
	RiseUS int64
	Floor  Share
}

// RiseFor is the rise of key k (resolved to res under cfg, the config the
// request is served under) handed its static share at the replica's
// estimate of Redis time estUS: of floorRiseUS (the key's shards' rise off
// a floor, ShardRises; its floor is floor) and of the confirmations of
// rises, those that can still matter, the latest rise, and the smallest of
// their floors (at most share).
//
// A rise matters only within the key's fill time (fill: its class's burst
// over rate, which bounds the fill time of every region's share) after it:
// a bucket idle across a rise older than that is full at its cap whether
// the time before the rise was credited at the floor or not. margin (the
// static lease's: StaticMargin) covers estUS's lead on Redis time. Taking
// the latest rise and the smallest floor of those still in play only
// credits less.
func RiseFor(estUS int64, fill, margin time.Duration, floorRiseUS int64, floor, share Share, rises ConfigRises,
	region string, k quota.Key, cfg *config.Config, res config.Resolved) Rise {
	horizon := (fill + margin).Microseconds()
	matters := func(us int64) bool { return us > 0 && (fill <= 0 || estUS-us < horizon) }
	below := func(f Share) bool { return f.Rate < share.Rate || f.Burst < share.Burst }
	var out Rise
	var memo shareMemo
	if matters(floorRiseUS) && below(floor) {
		out = Rise{RiseUS: floorRiseUS, Floor: floor}
	}
	for _, cr := range rises {
		if !matters(cr.RiseUS) {
			continue
		}
		ran := cr.Before.ran(region, k, cfg, &memo)
		before := Share{Rate: math.Min(ran.Rate, share.Rate), Burst: math.Min(ran.Burst, share.Burst)}
		if !below(before) {
			continue // the key's share did not rise: nothing to credit less
		}
		if out.RiseUS == 0 {
			out = Rise{RiseUS: cr.RiseUS, Floor: before}
			continue
		}
		out.RiseUS = max(out.RiseUS, cr.RiseUS)
		out.Floor = Share{Rate: math.Min(out.Floor.Rate, before.Rate), Burst: math.Min(out.Floor.Burst, before.Burst)}
	}
	return out
}
