package world

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sim/engine"
	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/scenario"
	"github.com/sluicehq/sluice/sim/traffic"
)

const base = `
name: w
duration: 2m
warmup: 10s
sluice:
  regions: {a: {weight: 1}, b: {weight: 1}}
  classes: {read: {}, write: {reclaim: none}}
  tiers: {t: {read: {rate: 100/s, burst: 200}, write: {rate: 100/s, burst: 200}}}
  default_tier: t
topology:
  regions: [{name: a, instances: 2}, {name: b, instances: 2, clock_offset: 400ms}]
  global: {primary: a, standby: b}
  instance_clock_skew: 30ms
workload:
  - {tenant: x, class: read, rate: {a: 150/s, b: 20/s}}
  - {tenant: x, class: write, rate: {a: 150/s, b: 20/s}}
`

type harness struct {
	w   *World
	orc *oracle.Oracle
}

func build(t *testing.T, extra string) *harness {
	t.Helper()
	return buildFrom(t, base+extra)
}

// buildFrom builds a world from a whole scenario.
func buildFrom(t *testing.T, text string) *harness {
	t.Helper()
	return buildSeeded(t, text, 1)
}

// buildSeeded builds a world from a whole scenario and a seed.
func buildSeeded(t *testing.T, text string, seed uint64) *harness {
	t.Helper()
	sc, err := scenario.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := traffic.Build(sc, seed)
	if err != nil {
		t.Fatal(err)
	}
	setup, err := OracleSetup(sc, plan)
	if err != nil {
		t.Fatal(err)
	}
	orc, err := oracle.New(setup)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(sc, seed, orc, plan)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{w: w, orc: orc}
}

// start begins the run without running it (Run does both).
func (h *harness) start() {
	w := h.w
	for _, r := range w.regions {
		r.start()
	}
	w.global.start()
	for _, s := range w.streams {
		w.startStream(s)
	}
	for i := range w.faults {
		f := w.faults[i]
		w.eng.At(engine.At(time.Duration(f.At)), func() { w.inject(f) })
	}
}

func (h *harness) until(d time.Duration) { h.w.eng.RunUntil(engine.At(d)) }

func TestRedisTimeConvertsBackToTrueTime(t *testing.T) {
	h := build(t, "")
	h.until(3 * time.Second)
	for _, r := range h.w.regions {
		us := r.redisNowUS()
		if got := trueTimeOf(us, r.offset); got != 3*time.Second {
			t.Fatalf("region %s: Redis time %d maps back to %v", r.name, us, got)
		}
	}
	if b := h.w.regions[1]; b.redisNowUS()-h.w.regions[0].redisNowUS() != 400000 {
		t.Fatal("region clock offset not applied")
	}
}

func TestGracefulStopLeavesNothingStranded(t *testing.T) {
	h := build(t, "faults: [{at: 30s, kind: instance-stop, region: a, count: 2}]\n")
	h.start()
	h.until(29 * time.Second)
	a := h.w.regions[0]
	victims := append([]*Instance(nil), a.insts...)
	h.until(31 * time.Second)
	for _, in := range victims {
		if in.alive {
			t.Fatalf("%s still running after a graceful stop", in.id)
		}
		for _, k := range h.w.keys {
			if _, ok := a.model.PeekLease(k.rkeys, in.id); ok {
				t.Fatalf("%s still holds a lease on %s after releasing", in.id, k.key)
			}
		}
	}
	h.until(2 * time.Minute)
	if r := h.orc.Finish(2 * time.Minute); !r.Pass() || r.Conformance.CrashError != 0 {
		t.Fatalf("graceful stop: %+v", r.Conformance)
	}
}

