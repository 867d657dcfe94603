package world

import (
	"testing"
	"time"
)

// TestRegionLeaseRunsOutInAPartition: the simulated region pumps the same
// regionsync code as pkg/regional. A region partitioned from the global
// tier for longer than region_lease runs on its static share until the
// lease the last answer conferred ends (less the margin), then on its
// floor (partition_share 0.5 here); its lease is stored from the answers'
// send times and never extended without one; after the partition heals an
// answer confers it again.
func TestRegionLeaseRunsOutInAPartition(t *testing.T) {
	h := buildFrom(t, leaseScenario("faults: [{at: 30s, kind: partition, region: a, for: 40s}]"))
	h.start()
	a := h.w.regions[0]
	k := h.w.keys[0]
	static := k.common[0].StaticRate
	h.until(29 * time.Second)
	if a.staticUS == 0 || a.staticUS <= a.redisNowUS() {
		t.Fatalf("before the partition a holds no running lease (end %d, now %d)", a.staticUS, a.redisNowUS())
	}
	if got := a.common(k).StaticRate; got != static {
		t.Fatalf("on lease a runs on %v, want its static share %v", got, static)
	}
	h.until(31 * time.Second)
	until := a.staticUS
	margin := h.w.epoch
	lease := time.Duration(h.w.cfg.RegionLease)
	// The lease ends at most region_lease after the partition began.
	if end := trueTimeOf(until, a.offset); end > 30*time.Second+lease {
		t.Fatalf("lease ends at %v, after the partition's start + region_lease", end)
	}
	for step := 31 * time.Second; step < 70*time.Second; step += 100 * time.Millisecond {
		h.until(step)
		if a.staticUS != until {
			t.Fatalf("at %v the lease moved from %d to %d without an answer", step, until, a.staticUS)
		}
		got := a.common(k).StaticRate
		onStatic := a.redisNowUS()+margin.Microseconds() < until
		switch {
		case onStatic && got != static:
			t.Fatalf("at %v a runs on %v before its lease's end, want %v", step, got, static)
		case !onStatic && got != static/2:
			t.Fatalf("at %v a runs on %v after its lease's end, want its floor %v", step, got, static/2)
		}
	}
	h.until(75 * time.Second)
	if a.staticUS <= until || a.common(k).StaticRate != static {
		t.Fatalf("after the partition healed a holds lease end %d (was %d), static rate %v", a.staticUS, until, a.common(k).StaticRate)
	}
	h.until(2 * time.Minute)
	if r := h.orc.Finish(2 * time.Minute); !r.Pass() {
		t.Fatalf("a partition longer than region_lease broke an invariant: %+v %+v", r.Conformance, r.Rates)
	}
}

// TestNoGlobalLeaderKeepsTheRegionOnItsStaticShare: the only global
// replica dies for longer than region_lease; with no leader in etcd the
// region leaders extend their running leases (regionsync's etcd rule) and
// keep their static shares; the invariants hold throughout.
func TestNoGlobalLeaderKeepsTheRegionOnItsStaticShare(t *testing.T) {
	h := buildFrom(t, leaseScenario("faults: [{at: 30s, kind: global-leader-loss, restart_after: 50s}]"))
	h.start()
	k := h.w.keys[0]
	h.until(30 * time.Second)
	first := h.w.regions[0].staticUS
	for step := 30 * time.Second; step < 80*time.Second; step += 500 * time.Millisecond {
		h.until(step)
		for i, r := range h.w.regions {
			if got := r.common(k).StaticRate; got != k.common[i].StaticRate {
				t.Fatalf("at %v region %s runs on %v with no global leader, want its static share %v", step, r.name, got, k.common[i].StaticRate)
			}
		}
	}
	if a := h.w.regions[0]; a.staticUS <= first+(30*time.Second).Microseconds() {
		t.Fatalf("a's lease end moved from %d to %d only: not extended while no global leader was elected", first, a.staticUS)
	}
	h.until(2 * time.Minute)
	if r := h.orc.Finish(2 * time.Minute); !r.Pass() {
		t.Fatalf("a global outage longer than region_lease broke an invariant: %+v %+v", r.Conformance, r.Rates)
	}
}

// leaseScenario is two regions of equal weight on one 100/s key, each
// offering 40/s, with region_lease 20s and partition_share 0.5, b's clock
// 400ms ahead, and faults (one YAML line).
func leaseScenario(faults string) string {
	return `
name: w
duration: 2m
warmup: 10s
sluice:
  region_lease: 20s
  regions: {a: {weight: 1}, b: {weight: 1}}
  classes: {read: {partition_share: 0.5}}
  tiers: {t: {read: {rate: 100/s, burst: 200}}}
  default_tier: t
topology:
  regions: [{name: a, instances: 2}, {name: b, instances: 2, clock_offset: 400ms}]
  global: {primary: b}
workload:
  - {tenant: x, class: read, rate: {a: 40/s, b: 40/s}}
` + faults + "\n"
}
