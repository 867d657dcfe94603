package allocator

import (
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/shard"
)

// The sharded global tier. Each shard is this package's global tier for
// the keys it owns (pkg/shard: ranges of the key hash space, global_shards
// of them): its own election, allocator, lapsed set and static lease. A
// shard refuses a report naming a key it owns under none of the configs in
// play, changing nothing.
//
// Resharding is made before it breaks. While the shard count of the
// configs in play differs (this replica holds configs with different
// counts, a region runs a revision older than the one the count took
// effect at, or this replica saw the count change and not every region has
// reported the new revision yet), and for one grant validity and one epoch
// after, the shard's allocator learns: it only re-issues what regions
// hold, above-share grants with their own expiry. A key's old owner may
// keep granting it to regions that still run the old map; the new owner
// never raises what a region holds, so the old owner's fences stay right,
// and once every region runs the new map the old owner gets no report
// naming the key and its last grants end within a validity, which the
// learning outlasts.

// shardState is this replica's part of the shard map. Guarded by the
// Service's mu.
type shardState struct {
	index int // the shard this replica serves
	init  bool
	// mapN is the shard count of the live config, in effect (as far as
	// this replica knows) since config revision mapSince.
	mapN     int
	mapSince int64
	// resharding: this replica saw the count change, and the regions have
	// not all confirmed a revision at least mapSince yet.
	resharding bool
	// idleSince is when this replica, leading, last started to own no
	// key under any config in play (zero while it owns some, or when it
	// does not know: cleared at every election, since an earlier leader
	// may have granted).
	idleSince time.Time
	// outSince is when this replica, leading, last saw the live config
	// stop naming this shard (zero while the live config names it, or
	// when it does not know, as idleSince). A region still running an
	// older count may report to it meanwhile, so it is not idleSince,
	// which the forgetting of lapses reads; it is what the logs call the
	// shard's idle time.
	outSince time.Time
}

// idleLocked says whether this shard owns nothing under the live config as
// far as its lapse clock knows: the count reshardLearningLocked last saw,
// since a config may be applied before the silence is restarted (before
// it first ran, the applied config's count: the election started the
// clock). An idle shard lapses no region: no region reports to a shard
// its map does not name, so its silence says nothing about the region.
// s.mu is held.
func (s *Service) idleLocked() bool {
	if !s.sh.init {
		return s.outLocked()
	}
	return s.sh.index >= s.sh.mapN
}

// outLocked says whether the live config leaves this shard out: it owns
// no keys under it (false before a config is applied). s.mu is held.
func (s *Service) outLocked() bool {
	return s.applied != nil && s.sh.index >= s.applied.ShardMap().N()
}

// LapsedKeyOf is shard's durable lapsed set under prefix: LapsedKey for
// shard 0.
func LapsedKeyOf(prefix string, i int) string {
	return strings.TrimSuffix(LapsedKey(prefix), "lapsed") + shard.LapsedName(i)
}

// reshardLearningLocked keeps the allocator learning while keys may move
// between shards, and one validity and one epoch after. s.mu is held and
// the config applied.
func (s *Service) reshardLearningLocked(now time.Time) {
	sh := &s.sh
	n := s.applied.ShardMap().N()
	switch {
	case !sh.init:
		sh.init, sh.mapN, sh.mapSince = true, n, s.appliedRev
		if sh.index >= n {
			// Started ahead of a raise, or with a -shard the config does
			// not count: said once, as nothing else it logs shows it.
			s.log.Warn("this shard owns no keys under the live config: no region reports to it until global_shards includes it",
				"shard", sh.index, "shards", n, "revision", s.appliedRev)
		}
	case n != sh.mapN:
		s.log.Warn("global_shards changed: keys move between shards; every shard only re-issues what regions hold until every region runs the new count and one grant validity has passed",
			"shard", sh.index, "from", sh.mapN, "to", n, "revision", s.appliedRev)
		switch {
		case sh.index >= sh.mapN && sh.index < n:
			s.startOwningLocked(now)
		case sh.index < sh.mapN && sh.index >= n:
			s.log.Warn("this shard owns no keys under the new count: regions still running the old one report to it until they adopt it; stop its replicas afterwards",
				"shard", sh.index, "shards", n, "revision", s.appliedRev)
		}
		sh.mapN, sh.mapSince, sh.resharding = n, s.appliedRev, true
	}
	switch {
	case sh.index < n:
		sh.outSince = time.Time{}
	case sh.outSince.IsZero():
		sh.outSince = now
	}
	owns := false
	for _, cfg := range s.held {
		owns = owns || sh.index < cfg.ShardMap().N()
	}
	switch {
	case owns:
		sh.idleSince = time.Time{}
	case sh.idleSince.IsZero():
		sh.idleSince = now
	}
	moving := false
	for _, cfg := range s.held {
		if cfg.ShardMap().N() != n {
			moving = true
		}
	}
	names := configRegions(s.applied)
	for _, name := range names {
		if revs, heard := s.conf.Reported(name); heard && len(revs) > 0 && revs[len(revs)-1] < sh.mapSince {
			moving = true
		}
	}
	if sh.resharding {
		if confirmed, known := s.conf.Assumed(); known && confirmed >= sh.mapSince {
			sh.resharding = false
			s.log.Info("every region runs the new shard count; learning for one more grant validity",
				"shard", sh.index, "shards", n, "revision", confirmed)
		}
		moving = true
	}
	if moving {
		s.learnFloor = later(s.learnFloor, now.Add(s.timing.validity+s.timing.epoch))
	}
}

