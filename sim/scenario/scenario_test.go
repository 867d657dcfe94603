package scenario

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

const minimal = `
name: tiny
duration: 2m
sluice:
  regions: {a: {weight: 1}, b: {weight: 3}}
  classes: {read: {}}
  tiers: {free: {read: {rate: 10/s, burst: 20}}}
  default_tier: free
topology:
  regions: [{name: a, instances: 1}, {name: b, instances: 2, clock_offset: -40ms}]
  global: {primary: a, standby: b}
workload:
  - {tenant: acme, class: read, rate: {a: 5/s, b: 600/m}}
`

func TestParseAppliesDefaults(t *testing.T) {
	s, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if s.Seed != 1 || time.Duration(s.Warmup) != 20*time.Second || s.Workload[0].Cost != 1 || s.Workload[0].Process != "poisson" {
		t.Fatalf("defaults not applied: seed %d warmup %v cost %d process %q", s.Seed, time.Duration(s.Warmup), s.Workload[0].Cost, s.Workload[0].Process)
	}
	if s.Config == nil || s.Config.Regions["b"].Weight != 3 {
		t.Fatal("sluice config not parsed")
	}
	if float64(s.Workload[0].Rate["b"]) != 10 {
		t.Fatalf("600/m read as %v/s", float64(s.Workload[0].Rate["b"]))
	}
	if time.Duration(s.Topology.Regions[1].ClockOffset) != -40*time.Millisecond {
		t.Fatal("negative clock offset lost")
	}
}

func TestValidationNamesEveryBadField(t *testing.T) {
	bad := strings.NewReplacer(
		"duration: 2m", "duration: 2m\nwarmup: 5m",
		"{name: a, instances: 1}", "{name: a, instances: 0}",
		"standby: b", "standby: nowhere",
		"  - {tenant: acme, class: read, rate: {a: 5/s, b: 600/m}}", "  - tenant: acme\n    class: read\n    rate: {a: 5/s, c: 1/s}\n    cost: -3\n    process: bursty",
	).Replace(minimal) + `faults:
  - {at: 1m, kind: partition, region: a}
  - {at: 1m, kind: meteor}
`
	_, err := Parse([]byte(bad))
	if err == nil {
		t.Fatal("bad scenario accepted")
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("error does not wrap ErrInvalid: %v", err)
	}
	for _, want := range []string{"warmup", "topology.regions[0].instances", "topology.global.standby",
		"workload[0].rate.c", "workload[0].cost", "workload[0].process", "faults[0].for", "faults[1].kind"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
}

func TestUnknownFieldsAndBadSluiceConfigRefused(t *testing.T) {
	if _, err := Parse([]byte(minimal + "colour: blue\n")); err == nil || !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown field accepted: %v", err)
	}
	bad := strings.Replace(minimal, "rate: 10/s, burst: 20", "rate: -1/s, burst: 20", 1)
	if _, err := Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), "sluice") {
		t.Fatalf("invalid sluice config accepted: %v", err)
	}
	missing := strings.Replace(minimal, "{name: a, instances: 1}, ", "", 1)
	if _, err := Parse([]byte(missing)); err == nil || !strings.Contains(err.Error(), `region "a" has no topology entry`) {
		t.Fatalf("config region without topology accepted: %v", err)
	}
}

func TestGroupTenantsAreListedWithTheirTier(t *testing.T) {
	src := strings.Replace(minimal, "  - {tenant: acme", `  - group: {prefix: t, count: 12, tier: free, size: {dist: pareto, min: 1/s}}
    class: read
  - {tenant: acme`, 1)
	s, err := Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if GroupTenant(s.Workload[0].Group, 3) != "t03" {
		t.Fatalf("tenant id %q", GroupTenant(s.Workload[0].Group, 3))
	}
	if s.Config.Tenants["t11"].Tier != "free" {
		t.Fatal("generated tenant not listed in the config")
	}
}

