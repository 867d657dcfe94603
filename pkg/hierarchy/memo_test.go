package hierarchy

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestTargetMemoMatchesRecomputation runs random worlds whose regions read
// their demand exactly, so that a key's targets are often asked for again
// with the inputs of the last time (the memo is used), among reports in
// random order, lost answers and retries, early reports, silences, lapses
// and returns, leader changes, keys added, removed and renumbered, limits
// and regions changed, some of those keeping every rate and burst as it
// was (only the memo's generation tells them apart). Every time the memo
// is used the targets are recomputed, and they must be the remembered ones
// to the bit.
func TestTargetMemoMatchesRecomputation(t *testing.T) {
	const worlds, epochs = 16, 120
	var hits, mismatches int
	var first string
	for w := range worlds {
		g := newGoldenWorld(t, 1000+uint64(w), sha256.New())
		g.steady = true
		chk := &memoCheck{}
		g.a.memoCheck = chk
		r := goldenRand{s: 7919 * (uint64(w) + 1)}
		for range epochs {
			g.sameLimitsChange(&r)
			g.epoch()
		}
		hits += chk.hits
		if chk.mismatches > 0 && mismatches == 0 {
			first = chk.first
		}
		mismatches += chk.mismatches
	}
	t.Logf("%d memo hits, %d of them differ from a recomputation", hits, mismatches)
	if mismatches > 0 {
		t.Fatalf("%d remembered targets differ from a recomputation; the first: %s", mismatches, first)
	}
	if hits < 10_000 {
		t.Fatalf("only %d memo hits: the worlds no longer repeat a key's inputs", hits)
	}
}

// TestTargetMemoDecidesAsRecomputing runs the worlds of
// TestTargetMemoMatchesRecomputation twice, remembering targets and
// always recomputing them, and compares every output of the two runs
// (each answer's grants to the bit, static leases, nudges, lapses, views);
// the run that always recomputes uses the memo not once.
func TestTargetMemoDecidesAsRecomputing(t *testing.T) {
	const worlds, epochs = 8, 120
	for w := range worlds {
		var digests [2][]byte
		for run, off := range []bool{true, false} {
			h := sha256.New()
			g := newGoldenWorld(t, 2000+uint64(w), h)
			g.steady = true
			g.a.memoOff = off
			chk := &memoCheck{}
			g.a.memoCheck = chk
			r := goldenRand{s: 104729 * (uint64(w) + 1)}
			for range epochs {
				g.sameLimitsChange(&r)
				g.epoch()
			}
			digests[run] = h.Sum(nil)
			// The run that always recomputes must never use the memo, or
			// the comparison would compare the memo with itself.
			if off && chk.hits != 0 || !off && chk.hits == 0 {
				t.Fatalf("world %d: memoOff %v, %d memo hits", w, off, chk.hits)
			}
		}
		if !bytes.Equal(digests[0], digests[1]) {
			t.Fatalf("world %d: the outputs with remembered targets differ from those recomputing every time", w)
		}
	}
}

// sameLimitsChange makes, now and then, a change that leaves every key's
// rate and burst and every region's name as they were: a key's unit and
// floor share, or one region's weight, floor or drain. What the silent
// regions leave of the limit may be the same before and after, so only
// the memo's generation forgets the targets computed before.
func (g *goldenWorld) sameLimitsChange(r *goldenRand) {
	switch {
	case r.chance(0.06) && len(g.keys) > 0:
		k := g.keys[r.intn(len(g.keys))]
		l := g.limits[k]
		l.Unit = []float64{0, 1, 2.5, 10, 0.5}[r.intn(5)]
		l.FloorShare = []float64{0, 0.5, 1, 0.25}[r.intn(4)]
		g.out("same", g.a.SetLimit(k, l))
		g.limits[k] = l
	case r.chance(0.04):
		regions := append([]Region(nil), g.regions...)
		i := r.intn(len(regions))
		switch r.intn(3) {
		case 0:
			regions[i].Weight = []float64{0.5, 1, 2, 3}[r.intn(4)]
		case 1:
			regions[i].Drained = !regions[i].Drained
		default:
			regions[i].MinShare = 0.1 * r.float()
		}
		if ValidateRegions(regions) == nil {
			g.setRegions(regions)
		}
	}
}

// TestSilentRegionFrozenUntilItsSummaryEnds: a silent region's targets
// are what it may be using, its summary's rate and burst, until the
// instant each ends, then its static share; the reporting regions share
// what is left, the burst by their weights when they get no rate.
func TestSilentRegionFrozenUntilItsSummaryEnds(t *testing.T) {
	a := mustAllocator(t, []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 2}})
	key := quota.Key{Tenant: "acme", Class: "write"}
	if err := a.SetLimit(key, KeyLimit{Rate: 100, Burst: 100}); err != nil { // static shares 25, 25, 50
		t.Fatal(err)
	}
	k := a.keyIndex[key]
	b := a.newBlock(k)
	const rateT, burstT = int64(5 * time.Second), int64(6 * time.Second)
	a.summaries[int(b)*3+1] = summary{rateV: 100, burstV: 40, rateT: rateT, burstT: burstT}
	for _, tc := range []struct {
		at          int64
		rate, burst []float64
	}{
		{rateT - 1, []float64{0, 100, 0}, []float64{20, 40, 40}},
		{rateT, []float64{25, 25, 50}, []float64{18, 40, 42}}, // the burst left split in whole units, by the rates
		{burstT, []float64{25, 25, 50}, []float64{25, 25, 50}},
	} {
		sh := a.loadShares(k)
		a.silent = []bool{false, true, false}
		ensure(&a.dem, 3)
		a.dem[0], a.dem[1], a.dem[2] = 80, 0, 80
		a.computeTargets(tc.at, k, b, sh)
		rate, burst := a.targetRate[int(b)*3:int(b)*3+3], a.targetBurst[int(b)*3:int(b)*3+3]
		if !slices.Equal(rate, tc.rate) || !slices.Equal(burst, tc.burst) {
			t.Fatalf("at %v: targets %v/%v, want %v/%v", time.Duration(tc.at), rate, burst, tc.rate, tc.burst)
		}
	}
}

