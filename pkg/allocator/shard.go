package allocator

import (
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	case n != sh.mapN:
		s.log.Warn("global_shards changed: keys move between shards; every shard only re-issues what regions hold until every region runs the new count and one grant validity has passed",
			"shard", sh.index, "from", sh.mapN, "to", n, "revision", s.appliedRev)
		sh.mapN, sh.mapSince, sh.resharding = n, s.appliedRev, true
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
		if confirmed, known := s.conf.Confirm(names); known && confirmed >= sh.mapSince {
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
