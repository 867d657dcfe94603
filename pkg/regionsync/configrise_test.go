package regionsync

import (
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
