package world

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// comeBack runs h until region r's static shares rose off their floor (its
// rise is set and k is handed its static share again), at most until
// limit, and returns the rise.
func comeBack(t *testing.T, h *harness, r *Region, k *keyInfo, static float64, limit time.Duration) int64 {
	t.Helper()
	for step := h.w.dur(); step < limit; step += 100 * time.Millisecond {
		h.until(step)
		if c := r.common(k); r.riseUS > 0 && c.StaticRate == static {
			if c.RiseUS != r.riseUS {
				t.Fatalf("%s hands its scripts the rise %d, the region's is %d", r.name, c.RiseUS, r.riseUS)
			}
			return r.riseUS
		}
	}
	t.Fatalf("%s never came back to its static share %v by %v (rise %d)", r.name, static, limit, r.riseUS)
	return 0
}

// keyNamed is the world's key of tenant/read.
func keyNamed(t *testing.T, w *World, tenant string) *keyInfo {
	t.Helper()
	for _, k := range w.keys {
		if k.key.Tenant == tenant && k.key.Class == "read" {
			return k
		}
	}
	t.Fatalf("no key %s/read", tenant)
	return nil
}

// askAll is an instance of r asking for k's whole burst now, through the
// region's scripts as the regional service would call them.
func askAll(r *Region, k *keyInfo) luascripts.LeaseReply {
	burst := int64(k.res.Limit.Burst)
	return r.model.Acquire(r.redisNowUS(), k.rkeys, r.common(k), luascripts.Report{Instance: "probe", Seq: 1, Lease: 1, Want: burst, Min: 1})
}

// TestComingBackFromAFloorStartsAtTheFloor: a key a region never used while
// it ran on its floor (here: never at all, so missing from its Redis) is,
// once the region's share comes back, credited its floor until the rise and
// its share only since, both when a partition longer than region_lease heals
// and when a drain is lifted. The global tier gave that share to the other
// region meanwhile, which may have spent it just before; a key born full
// there (as before the rise was passed) handed out the whole static burst
// at once.
func TestComingBackFromAFloorStartsAtTheFloor(t *testing.T) {
	for _, tc := range []struct {
		name     string
		scenario string
		region   int
	}{
		{"a partition longer than region_lease heals", leaseScenario(
			"  - {tenant: y, class: read, rate: {b: 10/s}}\nfaults: [{at: 30s, kind: partition, region: a, for: 40s}]"), 0},
		{"a drain is lifted", base + "  - {tenant: y, class: read, rate: {a: 10/s}}\n" +
			"events: [{at: 30s, kind: drain, region: b}, {at: 60s, kind: restore, region: b}]\n", 1},
		// Redis loses its data while the region is on its floor: the
		// stored lease end went with it, the leader's own did not.
		{"a partition heals after Redis lost its data on the floor", leaseScenario(
			"  - {tenant: y, class: read, rate: {b: 10/s}}\nfaults: [{at: 30s, kind: partition, region: a, for: 40s}, {at: 50s, kind: redis-restart, region: a, for: 2s}]"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := buildFrom(t, tc.scenario)
			h.start()
			h.w.scheduleEvents()
			r := h.w.regions[tc.region]
			k := keyNamed(t, h.w, "y")
			static := k.common[r.idx].StaticRate
			floor := regionsync.FloorOf(regionsync.Share{Rate: static, Burst: k.common[r.idx].StaticBurst}, k.res)
			h.until(29 * time.Second)
			if r.riseUS != 0 {
				t.Fatalf("%s rose off a floor at %d before it ever ran on one", r.name, r.riseUS)
			}
			rise := comeBack(t, h, r, k, static, 90*time.Second)
			lr := askAll(r, k)
			since := float64(r.redisNowUS()-rise) / 1e6
			if bound := floor.Burst + static*since; float64(lr.Granted) > bound || lr.Granted >= int64(k.res.Limit.Burst)/2 {
				t.Fatalf("%.1fs after the rise %s granted %d of a key it never used, want at most its floor's burst %v + %v/s since = %.1f",
					since, r.name, lr.Granted, floor.Burst, static, bound)
			}
			h.until(2 * time.Minute)
			if res := h.orc.Finish(2 * time.Minute); !res.Pass() {
				t.Fatalf("invariants broken around the rise: %s", res)
			}
		})
	}
}
