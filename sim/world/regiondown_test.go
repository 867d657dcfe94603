package world

import (
	"testing"
	"time"
)

// TestRegionDownStopsEverythingThereAndRestarts: a dead region has no
// instances, no region leader, no global replica and no link; its traffic
// finds no one; restarted, it comes back whole, its Redis as it was or
// empty.
func TestRegionDownStopsEverythingThereAndRestarts(t *testing.T) {
	for _, lost := range []bool{false, true} {
		extra := "faults: [{at: 30s, kind: region-down, region: b, restart_after: 40s}]\n"
		if lost {
			extra = "faults: [{at: 30s, kind: region-down, region: b, restart_after: 40s, redis_lost: true}]\n"
		}
		h := build(t, extra)
		h.start()
		h.until(29 * time.Second)
		b := h.w.regions[1]
		model := b.model
		standby := h.w.global.nodes[1]
		if !b.leaderUp || len(b.insts) != 2 || !standby.alive {
			t.Fatal("region b not running before the fault")
		}
		h.until(31 * time.Second)
		if b.leaderUp || len(b.insts) != 0 || standby.alive || b.redisUp || !h.w.net.down[b.idx] {
			t.Fatalf("region b still running after region-down: leader %v, %d instances, standby %v, redis %v",
				b.leaderUp, len(b.insts), standby.alive, b.redisUp)
		}
		if _, lostMsg := h.w.net.globalDelay(b.idx, 0); !lostMsg {
			t.Fatal("a dead region still reaches the global tier")
		}
		unserved := h.w.counters.UnservedTokens
		h.until(60 * time.Second)
		if h.w.counters.UnservedTokens <= unserved {
			t.Fatal("traffic offered in a dead region was served")
		}
		if b.leaderUp || len(b.insts) != 0 {
			t.Fatal("a dead region elected a leader or started instances")
		}
		h.until(71 * time.Second)
		if !b.leaderUp || len(b.insts) != 2 || !standby.alive || !b.redisUp || h.w.net.down[b.idx] {
			t.Fatalf("region b not back: leader %v, %d instances, standby %v, redis %v", b.leaderUp, len(b.insts), standby.alive, b.redisUp)
		}
		if (b.model != model) != lost {
			t.Fatalf("redis_lost %v but the Model was replaced: %v", lost, b.model != model)
		}
		h.until(2 * time.Minute)
		if r := h.orc.Finish(2 * time.Minute); !r.Pass() {
			t.Fatalf("invariants broken around a region-down (lost %v): %s", lost, r)
		}
	}
}
