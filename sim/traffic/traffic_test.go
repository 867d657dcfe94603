package traffic

import (
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sim/engine"
	"github.com/sluicehq/sluice/sim/scenario"
)

func parse(t *testing.T, workload string) *scenario.Scenario {
	t.Helper()
	s, err := scenario.Parse([]byte(`
name: t
duration: 10m
sluice:
  regions: {a: {weight: 1}, b: {weight: 1}, c: {weight: 2}}
  classes: {read: {}}
  tiers: {free: {read: {rate: 10/s, burst: 20}}}
  default_tier: free
topology:
  regions: [{name: a, instances: 1}, {name: b, instances: 1}, {name: c, instances: 1}]
  global: {primary: a}
workload:
` + workload))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func drain(st *Stream, until time.Duration) (n int64, ends []time.Duration) {
	for t := time.Duration(0); t < until; {
		end, k := st.Next(t)
		n += k
		ends = append(ends, end)
		t = end
	}
	return n, ends
}

func TestPoissonCountsHaveTheRightMeanAndVariance(t *testing.T) {
	for _, mean := range []float64{0.3, 4, 25, 400} {
		rng := engine.NewStream(1, "p")
		const n = 20000
		var sum, sq float64
		for i := 0; i < n; i++ {
			x := float64(poisson(rng, mean))
			sum += x
			sq += x * x
		}
		m := sum / n
		v := sq/n - m*m
		if math.Abs(m-mean) > 4*math.Sqrt(mean/n)+1e-9 || math.Abs(v-mean) > 0.1*mean+0.05 {
			t.Errorf("poisson(%v): mean %v variance %v", mean, m, v)
		}
	}
}

func TestConstantProcessIsExactAndStepsAreExactInTime(t *testing.T) {
	s := parse(t, `  - tenant: x
    class: read
    process: constant
    rate: {a: 30/s}
    shape: [{kind: step, at: 61s, factor: 2}]
`)
	p, err := Build(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	st := p.Streams[0]
	n, ends := drain(st, 2*time.Minute)
	if want := int64(30*61 + 60*59); n != want {
		t.Fatalf("constant arrivals %d, want %d", n, want)
	}
	found := false
	for i, e := range ends {
		if e == 61*time.Second {
			found = true
		}
		if i > 0 && ends[i-1] < 61*time.Second && e > 61*time.Second {
			t.Fatalf("batch %v..%v straddles the step", ends[i-1], e)
		}
	}
	if !found {
		t.Fatal("no batch ends at the step")
	}
	if len(p.Shifts) != 1 || p.Shifts[0].At != 61*time.Second {
		t.Fatalf("shifts %v", p.Shifts)
	}
}

func TestBatchesAreBoundedForFastAndSlowStreams(t *testing.T) {
	s := parse(t, `  - {tenant: fast, class: read, rate: {a: 5000/s}}
  - {tenant: slow, class: read, rate: {a: 0.01/s}}
`)
	p, _ := Build(s, 1)
	for _, st := range p.Streams {
		_, ends := drain(st, time.Minute)
		prev := time.Duration(0)
		for _, e := range ends {
			if d := e - prev; d < MinBatch || d > MaxBatch {
				t.Fatalf("%s batch of %v", st.Key, d)
			}
			prev = e
		}
	}
}

func TestDiurnalFollowsTheSunInSteps(t *testing.T) {
	s := parse(t, `  - tenant: x
    class: read
    rate: {a: 100/s, b: 100/s, c: 100/s}
    shape: [{kind: diurnal, period: 6m, low: 0.2, steps: 6}]
`)
	p, _ := Build(s, 1)
	peakAt := func(st *Stream) time.Duration {
		best, at := -1.0, time.Duration(0)
		for t := time.Duration(0); t < 6*time.Minute; t += 10 * time.Second {
			if r := st.Rate(t); r > best+1e-9 {
				best, at = r, t
			}
		}
		return at
	}
	if a, b, c := peakAt(p.Streams[0]), peakAt(p.Streams[1]), peakAt(p.Streams[2]); !(a < b && b < c) {
		t.Fatalf("regions peak at %v %v %v, not one after another", a, b, c)
	}
	st := p.Streams[0]
	if st.Rate(61*time.Second) != st.Rate(119*time.Second) || st.Rate(59*time.Second) == st.Rate(61*time.Second) {
		t.Fatal("diurnal rate is not constant within a step and different across steps")
	}
	if lo, hi := st.Rate(3*time.Minute+30*time.Second), st.Rate(30*time.Second); lo < 20-1e-9 || hi > 100+1e-9 || hi <= lo {
		t.Fatalf("diurnal range %v..%v", lo, hi)
	}
	if len(p.Shifts) != 9 {
		t.Fatalf("%d shifts, want one per step boundary within 10m", len(p.Shifts))
	}
}

func TestFlashCrowdEnvelope(t *testing.T) {
	s := parse(t, `  - tenant: x
    class: read
    rate: {a: 100/s, b: 100/s}
    shape: [{kind: flash, regions: [b], at: 1m, rise: 10s, hold: 30s, decay: 10s, factor: 5}]
`)
	p, _ := Build(s, 1)
	a, b := p.Streams[0], p.Streams[1]
	for _, c := range []struct {
		at   time.Duration
		a, b float64
	}{{59 * time.Second, 100, 100}, {65 * time.Second, 100, 300}, {90 * time.Second, 100, 500}, {105 * time.Second, 100, 300}, {2 * time.Minute, 100, 100}} {
		if ra, rb := a.Rate(c.at), b.Rate(c.at); math.Abs(ra-c.a) > 1e-9 || math.Abs(rb-c.b) > 1e-9 {
			t.Errorf("at %v: rates %v %v, want %v %v", c.at, ra, rb, c.a, c.b)
		}
	}
}

func TestGroupSizesAreHeavyTailedAndReproducible(t *testing.T) {
	w := `  - group: {prefix: g, count: 2000, size: {dist: pareto, alpha: 1.2, min: 1/s, max: 5000/s}, home_share: 0.8, regions: 2}
    class: read
`
	p1, _ := Build(parse(t, w), 7)
	p2, _ := Build(parse(t, w), 7)
	p3, _ := Build(parse(t, w), 8)
	if len(p1.Streams) != len(p2.Streams) || len(p1.Keys) != 2000 {
		t.Fatalf("%d streams vs %d; %d keys", len(p1.Streams), len(p2.Streams), len(p1.Keys))
	}
	totals := map[string]float64{}
	regions := map[string]int{}
	for i, st := range p1.Streams {
		if st.Base != p2.Streams[i].Base || st.Key != p2.Streams[i].Key {
			t.Fatal("same seed, different plan")
		}
		totals[st.Key.Tenant] += st.Base
		regions[st.Key.Tenant]++
	}
	same := true
	for i := range p1.Streams {
		if i >= len(p3.Streams) || p1.Streams[i].Base != p3.Streams[i].Base {
			same = false
		}
	}
	if same {
		t.Fatal("different seeds, same sizes")
	}
	var sizes []float64
	for tenant, v := range totals {
		sizes = append(sizes, v)
		if regions[tenant] != 2 {
			t.Fatalf("tenant %s in %d regions, want 2", tenant, regions[tenant])
		}
	}
	sort.Float64s(sizes)
	median, top := sizes[len(sizes)/2], sizes[len(sizes)-1]
	if median > 3 || top < 100*median || top > 5000+1e-6 || sizes[0] < 1-1e-9 {
		t.Fatalf("sizes not heavy-tailed within [1, 5000]: min %v median %v max %v", sizes[0], median, top)
	}
	if !strings.HasPrefix(p1.Keys[0].Tenant, "g") {
		t.Fatalf("tenant id %q", p1.Keys[0].Tenant)
	}
}

func TestFailoverMovesARegionsUsersByWeight(t *testing.T) {
	s := parse(t, `  - {tenant: acme, class: read, rate: {a: 100/s, b: 10/s}, shape: [{kind: step, regions: [a], at: 5m, factor: 2}]}
  - {tenant: beta, class: read, rate: {b: 7/s}}
failovers:
  - {at: 1m, from: a, to: [b, c], for: 8m}
`)
	p, err := Build(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	rate := func(key string, region int, at time.Duration) float64 {
		var sum float64
		for _, st := range p.Streams {
			if st.Key.Tenant == key && st.Region == region {
				sum += st.Rate(at)
			}
		}
		return sum
	}
	for _, c := range []struct {
		at      time.Duration
		a, b, c float64
	}{
		{30 * time.Second, 100, 10, 0},
		// a's users split 1:2 over b and c (their weights).
		{2 * time.Minute, 0, 10 + 100.0/3, 200.0 / 3},
		// The moved users keep a's shape: it doubles at 5m wherever they are.
		{6 * time.Minute, 0, 10 + 200.0/3, 400.0 / 3},
		// Back home at 9m.
		{9*time.Minute + time.Second, 200, 10, 0},
	} {
		got := []float64{rate("acme", 0, c.at), rate("acme", 1, c.at), rate("acme", 2, c.at)}
		for i, want := range []float64{c.a, c.b, c.c} {
			if math.Abs(got[i]-want) > 1e-9 {
				t.Errorf("at %v: acme rates %v, want [%v %v %v]", c.at, got, c.a, c.b, c.c)
				break
			}
		}
	}
	if got := rate("beta", 1, 2*time.Minute); got != 7 {
		t.Errorf("beta, never in a, changed: %v", got)
	}
	var shifts []time.Duration
	for _, sh := range p.Shifts {
		if sh.Key.Tenant == "acme" {
			shifts = append(shifts, sh.At)
		}
	}
	want := []time.Duration{time.Minute, 5 * time.Minute, 9 * time.Minute}
	if len(shifts) != len(want) {
		t.Fatalf("acme shifts %v, want %v", shifts, want)
	}
	for i := range want {
		if shifts[i] != want[i] {
			t.Fatalf("acme shifts %v, want %v", shifts, want)
		}
	}
	// Arrivals follow: nothing arrives in a while its users are away, and
	// b and c get theirs.
	for _, st := range p.Streams {
		if st.Key.Tenant != "acme" {
			continue
		}
		var n int64
		for t0 := time.Minute; t0 < 2*time.Minute; {
			end, k := st.Next(t0)
			n += k
			t0 = end
		}
		want := st.Rate(90*time.Second) * 60
		if math.Abs(float64(n)-want) > 5*math.Sqrt(want+1) {
			t.Errorf("stream %s in %d: %d arrivals in [1m, 2m), want about %.0f", st.Key, st.Region, n, want)
		}
	}
}