// TestSilentRegionsAboveTheLimitLeaveTheOthersNothing: silent regions
// frozen at what they may use can add up to more than the key's rate (one
// on a large grant, another at its static share); the reporting regions
// then share no capacity, not a negative one, so a region's floor is
// scaled to 0, never below it.
func TestSilentRegionsAboveTheLimitLeaveTheOthersNothing(t *testing.T) {
	a := mustAllocator(t, []Region{{Name: "a", Weight: 1, MinShare: 0.2}, {Name: "b", Weight: 1}, {Name: "c", Weight: 2}})
	key := quota.Key{Tenant: "acme", Class: "write"}
	if err := a.SetLimit(key, KeyLimit{Rate: 100, Burst: 100}); err != nil { // static shares 25, 25, 50
		t.Fatal(err)
	}
	k := a.keyIndex[key]
	b := a.newBlock(k)
	const until = int64(5 * time.Second)
	a.summaries[int(b)*3+1] = summary{rateV: 100, burstV: 40, rateT: until, burstT: until}
	sh := a.loadShares(k)
	a.silent = []bool{false, true, true}
	ensure(&a.dem, 3)
	a.dem[0], a.dem[1], a.dem[2] = 80, 0, 0
	a.computeTargets(until-1, k, b, sh)
	rate := a.targetRate[int(b)*3 : int(b)*3+3]
	if want := []float64{0, 100, 50}; !slices.Equal(rate, want) {
		t.Fatalf("rate targets %v, want %v: the reporting region gets nothing, not less", rate, want)
	}
}

// TestMemoCheckFindsATargetChangedInAnyBit: the check the memo tests rely
// on reports a recomputation that differs from the remembered targets in
// one bit of one region's rate or burst, and nothing when it is the same.
func TestMemoCheckFindsATargetChangedInAnyBit(t *testing.T) {
	s := newScript(t, twoRegions(), KeyLimit{Rate: 100, Burst: 100})
	s.a.Allocate(s.at(6000))
	s.report("a", 6100, 150, -1)
	s.report("b", 6200, 10, -1)
	k := s.a.keyIndex[s.key]
	b := s.a.blockOf[k]
	if b < 0 {
		t.Fatal("the contended key has no block")
	}
	base := int(b) * s.a.nr
	for _, tc := range []struct {
		name   string
		change func()
		want   int
	}{
		{"same targets", func() {}, 0},
		{"a's rate", func() { s.a.targetRate[base] = math.Nextafter(s.a.targetRate[base], 0) }, 1},
		{"b's burst", func() { s.a.targetBurst[base+1] = math.Nextafter(s.a.targetBurst[base+1], math.Inf(1)) }, 1},
	} {
		chk := &memoCheck{}
		chk.verify(s.a, k, b, tc.change)
		if chk.hits != 1 || chk.mismatches != tc.want {
			t.Errorf("%s: %d hits, %d mismatches (%s), want 1 and %d", tc.name, chk.hits, chk.mismatches, chk.first, tc.want)
		}
	}
}

// TestMemoTellsTheLastRegionsSilenceApart: the memo's silent set has a bit
// for every region up to MaxRegions. The 64th region going silent while
// frozen at nothing (static share 0, no grant) leaves the capacity, the
// pool and the other regions' demands as they were, so only its bit tells
// the two computations apart: with it silent, the demand it had no longer
// takes part in the fill, and region 0 gets the rate it took.
func TestMemoTellsTheLastRegionsSilenceApart(t *testing.T) {
	regions := make([]Region, MaxRegions)
	sr, sb := make([]float64, MaxRegions), make([]float64, MaxRegions)
	for i := range regions {
		regions[i] = Region{Name: fmt.Sprintf("r%02d", i), Weight: 1}
		sr[i], sb[i] = 100, 10
	}
	last := MaxRegions - 1
	sr[last], sb[last] = 0, 0
	a := mustAllocator(t, regions)
	key := quota.Key{Tenant: "acme", Class: "write"}
	if err := a.SetLimit(key, KeyLimit{Rate: 100 * MaxRegions, Burst: 10 * MaxRegions, StaticRate: sr, StaticBurst: sb}); err != nil {
		t.Fatal(err)
	}
	k := a.keyIndex[key]
	b := a.newBlock(k)
	sh := a.loadShares(k)
	base := int(b) * a.nr
	targets := func(lastSilent bool) []float64 {
		a.silent = make([]bool, MaxRegions)
		a.silent[last] = lastSilent
		ensure(&a.dem, MaxRegions)
		clear(a.dem[:MaxRegions])
		a.dem[0], a.dem[last] = 10_000, 10_000
		a.computeTargets(0, k, b, sh)
		return slices.Concat(a.targetRate[base:base+a.nr], a.targetBurst[base:base+a.nr])
	}
	all := targets(false)
	got := targets(true)
	a.forgetTargets(b)
	want := targets(true)
	if !slices.Equal(got, want) {
		t.Fatalf("targets with region %d silent: %v, recomputed %v (with it reporting: %v)", last, got[:3], want[:3], all[:3])
	}
	if want[0] <= all[0] {
		t.Fatalf("region 0's target %v with region %d silent, want more than %v with it taking part", want[0], last, all[0])
	}
}
