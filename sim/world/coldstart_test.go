package world

import (
	"strings"
	"testing"
	"time"
)

// TestColdStartFullAfterALossIsCountedAsEpsilon: region b dies with its
// Redis and comes back 1 s later on an empty Redis. Its processes start
// again and take their first look at that Redis: under cold_start
// conservative they date the data set from then and its buckets start
// empty (no crash error ε); under cold_start full they trust it to be a
// fresh deployment and its buckets start full, the documented opt-out of
// invariant 1, whose holdings the oracle counts as ε when first seen.
// Either way the oracle passes.
func TestColdStartFullAfterALossIsCountedAsEpsilon(t *testing.T) {
	for _, mode := range []string{"conservative", "full"} {
		// read keeps its whole static share off the static lease
		// (partition_share 1), as a lost Redis leaves the region without
		// one: a bucket trusted full holds a whole burst at once.
		text := strings.Replace(base, "  instance_clock_skew: 30ms\n", "  instance_clock_skew: 30ms\n  cold_start: "+mode+"\n", 1)
		text = strings.Replace(text, "classes: {read: {}", "classes: {read: {partition_share: 1}", 1) +
			"faults: [{at: 30s, kind: region-down, region: b, restart_after: 3s, redis_lost: true}]\n"
		h := buildFrom(t, text)
		h.start()
		h.until(2 * time.Minute)
		r := h.orc.Finish(2 * time.Minute)
		if !r.Pass() {
			t.Fatalf("cold_start %s: invariants broken around a region restarted on an empty Redis: %s", mode, r)
		}
		eps := r.Conformance.CrashError
		switch {
		case mode == "conservative" && eps != 0:
			t.Fatalf("cold_start conservative counted ε %v: the restarted region's buckets did not start empty", eps)
		case mode == "full" && eps <= 0:
			t.Fatalf("cold_start full after a loss counted no ε: its full buckets went unaccounted")
		}
		t.Logf("cold_start %s: ε %.1f tokens", mode, eps)
	}
}