// TestGracefulStopUnderLoadDecidesTheRequestsInFlight: a graceful stop
// takes no new request, decides those in flight (strict Checks, Acquires,
// waits) as the running instance would, and only then closes the lease
// client; no request is answered an error, and every bucket's counters
// match what the instances decided. Closing the client at once answered
// the requests still in flight "lease: closed": strict Checks the region
// had admitted were counted as denied (invalid decisions, and books off
// from the bucket's).
func TestGracefulStopUnderLoadDecidesTheRequestsInFlight(t *testing.T) {
	const sc = `
name: stop-under-load
duration: 1m
warmup: 10s
sluice:
  regions: {a: {weight: 1}, b: {weight: 1}}
  classes: {read: {mode: lease, on_failure: local}, exp: {mode: strict, on_failure: closed}}
  tiers: {pro: {read: {rate: 2000/s, burst: 4000}, exp: {rate: 5000/s, burst: 10000}}}
  default_tier: pro
topology:
  regions: [{name: a, instances: 2}, {name: b, instances: 2}]
  global: {primary: a, standby: b}
  latency: {local: 5ms}
workload:
  - {tenant: t1, class: read, rate: {a: 1500/s, b: 1500/s}}
  - {tenant: t2, class: exp, rate: {a: 300/s, b: 300/s}}
faults:
  - {at: 20s, kind: instance-stop, region: b, count: 1, restart_after: 10s}
`
	for seed := uint64(1); seed <= 9; seed++ {
		h := buildSeeded(t, sc, seed)
		h.start()
		h.until(time.Minute)
		r := h.orc.Finish(time.Minute)
		if n := h.w.counters.InvalidDecisions; n != 0 || !r.Pass() {
			t.Errorf("seed %d: %d invalid decisions; books %+v", seed, n, r.Books)
		}
		for _, in := range h.w.regions[1].all {
			if in.draining || in.stopping {
				t.Errorf("seed %d: %s still stopping at the end", seed, in.id)
			}
		}
	}
}

func TestCrashErrorOnlyUnderReclaimReported(t *testing.T) {
	// Replacements start 2 s later: the keys see traffic again in a, so
	// the first script call after a lease's expiry reaps it.
	h := build(t, "faults: [{at: 30500ms, kind: instance-crash, region: a, count: 2, restart_after: 2s}]\n")
	h.start()
	h.until(2 * time.Minute)
	r := h.orc.Finish(2 * time.Minute)
	if !r.Pass() {
		t.Fatalf("invariants: %+v %+v %+v", r.Conformance, r.Rates, r.Bursts)
	}
	// Both keys run at 150/s in a; only read reclaims (write is "none").
	if r.Conformance.CrashKeys != 1 || r.Conformance.CrashError <= 0 {
		t.Fatalf("crash error %v over %d keys, want > 0 on the read key only", r.Conformance.CrashError, r.Conformance.CrashKeys)
	}
	// Reaped by the first script call on the key after the lease expired
	// (one lease TTL after its last sync): a traffic batch later.
	if r.Reclaim.Crashes != 2 || r.Reclaim.Max > 6*time.Second || r.Reclaim.Max < 4*time.Second {
		t.Fatalf("reclaim %+v, want about one lease TTL", r.Reclaim)
	}
	if n := len(h.w.regions[0].insts); n != 2 {
		t.Fatalf("%d instances in a after the replacements started", n)
	}
	if r.Unserved == 0 {
		t.Fatal("traffic to a region without instances was not counted as unserved")
	}
}

func TestReclaimOfAKeyNobodyAsksForAgainEndsAtTheLeaseExpiry(t *testing.T) {
	// b's instances die for good, and y/read, which only b's users asked
	// for (far below its share: the leader never reads it), sees no call
	// again until Redis drops its bucket with its TTL. Its tokens were
	// stranded for nobody from the lease's expiry on: the reclaim ends
	// there, as it does for a lease the next call reaps, not when the
	// bucket's TTL runs out.
	h := buildFrom(t, base+`  - {tenant: y, class: read, rate: {b: 5/s}}
faults: [{at: 30500ms, kind: instance-crash, region: b, count: 2}]
`)
	h.start()
	h.until(2 * time.Minute)
	r := h.orc.Finish(2 * time.Minute)
	if !r.Pass() {
		t.Fatalf("invariants: %+v %+v %+v", r.Conformance, r.Rates, r.Bursts)
	}
	if r.Reclaim.Crashes != 2 || r.Reclaim.Max > 6*time.Second {
		t.Fatalf("reclaim %+v, want at most about one lease TTL", r.Reclaim)
	}
}

