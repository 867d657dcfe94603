package regionsync

import (
	"testing"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// awaitConfig parses a config of regions ap, eu and us (us drained when
// drained) with class write and, when hourly, class hourly (100/h, burst
// 100, partition_share 0).
func awaitConfig(t *testing.T, hourly, drained bool, usWeight float64) *config.Config {
	t.Helper()
	y := "regions: {ap: {weight: 1}, eu: {weight: 1}, us: {weight: " + fmtWeight(usWeight)
	if drained {
		y += ", drained: true"
	}
	y += "}}\nclasses: {write: {mode: lease}"
	if hourly {
		y += ", hourly: {mode: lease, partition_share: 0}"
	}
	y += "}\ntiers: {free: {write: {rate: 100/s, burst: 100}"
	if hourly {
		y += ", hourly: {rate: 100/h, burst: 100}"
	}
	y += "}}\ndefault_tier: free\n"
	c, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatalf("config: %v\n%s", err, y)
	}
	return c
}

func fmtWeight(w float64) string {
	if w == 1 {
		return "1"
	}
	return "0.001"
}

// TestChainAwaitingOnlyForAClassNotYetKnown: a region's burst of 0 is a
// share awaited only when the configs that know the key all give it one
// and a config that does not know its class makes the 0; never when a
// config drains the region to a floor of 0, or gives it no whole unit.
func TestChainAwaitingOnlyForAClassNotYetKnown(t *testing.T) {
	hourly := quota.Key{Tenant: "acme", Class: "hourly"}
	old := awaitConfig(t, false, false, 1)
	added := awaitConfig(t, true, false, 1)
	addedDrained := awaitConfig(t, true, true, 1)
	addedTiny := awaitConfig(t, true, false, 0.001) // us gets no whole unit of 100
	awaiting := func(c Chain, region string) (bool, float64) {
		t.Helper()
		cur := c.Current().Cfg
		res, err := cur.Resolve(hourly)
		if err != nil {
			t.Fatalf("resolve: %v", err)
		}
		_, b, err := c.Share(region, hourly, cur, res)
		if err != nil {
			t.Fatalf("share: %v", err)
		}
		return c.Awaiting(region, hourly, cur, res), b
	}
	for _, tc := range []struct {
		name  string
		chain Chain
		want  bool
	}{
		{"class added, not confirmed", NewChain(1, old).Adopt(2, added), true},
		{"class added and confirmed", NewChain(1, old).Adopt(2, added).Confirm(2), false},
		{"class added to a drained region", NewChain(1, old).Adopt(2, addedDrained), false},
		{"drained region restored, not confirmed", NewChain(2, addedDrained).Adopt(3, added), false},
		{"class added, region with no whole unit", NewChain(1, old).Adopt(2, addedTiny), false},
		{"class removed and added back", NewChain(1, added).Adopt(2, old).Adopt(3, added), true},
		// A config that does not know the class makes the 0, but one
		// adopted since drains the region: its floor may be what the
		// global tier counts it at.
		{"class added, drained, then restored", NewChain(1, old).Adopt(2, addedDrained).Adopt(3, added), false},
	} {
		got, burst := awaiting(tc.chain, "us")
		if got != tc.want {
			t.Errorf("%s: awaiting %v (burst %v), want %v", tc.name, got, burst, tc.want)
		}
		if got && burst != 0 {
			t.Errorf("%s: awaiting with a burst of %v", tc.name, burst)
		}
	}
}
