package regionsync

import (
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestConfigRiseFloorIsTheShareBeforeTheConfirmation: eu's weight doubles;
// once the global tier confirms the change eu runs 50/s where it ran 25/s,
// and the scripts are told so: the rise is when eu applied the
// confirmation, and the floor before it is the share eu ran (25/s, burst
// 25). us, whose share fell, gets no rise: nothing changes for it. A
// confirmation that drops no config is no rise.
func TestConfigRiseFloorIsTheShareBeforeTheConfirmation(t *testing.T) {
	old := chainConfig(t, [3]float64{1, 1, 2}, 100, 100) // eu 25/s, us 50/s
	grown := chainConfig(t, [3]float64{1, 2, 1}, 100, 100)
	chain := NewChain(10, old).Adopt(20, grown)
	const at = 5_000_000_000
	var rises ConfigRises
	if got := rises.Confirmed(chain, chain.Confirm(10), at); len(got) != 0 {
		t.Fatalf("a confirmation of the revision already confirmed is a rise: %v", got)
	}
	next := chain.Confirm(20)
	rises = rises.Confirmed(chain, next, at)
	if len(rises) != 1 || rises[0].RiseUS != at {
		t.Fatalf("rises %+v, want one at %d", rises, at)
	}
	res, err := grown.Resolve(chainKey)
	if err != nil {
		t.Fatal(err)
	}
	fill, margin := time.Second, 100*time.Millisecond // burst 100 / rate 100
	rate, burst := share(t, next, "eu")
	got := RiseFor(at+1000, fill, margin, 0, Share{}, Share{Rate: rate, Burst: burst}, rises, "eu", chainKey, grown, res)
	if got.RiseUS != at || !near(got.Floor.Rate, 25) || !near(got.Floor.Burst, 25) {
		t.Fatalf("eu (share %v/%v): rise %+v, want at %d from 25/s burst 25", rate, burst, got, at)
	}
	rate, burst = share(t, next, "us")
	if got := RiseFor(at+1000, fill, margin, 0, Share{}, Share{Rate: rate, Burst: burst}, rises, "us", chainKey, grown, res); got != (Rise{}) {
		t.Fatalf("us, whose share fell, is told of a rise: %+v", got)
	}
	// A fill time and a margin later the rise no longer matters.
	if got := RiseFor(at+(fill+margin).Microseconds(), fill, margin, 0, Share{}, Share{Rate: 50, Burst: 50}, rises, "eu", chainKey, grown, res); got != (Rise{}) {
		t.Fatalf("a rise past the key's fill time still matters: %+v", got)
	}
}

// TestRiseForTakesTheLatestRiseAndTheSmallestFloor: a rise off a floor and
// a config's rise both in play give the latest of the two and the smaller
// floor (only ever less credit); one past the fill time drops out; the
// remembered confirmations are bounded, the oldest forgotten first.
func TestRiseForTakesTheLatestRiseAndTheSmallestFloor(t *testing.T) {
	old := chainConfig(t, [3]float64{1, 1, 2}, 100, 100)
	grown := chainConfig(t, [3]float64{1, 2, 1}, 100, 100)
	chain := NewChain(10, old).Adopt(20, grown)
	res, err := grown.Resolve(chainKey)
	if err != nil {
		t.Fatal(err)
	}
	rises := ConfigRises{}.Confirmed(chain, chain.Confirm(20), 2_000_000)
	share := Share{Rate: 50, Burst: 50}
	fill, margin := time.Second, 0*time.Second
	got := RiseFor(2_500_000, fill, margin, 2_100_000, Share{Rate: 40, Burst: 10}, share, rises, "eu", chainKey, grown, res)
	if want := (Rise{RiseUS: 2_100_000, Floor: Share{Rate: 25, Burst: 10}}); !near(got.RiseUS, want.RiseUS) || !near(got.Floor.Rate, 25) || !near(got.Floor.Burst, 10) {
		t.Fatalf("both in play: %+v, want %+v", got, want)
	}
	got = RiseFor(3_050_000, fill, margin, 2_100_000, Share{Rate: 40, Burst: 10}, share, rises, "eu", chainKey, grown, res)
	if got.RiseUS != 2_100_000 || got.Floor != (Share{Rate: 40, Burst: 10}) {
		t.Fatalf("the config's rise past the fill time: %+v, want the floor's alone", got)
	}
	if got := RiseFor(3_050_000, 0, margin, 0, Share{}, share, rises, "eu", chainKey, grown, res); got.RiseUS != 2_000_000 {
		t.Fatalf("an unknown fill time (a rate or burst of 0) keeps every rise: %+v", got)
	}
	many := ConfigRises{}
	c := chain
	for i := range MaxConfigRises + 2 {
		many = many.Confirmed(c, c.Confirm(20), int64(i+1))
	}
	if len(many) != MaxConfigRises || many[0].RiseUS != 3 || many[len(many)-1].RiseUS != MaxConfigRises+2 {
		t.Fatalf("remembered %d rises from %d to %d, want the newest %d", len(many), many[0].RiseUS, many[len(many)-1].RiseUS, MaxConfigRises)
	}
}

func near[T int64 | float64](a, b T) bool {
	d := float64(a - b)
	return d < 1e-9 && d > -1e-9
}

// TestConfigRiseOfANewClassOrRegion: a class the old config did not know
// had no share anywhere under it, so nothing was spent there and a key of
// it is born full once its share comes (no rise); a region the old config
// did not hold had nothing there while the others ran the whole limit: its
// floor before the rise is 0.
func TestConfigRiseOfANewClassOrRegion(t *testing.T) {
	parse := func(y string) *config.Config {
		c, err := config.Parse([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	old := parse("regions: {eu: {weight: 1}, us: {weight: 1}}\nclasses: {read: {mode: lease}}\ntiers: {free: {read: {rate: 100/s, burst: 100}}}\ndefault_tier: free\n")
	grown := parse("regions: {eu: {weight: 1}, us: {weight: 1}, ap: {weight: 2}}\nclasses: {read: {mode: lease}, write: {mode: lease}}\n" +
		"tiers: {free: {read: {rate: 100/s, burst: 100}, write: {rate: 100/s, burst: 100}}}\ndefault_tier: free\n")
	chain := NewChain(10, old).Adopt(20, grown)
	rises := ConfigRises{}.Confirmed(chain, chain.Confirm(20), 7_000_000)
	for _, tc := range []struct {
		region, class string
		want          Rise
	}{
		{"eu", "write", Rise{}},
		{"ap", "read", Rise{RiseUS: 7_000_000}},
		{"ap", "write", Rise{}},
	} {
		k := quota.Key{Tenant: "acme", Class: tc.class}
		res, err := grown.Resolve(k)
		if err != nil {
			t.Fatal(err)
		}
		r, b, err := grown.StaticShareOf(tc.region, res)
		if err != nil {
			t.Fatal(err)
		}
		if got := RiseFor(7_000_001, time.Second, 0, 0, Share{}, Share{Rate: r, Burst: b}, rises, tc.region, k, grown, res); got != tc.want {
			t.Errorf("%s %s: %+v, want %+v", tc.region, tc.class, got, tc.want)
		}
	}
}

// BenchmarkRiseFor is the request path's cost of the rises (Server.common
// runs it per request while a rise can still matter for the key), next to
// Chain.Share, which every request already pays, in the same run: a rise
// off a floor alone, and four remembered confirmations of two-config
// chains.
func BenchmarkRiseFor(b *testing.B) {
	old := chainConfig(b, [3]float64{1, 1, 2}, 100, 100)
	grown := chainConfig(b, [3]float64{1, 2, 1}, 100, 100)
	chain := NewChain(10, old).Adopt(20, grown)
	res, err := grown.Resolve(chainKey)
	if err != nil {
		b.Fatal(err)
	}
	var rises ConfigRises
	for i := range MaxConfigRises {
		rises = rises.Confirmed(chain, chain.Confirm(20), int64(1_000_000+i))
	}
	share := Share{Rate: 50, Burst: 50}
	b.Run("chain share (reference)", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := chain.Share("eu", chainKey, grown, res); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("floor rise", func(b *testing.B) {
		for b.Loop() {
			RiseFor(1_500_000, time.Second, time.Second, 1_000_000, Share{Rate: 25, Burst: 25}, share, nil, "eu", chainKey, grown, res)
		}
	})
	b.Run("four config rises", func(b *testing.B) {
		for b.Loop() {
			RiseFor(1_500_000, time.Second, time.Second, 0, Share{}, share, rises, "eu", chainKey, grown, res)
		}
	})
}

// TestRiseForAtItsEdges: a rise off a floor counts only when it is known
// (above 0) and matters (within the fill time and the margin after it, or
// the fill time unknown), and only when the floor is below the share in
// rate or in burst, each on its own; a floor at the share in one and above
// it in the other is no rise.
func TestRiseForAtItsEdges(t *testing.T) {
	grown := chainConfig(t, [3]float64{1, 2, 1}, 100, 100)
	res, err := grown.Resolve(chainKey)
	if err != nil {
		t.Fatal(err)
	}
	const est = 10_000_000
	share := Share{Rate: 50, Burst: 50}
	low := Share{Rate: 10, Burst: 10}
	for _, tc := range []struct {
		name         string
		fill, margin time.Duration
		riseUS       int64
		floor        Share
		want         Rise
	}{
		{"no rise known, a floor handed, the fill time unknown", 0, 0, 0, low, Rise{}},
		{"a rise at the first microsecond, the fill time unknown", 0, 0, 1, low, Rise{RiseUS: 1, Floor: low}},
		{"a fill time of 1 ns: only the margin after the rise", time.Nanosecond, time.Millisecond, est - 2000, low, Rise{}},
		{"past the fill time, within the margin", time.Second, 100 * time.Millisecond, est - 1_050_000, low, Rise{RiseUS: est - 1_050_000, Floor: low}},
		{"just before the fill time and the margin", time.Second, 100 * time.Millisecond, est - 1_099_999, low, Rise{RiseUS: est - 1_099_999, Floor: low}},
		{"only the burst below", time.Second, 0, est - 1000, Share{Rate: 50, Burst: 10}, Rise{RiseUS: est - 1000, Floor: Share{Rate: 50, Burst: 10}}},
		{"only the rate below", time.Second, 0, est - 1000, Share{Rate: 10, Burst: 50}, Rise{RiseUS: est - 1000, Floor: Share{Rate: 10, Burst: 50}}},
		{"the rate at the share, the burst above", time.Second, 0, est - 1000, Share{Rate: 50, Burst: 60}, Rise{}},
		{"the burst at the share, the rate above", time.Second, 0, est - 1000, Share{Rate: 60, Burst: 50}, Rise{}},
	} {
		if got := RiseFor(est, tc.fill, tc.margin, tc.riseUS, tc.floor, share, nil, "eu", chainKey, grown, res); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestConfigRiseFloorOverManyConfigs: the floor of confirmations in play
// is the smallest share under every config of every chain before them,
// however many (more than a chain holds, past what RiseFor keeps of each
// config's share for the call), taken under each config's own weights; a
// chain before a confirmation that held no config (a process started on
// none) adds nothing.
func TestConfigRiseFloorOverManyConfigs(t *testing.T) {
	cfg := chainConfig(t, [3]float64{1, 10, 1}, 120, 120) // eu 100/s
	res, err := cfg.Resolve(chainKey)
	if err != nil {
		t.Fatal(err)
	}
	share := Share{Rate: 100, Burst: 100}
	var rises ConfigRises
	// Four confirmations, each of a chain of five configs, eu's weight
	// falling throughout: the last config of the last chain is the
	// smallest share, 120·1/3 = 40.
	for j := range MaxConfigRises {
		var c Chain
		for i := range 5 {
			n := 5*j + i
			w := 5 - 0.2*float64(n) // 5 … 1.2
			rev := int64(n + 1)
			cc := chainConfig(t, [3]float64{1, w, 1}, 120, 120)
			if i == 0 {
				c = NewChain(rev, cc)
			} else {
				c = c.Adopt(rev, cc)
			}
		}
		rises = rises.Confirmed(c, c.Confirm(int64(5*j+5)), int64(1_000_000+j))
	}
	if len(rises) != MaxConfigRises {
		t.Fatalf("%d rises remembered, want %d", len(rises), MaxConfigRises)
	}
	got := RiseFor(1_500_000, time.Second, 0, 0, Share{}, share, rises, "eu", chainKey, cfg, res)
	want := 120 * 1.2 / 3.2
	if got.RiseUS != 1_000_000+MaxConfigRises-1 || !near(got.Floor.Rate, want) || !near(got.Floor.Burst, want) {
		t.Fatalf("rise %+v, want the latest (%d) from %v/s, burst %v", got, 1_000_000+MaxConfigRises-1, want, want)
	}
	// Two configs only, the larger share first: the floor is still the
	// smaller one's.
	big, small := chainConfig(t, [3]float64{1, 4, 1}, 120, 120), chainConfig(t, [3]float64{1, 1, 1}, 120, 120)
	two := NewChain(1, big).Adopt(2, small).Adopt(3, cfg)
	rises = ConfigRises{}.Confirmed(two, two.Confirm(3), 1_000_000)
	if got := RiseFor(1_500_000, time.Second, 0, 0, Share{}, share, rises, "eu", chainKey, cfg, res); got.RiseUS != 1_000_000 || !near(got.Floor.Rate, 40) {
		t.Fatalf("rise %+v, want at 1000000 from the smaller share 40/s", got)
	}
	none := NewChain(5, nil).Adopt(6, cfg)
	rises = ConfigRises{}.Confirmed(none, none.Confirm(6), 1_000_000)
	if len(rises) != 1 {
		t.Fatalf("the confirmation off no config was not remembered: %+v", rises)
	}
	if got := RiseFor(1_500_000, time.Second, 0, 0, Share{}, share, rises, "eu", chainKey, cfg, res); got != (Rise{}) {
		t.Fatalf("a chain of no config before the confirmation gives a rise: %+v", got)
	}
}

// TestMayRaiseOnlyOnAConfirmationThatDropsAConfig: adopting a config
// (the chain grows) never raises a share; a confirmation that drops one
// may; one of the confirmed revision again does not.
func TestMayRaiseOnlyOnAConfirmationThatDropsAConfig(t *testing.T) {
	a, b := chainConfig(t, [3]float64{1, 1, 1}, 100, 100), chainConfig(t, [3]float64{1, 2, 1}, 100, 100)
	c := NewChain(1, a)
	for _, tc := range []struct {
		name      string
		old, next Chain
		want      bool
	}{
		{"adopted", c, c.Adopt(2, b), false},
		{"confirmed", c.Adopt(2, b), c.Adopt(2, b).Confirm(2), true},
		{"the confirmed one again", c.Adopt(2, b), c.Adopt(2, b).Confirm(1), false},
	} {
		if got := MayRaise(tc.old, tc.next); got != tc.want {
			t.Errorf("%s: may raise %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestConfigRisesKeepTheNewestFour: the documented bound
// (docs/architecture.md, "Coming back from a floor": the last 4
// confirmations), held after every confirmation, the oldest forgotten
// first.
func TestConfigRisesKeepTheNewestFour(t *testing.T) {
	if MaxConfigRises != 4 {
		t.Fatalf("MaxConfigRises %d, documented as 4", MaxConfigRises)
	}
	a, b := chainConfig(t, [3]float64{1, 1, 1}, 100, 100), chainConfig(t, [3]float64{1, 2, 1}, 100, 100)
	c := NewChain(1, a).Adopt(2, b)
	var rises ConfigRises
	for i := range int64(7) {
		rises = rises.Confirmed(c, c.Confirm(2), i+1)
		var got []int64
		for _, r := range rises {
			got = append(got, r.RiseUS)
		}
		var want []int64
		for us := max(1, i-2); us <= i+1; us++ {
			want = append(want, us)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("after %d confirmations remembered %v, want %v", i+1, got, want)
		}
	}
}