func TestReclaimOfALeaseLostWithItsRedisEndsAtTheLeaseExpiry(t *testing.T) {
	// a's instances die, and half a second later a's Redis goes down
	// for 40 s and comes back empty (or a dies whole and comes back with
	// its Redis lost). No call could reap the leases while it was down;
	// they went with the data. Their tokens were stranded from nothing
	// longer than a lease they expired from: the reclaim ends at their
	// expiry, as it does when the Redis comes back as it was, not when
	// the empty one comes back.
	for _, fault := range []string{
		"faults: [{at: 30500ms, kind: instance-crash, region: a, count: 2}, {at: 31s, kind: redis-restart, region: a, for: 40s}]\n",
		"faults: [{at: 30500ms, kind: region-down, region: a, restart_after: 40s, redis_lost: true}]\n",
	} {
		h := build(t, fault)
		h.start()
		h.until(2 * time.Minute)
		r := h.orc.Finish(2 * time.Minute)
		if !r.Pass() {
			t.Fatalf("%s: invariants: %+v %+v %+v", fault, r.Conformance, r.Rates, r.Bursts)
		}
		if r.Reclaim.Crashes != 2 || r.Reclaim.Max > 6*time.Second {
			t.Errorf("%s: reclaim %+v, want at most about one lease TTL", fault, r.Reclaim)
		}
	}
}

func TestEtcdOutageStopsGrantingWithoutSplitBrain(t *testing.T) {
	h := build(t, "faults: [{at: 40s, kind: etcd-down, for: 20s}]\n")
	h.start()
	h.until(39 * time.Second)
	g := h.w.global
	leader := g.leader
	if leader == nil || !leader.granting() {
		t.Fatal("no granting leader before the outage")
	}
	h.until(40*time.Second + h.w.sessionTTL/2 + time.Millisecond)
	if g.leaderForClients() != nil {
		t.Fatal("still granting half a session TTL into the etcd outage")
	}
	h.until(40*time.Second + h.w.sessionTTL + time.Millisecond)
	for _, r := range h.w.regions {
		if r.leaderUp {
			t.Fatalf("region %s still leads a session TTL into the outage", r.name)
		}
	}
	h.until(59 * time.Second)
	granting := 0
	for _, n := range g.nodes {
		if n.granting() {
			granting++
		}
	}
	if granting != 0 {
		t.Fatalf("%d replicas granting while etcd is down", granting)
	}
	h.until(60*time.Second + 2*h.w.sessionTTL)
	if g.leaderForClients() != leader {
		t.Fatal("the leader did not resume once etcd was back")
	}
	for _, r := range h.w.regions {
		if !r.leaderUp {
			t.Fatalf("region %s has no leader after etcd came back", r.name)
		}
	}
}

func TestGlobalFailoverElectsTheStandbyAfterTheLease(t *testing.T) {
	h := build(t, "faults: [{at: 30s, kind: global-leader-loss, restart_after: 20s}]\n")
	h.start()
	h.until(30*time.Second + 4*h.w.sessionTTL/5)
	g := h.w.global
	if g.leader != nil {
		t.Fatalf("%s elected before the dead leader's lease can have run out", g.leader.name)
	}
	h.until(30*time.Second + h.w.sessionTTL + time.Millisecond)
	if g.leader == nil || !strings.HasPrefix(g.leader.name, "global-b") || !g.leader.alloc.Learning(g.leader.now()) {
		t.Fatal("the standby did not take over in learning mode within one session TTL")
	}
	h.until(2 * time.Minute)
	if r := h.orc.Finish(2 * time.Minute); !r.Pass() {
		t.Fatalf("failover broke an invariant: %+v %+v", r.Conformance, r.Rates)
	}
	if !g.nodes[0].alive || g.nodes[0].leading {
		t.Fatal("the old leader did not come back as a standby")
	}
}

