package world

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/hierarchy"
)

// regionState is region's state in node's allocator.
func regionState(n *GlobalNode, region string) hierarchy.RegionState {
	for _, r := range n.alloc.View(n.now()).Regions {
		if r.Name == region {
			return r.State
		}
	}
	return ""
}

// TestGlobalLapseSurvivesLeaderChange: region a, cut from the global tier
// for longer than region_lease, lapses once the global tier has not heard
// it for region_lease + validity + margin; the lapsed set outlives the
// leader (the standby that takes over reads it, and confers a no static
// lease until it has heard a and learned), and a is conferred its lease
// again once the partition heals and that is safe; the set then drops a.
// The invariants hold throughout.
func TestGlobalLapseSurvivesLeaderChange(t *testing.T) {
	// Lease 12s: a, silent from 20s, lapses after 12s + 5s + 1s, by 39s.
	h := buildFrom(t, strings.Replace(base, "default_tier: t\n", "default_tier: t\n  region_lease: 12s\n", 1)+
		"faults: [{at: 20s, kind: partition, region: a, for: 45s}, {at: 50s, kind: global-leader-loss, restart_after: 20s}]\n")
	h.start()
	g := h.w.global
	h.until(36 * time.Second)
	if st := regionState(g.leader, "a"); st != hierarchy.StateSilent || slices.Contains(g.lapsed, "a") {
		t.Fatalf("a is %s (lapsed set %v) before region_lease + validity + margin of silence", st, g.lapsed)
	}
	h.until(41 * time.Second)
	if st := regionState(g.leader, "a"); st != hierarchy.StateLapsed || !slices.Equal(g.lapsed, []string{"a"}) {
		t.Fatalf("a is %s (lapsed set %v) after region_lease + validity + margin of silence", st, g.lapsed)
	}
	h.until(50*time.Second + h.w.sessionTTL + time.Second)
	if g.leader == nil || g.leader == g.nodes[0] || !g.leader.alloc.Learning(g.leader.now()) {
		t.Fatal("the standby did not take over in learning mode")
	}
	if !slices.Equal(g.leader.alloc.LapsedSet(), []string{"a"}) {
		t.Fatalf("the new leader's lapsed set %v, want [a] from etcd", g.leader.alloc.LapsedSet())
	}
	// Heals at 65s: a is heard again, and conferred its lease once safe.
	h.until(64 * time.Second)
	if !slices.Contains(g.leader.alloc.LapsedSet(), "a") {
		t.Fatal("a left the lapsed set while still cut off")
	}
	h.until(65*time.Second + h.w.validity + 3*time.Second)
	if st := regionState(g.leader, "a"); st != hierarchy.StateLive {
		t.Fatalf("a is %s a validity after the partition healed", st)
	}
	h.until(80 * time.Second)
	if slices.Contains(g.lapsed, "a") {
		t.Fatalf("the lapsed set still names a (%v) long after its lease was conferred", g.lapsed)
	}
	h.until(2 * time.Minute)
	if r := h.orc.Finish(2 * time.Minute); !r.Pass() {
		t.Fatalf("invariants: %+v %+v %+v", r.Conformance, r.Rates, r.Bursts)
	}
}