func TestWithDurationDropsLateFaults(t *testing.T) {
	s, err := Parse([]byte(minimal + `faults:
  - {at: 30s, kind: etcd-down, for: 10s}
  - {at: 90s, kind: global-leader-loss}
`))
	if err != nil {
		t.Fatal(err)
	}
	short, err := s.WithDuration(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(short.Faults) != 1 || time.Duration(short.Duration) != time.Minute || len(s.Faults) != 2 {
		t.Fatalf("faults %v (original %v)", short.Faults, s.Faults)
	}
	if _, err := s.WithDuration(0); err == nil {
		t.Fatal("zero duration accepted")
	}
}

// TestWithDurationKeepsAWrittenWarmup: a shorter run measures what the
// scenario measures (its warmup is not cut into the start-up), and one no
// longer than the warmup, with nothing to measure, is refused; a warmup
// left out takes its default (at most half the run) for the new duration.
func TestWithDurationKeepsAWrittenWarmup(t *testing.T) {
	s, err := Parse([]byte(strings.Replace(minimal, "duration: 2m\n", "duration: 2m\nwarmup: 30s\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	short, err := s.WithDuration(40 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(short.Warmup) != 30*time.Second {
		t.Errorf("a 40s run of a scenario with warmup 30s has warmup %v", time.Duration(short.Warmup))
	}
	for _, d := range []time.Duration{10 * time.Second, 30 * time.Second} {
		if _, err := s.WithDuration(d); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "warmup, 30s") {
			t.Errorf("a %v run of a scenario with warmup 30s: %v, want a refusal naming the warmup", d, err)
		}
	}
	s, err = Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if short, err := s.WithDuration(10 * time.Second); err != nil || time.Duration(short.Warmup) != 5*time.Second {
		t.Errorf("a 10s run with the default warmup: warmup %v, %v; want 5s", short.Warmup, err)
	}
}

func TestChaosScheduleIsDeterministicPerSeed(t *testing.T) {
	s, err := Parse([]byte(strings.Replace(minimal, "duration: 2m", "duration: 1h", 1) + "chaos: {mean_gap: 2m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := s.Schedule(1), s.Schedule(1), s.Schedule(2)
	if len(a) < 10 || !slices.Equal(a, b) {
		t.Fatalf("same seed, different schedules (%d faults)", len(a))
	}
	if slices.Equal(a, c) {
		t.Fatal("different seeds, same schedule")
	}
	for i, f := range a {
		if i > 0 && f.At < a[i-1].At {
			t.Fatal("schedule not in time order")
		}
		var p problems
		validateFault(&p, "f", &f, []string{"a", "b"}, nil, time.Hour, func(string) bool { return false })
		if len(p) > 0 {
			t.Fatalf("drawn fault %+v is invalid: %v", f, p)
		}
	}
}

// TestChaosGapBounded: a chaos block whose gap would draw more faults
// than the schedule may hold, or start them closer than the schedule's
// millisecond, is refused naming mean_gap; at the bound it is accepted
// and draws about that many faults.
func TestChaosGapBounded(t *testing.T) {
	doc := func(gap string) []byte {
		// chaos from 20s (the warmup) to 3h - 1m - 1m.
		// Instance crashes only: they hold no target for a time, so no
		// draw is skipped as an overlap and the count is the draws'.
		return []byte(strings.Replace(minimal, "duration: 2m", "duration: 3h", 1) + "chaos: {mean_gap: " + gap + ", kinds: [instance-crash]}\n")
	}
	for _, gap := range []string{"90ns", "999us", "100ms"} {
		_, err := Parse(doc(gap))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "chaos.mean_gap") {
			t.Errorf("mean_gap %s: got %v, want a refusal naming chaos.mean_gap", gap, err)
		}
	}
	// (3h - 2m - 20s) / 106.6ms is just under 100,000 faults.
	s, err := Parse(doc("106600us"))
	if err != nil {
		t.Fatalf("a gap at the bound: %v", err)
	}
	if n := len(s.Schedule(1)); n < MaxChaosFaults*9/10 || n > MaxChaosFaults*11/10 {
		t.Fatalf("a gap at the bound drew %d faults, want about %d", n, MaxChaosFaults)
	}
}

// TestExplicitZeros: warmup: 0s measures from the start (left out it is
// 20s, at most half the run), and a shortened run keeps it 0; a diurnal
// peak at 0s is the first instant of the period; seed: 0 is refused naming
// seed (it ran seed 1); duration: 0s is refused without advice to leave
// the required field out.
func TestExplicitZeros(t *testing.T) {
	s, err := Parse([]byte(strings.Replace(minimal, "duration: 2m\n", "duration: 2m\nwarmup: 0s\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if s.Warmup != 0 || !s.NoWarmup {
		t.Fatalf("warmup: 0s read as %v", s.Warmup)
	}
	if c, err := s.WithDuration(time.Minute); err != nil || c.Warmup != 0 {
		t.Fatalf("shortened: warmup %v, %v", c.Warmup, err)
	}
	if s, err := Parse([]byte(minimal)); err != nil || time.Duration(s.Warmup) != DefaultWarmup || s.NoWarmup {
		t.Fatalf("warmup left out: %v, %v", s.Warmup, err)
	}
	diurnal := strings.Replace(minimal, "rate: {a: 5/s, b: 600/m}}", "rate: {a: 5/s, b: 600/m}, shape: [{kind: diurnal, period: 1m, peaks: {a: 0s, b: 30s}}]}", 1)
	if s, err := Parse([]byte(diurnal)); err != nil || s.Workload[0].Shape[0].Peaks["a"] != 0 || time.Duration(s.Workload[0].Shape[0].Peaks["b"]) != 30*time.Second {
		t.Fatalf("peaks at 0s and 30s: %v", err)
	}
	for _, c := range []struct{ doc, want, not string }{
		{strings.Replace(minimal, "duration: 2m\n", "duration: 2m\nseed: 0\n", 1), "seed: must be at least 1", ""},
		{strings.Replace(minimal, "duration: 2m\n", "duration: 0s\n", 1), "duration: is required and must be positive", "leave the field out"},
	} {
		_, err := Parse([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) || (c.not != "" && strings.Contains(err.Error(), c.not)) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}

// TestFocusNeedsTraffic: a focus key no workload offers is refused naming
// focus[i] (the busiest keys were charted instead, without a word); a
// workload's key and a group's generated tenant are accepted.
func TestFocusNeedsTraffic(t *testing.T) {
	group := strings.Replace(minimal, "workload:\n", "workload:\n  - {group: {prefix: g, count: 12, size: {dist: pareto, alpha: 1.5, min: 1/s, max: 3/s}}, class: read}\n", 1)
	if _, err := Parse([]byte(group + "focus: [acme/read, g07/read]\n")); err != nil {
		t.Fatal(err)
	}
	_, err := Parse([]byte(group + "focus: [acme/read, nobody/read]\n"))
	if err == nil || !strings.Contains(err.Error(), "focus[1]: nobody/read has no traffic") {
		t.Fatalf("got %v", err)
	}
}

// TestWrittenZeroWhereZeroMeansNothingIsRefused: a field written 0 where
// 0 is no value the field can take is refused naming it, not run as the
// default (count: 0 crashed one instance, cost: 0 ran as cost 1,
// per_instance: 0/s as no per-instance rate); left out, each still takes
// its default.
func TestWrittenZeroWhereZeroMeansNothingIsRefused(t *testing.T) {
	group := "  - {group: {prefix: g, count: 3, size: {dist: pareto, min: 1/s, max: 3/s}}, class: read}\n"
	for _, c := range []struct{ doc, want string }{
		{strings.Replace(minimal, "duration: 2m\n", "duration: 2m\nseed: 0\n", 1), "seed: must be at least 1"},
		{minimal + "faults: [{at: 10s, kind: instance-crash, region: b, count: 0}]\n", "faults[0].count: must be in 1..10000, got 0"},
		{minimal + "faults: [{at: 10s, kind: partition, region: b, for: 5s, count: 0}]\n", "faults[0].count: does not apply to kind partition"},
		{strings.Replace(minimal, "class: read,", "class: read, cost: 0,", 1), "workload[0].cost: must be in 1.."},
		{strings.Replace(minimal, "class: read,", "class: read, per_instance: 0/s,", 1), "workload[0].per_instance: must be a positive rate, got 0"},
		{minimal + strings.Replace(group, "pareto,", "pareto, alpha: 0,", 1), "workload[1].group.size.alpha: must be in (0, 100], got 0"},
		{minimal + strings.Replace(group, "pareto,", "lognormal, sigma: 0,", 1), "workload[1].group.size.sigma: must be in (0, 10], got 0"},
		{minimal + strings.Replace(group, "max: 3/s", "max: 0/s", 1), "workload[1].group.size.max: must be at least min"},
		{minimal + strings.Replace(group, "count: 3,", "count: 3, regions: 0,", 1), "workload[1].group.regions: must be at least 1"},
		{minimal + "client: {breaker_failures: 0}\n", "client.breaker_failures: must be at least 1"},
		{minimal + "expect: {convergence_tolerance: 0}\n", "expect.convergence_tolerance: must be in (0, 1), got 0"},
	} {
		t.Run(c.want, func(t *testing.T) {
			_, err := Parse([]byte(c.doc))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q", err, c.want)
			}
		})
	}
	s, err := Parse([]byte(minimal + group + "faults: [{at: 10s, kind: instance-crash, region: b}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w, g := s.Workload[0], s.Workload[1].Group; w.Cost != 1 || w.PerInstance != 0 || s.Faults[0].Count != 1 || s.Seed != 1 ||
		g.Size.Alpha != DefaultAlpha || g.Size.Sigma != DefaultSigma || g.Regions != 0 || s.Expect.ConvergenceTolerance != DefaultConvergenceTol {
		t.Fatalf("defaults of fields left out not applied: %+v %+v %+v", w, g, s.Faults[0])
	}
}

// TestLatencyPairInBothOrdersIsRefused: a pair may be written in either
// order, so one written in both (10ms one way, 90ms the other) is refused
// naming both; each order alone is accepted.
func TestLatencyPairInBothOrdersIsRefused(t *testing.T) {
	doc := func(pairs string) []byte {
		return []byte(strings.Replace(minimal, "  global:", "  latency: {pairs: {"+pairs+"}}\n  global:", 1))
	}
	for _, pairs := range []string{"a/b: 10ms, b/a: 90ms", "b/a: 10ms, a/b: 10ms"} {
		_, err := Parse(doc(pairs))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "topology.latency.pairs.b/a: is the pair topology.latency.pairs.a/b") {
			t.Errorf("%s: got %v, want a refusal naming both", pairs, err)
		}
	}
	for _, pairs := range []string{"a/b: 10ms", "b/a: 10ms"} {
		if _, err := Parse(doc(pairs)); err != nil {
			t.Errorf("%s: %v", pairs, err)
		}
	}
}

// TestWarmupAsLongAsTheRunIsRefused: a warmup of the whole run measures
// nothing (every measure n/a, every target passed); it is refused as a
// -duration no longer than the warmup is.
func TestWarmupAsLongAsTheRunIsRefused(t *testing.T) {
	for _, w := range []string{"2m", "3m"} {
		_, err := Parse([]byte(strings.Replace(minimal, "duration: 2m\n", "duration: 2m\nwarmup: "+w+"\n", 1)))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "warmup: "+w+"0s is not shorter than the duration 2m0s") ||
			!strings.Contains(err.Error(), "nothing would be measured") {
			t.Errorf("warmup %s: got %v", w, err)
		}
	}
	if _, err := Parse([]byte(strings.Replace(minimal, "duration: 2m\n", "duration: 2m\nwarmup: 119s\n", 1))); err != nil {
		t.Error(err)
	}
}