func TestPartitionedRegionRunsOnStaticShareAfterItsGrantExpires(t *testing.T) {
	h := build(t, "faults: [{at: 30s, kind: partition, region: a, for: 40s}]\n")
	h.start()
	h.until(29 * time.Second)
	a := h.w.regions[0]
	k := h.w.keys[0] // x/read: a wants 150/s of 100, b 20: a holds a grant above its 50
	st := a.model.State(a.redisNowUS(), k.rkeys, a.common(k))
	if st.GrantExpiryUS == 0 || st.Rate <= 50 {
		t.Fatalf("before the partition a runs at %v (grant expiry %d), want a grant above its static 50", st.Rate, st.GrantExpiryUS)
	}
	h.until(30*time.Second + h.w.validity + time.Second)
	st = a.model.State(a.redisNowUS(), k.rkeys, a.common(k))
	if st.GrantExpiryUS != 0 || st.Rate != k.common[0].StaticRate {
		t.Fatalf("one validity into the partition a runs at %v, want its static share", st.Rate)
	}
	h.until(2 * time.Minute)
	if r := h.orc.Finish(2 * time.Minute); !r.Pass() {
		t.Fatalf("partition broke an invariant: %+v %+v", r.Conformance, r.Rates)
	}
}

func TestIsolatedInstanceLeasesReapedCountAsCrashError(t *testing.T) {
	// One instance of a is cut off from its region for 15 s, three lease
	// TTLs: it stays alive, the region reaps its leases, and what it spent
	// without reporting is handed out again: ε, on the read key only
	// (write is reclaim: none). Then it reaches its region again.
	h := build(t, "faults: [{at: 30500ms, kind: instance-isolate, region: a, for: 15s}]\n")
	h.start()
	h.until(30 * time.Second)
	a := h.w.regions[0]
	before := append([]*Instance(nil), a.insts...)
	h.until(45 * time.Second)
	var victim *Instance
	for _, in := range before {
		if in.isolated {
			victim = in
		}
	}
	if victim == nil || !victim.alive {
		t.Fatal("no instance of a is isolated and alive during the fault")
	}
	for _, k := range h.w.keys {
		if l, ok := a.model.PeekLease(k.rkeys, victim.id); ok && l.ExpiryUS <= a.redisNowUS() {
			// Expired but not yet reaped is allowed only without a
			// script call since; traffic runs on both keys.
			t.Fatalf("%s: lease of the isolated %s expired and not reaped", k.key, victim.id)
		}
	}
	h.until(2 * time.Minute)
	if victim.isolated || !victim.alive {
		t.Fatalf("%s still isolated (or dead) after the fault", victim.id)
	}
	r := h.orc.Finish(2 * time.Minute)
	if !r.Pass() {
		t.Fatalf("invariants: %+v %+v %+v", r.Conformance, r.Rates, r.Bursts)
	}
	if r.Conformance.CrashKeys != 1 || r.Conformance.CrashError <= 0 {
		t.Fatalf("ε %v over %d keys, want > 0 on the read key only", r.Conformance.CrashError, r.Conformance.CrashKeys)
	}
	if r.Reclaim.Crashes != 0 {
		t.Fatalf("an isolation counted as %d crashes", r.Reclaim.Crashes)
	}
	if n := len(a.isolated); n != 0 {
		t.Fatalf("%d keys still watched after the isolation ended and the leases were reaped", n)
	}
	held := 0
	for _, k := range h.w.keys {
		if _, ok := a.model.PeekLease(k.rkeys, victim.id); ok {
			held++
		}
	}
	if held == 0 {
		t.Fatalf("%s holds no lease after its link came back", victim.id)
	}
}