// startOwningLocked is called when a config revision makes this shard,
// which owned nothing under the live config, an owner. Regions report only
// to the shards their map names, so none had reason to report to this one:
// its silence clock for every region starts now, as a newly elected
// leader's does, and a region that reports promptly is live and is
// conferred a static lease, not returning. A lapse it still holds (from a
// time it owned keys, or a lapsed set an earlier build wrote while the
// shard owned nothing) is forgotten only when no grant of this shard can
// still be valid: it has owned nothing under any config in play, while
// leading, for longer than a silent region takes to lapse (region lease,
// validity and margin, more than any grant lasts), and no longer learns
// for grants issued under an older timing. Otherwise those regions keep
// waiting as they would for any leader (docs/architecture.md, "The
// sharded global tier"). s.mu is held.
func (s *Service) startOwningLocked(now time.Time) {
	sh := &s.sh
	clean := !sh.idleSince.IsZero() && now.Sub(sh.idleSince) > s.lapseAfterLocked() && !now.Before(s.learnFloor)
	s.alloc.StartOwning(now, clean)
	if clean {
		// Written anew (empty of these regions) with the next lapse write.
		s.storedMoot = true
	}
	s.log.Info("this shard owns keys from now on; every region's silence counts from now",
		"shard", sh.index, "idle_for", idleFor(now, sh.outSince, sh.idleSince), "lapses_forgotten", clean, "lapsed", s.alloc.LapsedSet())
}

// idleFor is how long since the first of since that is known (0 when none
// is).
func idleFor(now time.Time, since ...time.Time) time.Duration {
	for _, t := range since {
		if !t.IsZero() {
			return now.Sub(t)
		}
	}
	return 0
}

// addressedLocked refuses a report the region addressed to another shard
// (RegionReport.shard), whatever it holds and whether this replica leads:
// the region's address for that shard reaches this shard's replicas (a
// -global-addr template naming the wrong one, or a replica started with
// the wrong -shard). Taken, an empty part would be answered as the
// region's whole report to this shard, with its seq: the region's demand
// and holdings here wiped, or the real part answered from that empty
// one, and a static lease conferred in the other shard's name. Not
// InvalidArgument, which a region's client takes as final: it tries the
// shard's other replicas, which may serve the shard. A report that names
// no shard (a region built before the field) is taken. s.mu is held.
func (s *Service) addressedLocked(req *sluicev1.RegionReport) error {
	if req.Shard == nil || int(req.GetShard()) == s.sh.index {
		return nil
	}
	s.m.report(regionLabel(s.applied, req.GetRegion()), "invalid")
	return status.Errorf(codes.FailedPrecondition,
		"allocator: sync: report addressed to global shard %d reached a replica of shard %d: the region's address for shard %d (-global-addr) reaches the wrong shard's replicas, or this replica runs with the wrong -shard",
		req.GetShard(), s.sh.index, req.GetShard())
}

// ownedLocked refuses rep when it names a key this shard owns under none of
// the configs in play (the live one and those regions still run). s.mu is
// held and the config applied.
func (s *Service) ownedLocked(rep hierarchy.Report) error {
	idx := s.sh.index
	maps := make([]shard.Map, 0, 2)
	for _, cfg := range s.held {
		m := cfg.ShardMap()
		if !containsMap(maps, m) {
			maps = append(maps, m)
		}
	}
	live := s.applied.ShardMap()
	if !containsMap(maps, live) {
		maps = append(maps, live)
	}
	if idx == 0 && len(maps) == 1 && maps[0].N() == 1 {
		return nil // one shard owns everything
	}
	for j := range rep.Keys {
		k := rep.Keys[j].Key
		owned := false
		for _, m := range maps {
			if m.Of(k) == idx {
				owned = true
				break
			}
		}
		if !owned {
			return status.Errorf(codes.InvalidArgument,
				"allocator: sync: keys[%d] %s belongs to shard %d under the shard map (global_shards %d at config revision %d), not to shard %d",
				j, k, live.Of(k), live.N(), s.appliedRev, idx)
		}
	}
	return nil
}

func containsMap(maps []shard.Map, m shard.Map) bool {
	for _, x := range maps {
		if x.N() == m.N() {
			return true
		}
	}
	return false
}

// Shard is the shard this replica serves.
func (s *Service) Shard() int { return s.sh.index }
