package config

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
	"pgregory.net/rapid"
)

func TestResolve(t *testing.T) {
	c, err := Parse(readTestdata(t, "full.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		key  quota.Key
		want Resolved
	}{
		{quota.Key{Tenant: "acme", Class: "write"}, Resolved{ // tenant override wins
			Limit: quota.Limit{Rate: 800, Burst: 1600}, Class: c.Classes["write"], ClassName: "write", Tier: "pro"}},
		{quota.Key{Tenant: "acme", Class: "read"}, Resolved{ // tenant's tier
			Limit: quota.Limit{Rate: 2000, Burst: 4000}, Class: c.Classes["read"], ClassName: "read", Tier: "pro"}},
		{quota.Key{Tenant: "stranger", Class: "read"}, Resolved{ // unlisted: default tier
			Limit: quota.Limit{Rate: 10, Burst: 20}, Class: c.Classes["read"], ClassName: "read", Tier: "free"}},
		{quota.Key{Tenant: "stranger", Class: "export"}, Resolved{ // shadow class
			Limit: quota.Limit{Rate: 0.1, Burst: 1}, Class: c.Classes["export"], ClassName: "export", Tier: "free", Shadow: true}},
		{quota.Key{Tenant: "beta-co", Class: "write"}, Resolved{ // shadow tenant
			Limit: quota.Limit{Rate: 2.5, Burst: 5}, Class: c.Classes["write"], ClassName: "write", Tier: "free", Shadow: true}},
	}
	for _, tc := range cases {
		got, err := c.Resolve(tc.key)
		if err != nil {
			t.Errorf("Resolve(%v): %v", tc.key, err)
			continue
		}
		if got != tc.want {
			t.Errorf("Resolve(%v) = %+v, want %+v", tc.key, got, tc.want)
		}
	}
}

func TestResolveRefusesBadKeys(t *testing.T) {
	c := Default()
	cases := []struct {
		key  quota.Key
		want string
	}{
		{quota.Key{Tenant: "acme", Class: "delete"}, `class "delete" is not configured`},
		{quota.Key{Tenant: "", Class: "read"}, "tenant is empty"},
		{quota.Key{Tenant: "a{b}", Class: "read"}, `tenant "a{b}" has byte '{'`},
	}
	for _, tc := range cases {
		got, err := c.Resolve(tc.key)
		if err == nil {
			t.Errorf("Resolve(%v) = %+v, want an error", tc.key, got)
			continue
		}
		if !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Resolve(%v) error %q: want quota.ErrInvalid and %q", tc.key, err, tc.want)
		}
	}
}

func TestResolveDoesNotAllocate(t *testing.T) {
	c := Default()
	keys := []quota.Key{{Tenant: "acme", Class: "write"}, {Tenant: "someone", Class: "export"}}
	allocs := testing.AllocsPerRun(100, func() {
		for _, k := range keys {
			if _, err := c.Resolve(k); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("Resolve allocates %v times per run", allocs)
	}
}

func BenchmarkResolve(b *testing.B) {
	c := Default()
	k := quota.Key{Tenant: "acme", Class: "write"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Resolve(k); err != nil {
			b.Fatal(err)
		}
	}
}

func TestStaticShare(t *testing.T) {
	c := Default() // weights us-east 2, eu-west 1, ap-south 1
	rate, burst, err := c.StaticShare("us-east", 100, 40)
	if err != nil {
		t.Fatal(err)
	}
	if !near(rate, 50) || !near(burst, 20) || rate > 50 || burst > 20 {
		t.Errorf("us-east share = %v, %v; want just below 50, 20", rate, burst)
	}
	rate, burst, err = c.StaticShare("eu-west", 100, 40)
	if err != nil {
		t.Fatal(err)
	}
	if !near(rate, 25) || !near(burst, 10) {
		t.Errorf("eu-west share = %v, %v; want about 25, 10", rate, burst)
	}
	for _, bad := range []struct {
		region      string
		rate, burst float64
		want        string
	}{
		{"mars", 1, 1, `region "mars" is not configured`},
		{"eu-west", -1, 1, "rate -1 must be"},
		{"eu-west", 1, -1, "burst -1 must be"},
		{"eu-west", math.NaN(), 1, "rate NaN must be"},
		{"eu-west", 1, math.NaN(), "burst NaN must be"},
		{"eu-west", 1, math.Inf(1), "burst +Inf must be"},
		{"eu-west", math.Inf(1), 1, "rate +Inf must be"},
		{"eu-west", math.Inf(-1), 1, "rate -Inf must be"},
		{"eu-west", 1, math.Inf(-1), "burst -Inf must be"},
	} {
		if _, _, err := c.StaticShare(bad.region, bad.rate, bad.burst); err == nil ||
			!errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("StaticShare(%q, %v, %v) error = %v, want %q", bad.region, bad.rate, bad.burst, err, bad.want)
		}
	}
}

// TestSharesOfAnUnknownRegionAreNothing: a region the config does not
// name has no share, so a caller that acts on the values despite the error
// runs on nothing rather than on a made-up share.
func TestSharesOfAnUnknownRegionAreNothing(t *testing.T) {
	c := Default()
	res, err := c.Resolve(quota.Key{Tenant: "acme", Class: "read"})
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func(string, Resolved) (float64, float64, error){
		"StaticShareOf": c.StaticShareOf, "FloorOf": c.FloorOf,
	} {
		rate, burst, err := f("mars", res)
		if !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), `region "mars" is not configured`) || rate != 0 || burst != 0 {
			t.Errorf("%s(mars) = %v, %v, %v; want 0, 0 and an error naming the region", name, rate, burst, err)
		}
	}
}

func near(got, want float64) bool { return got > want*(1-1e-9) && got < want*(1+1e-9) }

// TestStaticSharesNeverOversubscribe checks, in exact arithmetic, that the
// regions' static shares sum to at most the rate (invariant 2) and lose
// almost nothing, and that they do not depend on map iteration order.
func TestStaticSharesNeverOversubscribe(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 40).Draw(t, "regions")
		c := Default()
		c.Regions = make(map[string]Region, n)
		for i := range n {
			w := rapid.Float64Range(1e-3, 1e3).Draw(t, fmt.Sprintf("w%d", i))
			c.Regions[fmt.Sprintf("r%d", i)] = Region{Weight: w, MaxShare: 1}
		}
		rate := rapid.Float64Range(1e-6, 1e9).Draw(t, "rate")
		burst := float64(rapid.Int64Range(1, 1<<40).Draw(t, "burst"))
		rateSum, burstSum := new(big.Float).SetPrec(4096), new(big.Float).SetPrec(4096)
		for name := range c.Regions {
			r, b, err := c.StaticShare(name, rate, burst)
			if err != nil {
				t.Fatal(err)
			}
			r2, b2, _ := c.StaticShare(name, rate, burst)
			if r != r2 || b != b2 {
				t.Fatalf("StaticShare(%s) not deterministic: %v/%v then %v/%v", name, r, b, r2, b2)
			}
			rateSum.Add(rateSum, big.NewFloat(r))
			burstSum.Add(burstSum, big.NewFloat(b))
		}
		for _, s := range []struct {
			name  string
			sum   *big.Float
			limit float64
		}{{"rate", rateSum, rate}, {"burst", burstSum, burst}} {
			if s.sum.Cmp(big.NewFloat(s.limit)) > 0 {
				t.Fatalf("%s shares sum to %s > %v", s.name, s.sum.Text('g', 30), s.limit)
			}
			if f, _ := s.sum.Float64(); f < s.limit*(1-1e-9) {
				t.Fatalf("%s shares sum to %v, far below %v", s.name, f, s.limit)
			}
		}
	})
}

// Small bursts are split in whole units of the class's max_cost, the same
// way the global tier splits them (hierarchy.StaticBursts).
func TestStaticShareWholeUnits(t *testing.T) {
	c, err := Parse(SampleYAML())
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, region := range []string{"us-east", "eu-west", "ap-south"} {
		_, b, err := c.StaticShare(region, 0.1, 1)
		if err != nil {
			t.Fatal(err)
		}
		if b != 0 && b != 1 {
			t.Fatalf("%s: static burst %v, want whole tokens", region, b)
		}
		sum += b
	}
	if sum != 1 {
		t.Fatalf("static bursts add up to %v, want 1", sum)
	}
	cl := c.Classes["export"]
	cl.MaxCost = 2
	c.Classes["export"] = cl
	res, err := c.Resolve(quota.Key{Tenant: "acme", Class: "export"}) // pro: burst 5
	if err != nil {
		t.Fatal(err)
	}
	for _, region := range []string{"us-east", "eu-west", "ap-south"} {
		if _, b, _ := c.StaticShareOf(region, res); b != 0 && b != 2 && b != 3 {
			t.Fatalf("%s: static burst %v of 5 in units of 2", region, b)
		}
	}
	// The free tier's export burst is 1, below max_cost 2.
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "max_cost") {
		t.Fatalf("a burst below max_cost: got %v, want an error naming max_cost", err)
	}
	cl.MaxCost = quota.MaxCost + 1
	c.Classes["export"] = cl
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "classes.export.max_cost") {
		t.Fatalf("max_cost above quota.MaxCost: got %v", err)
	}
}

// TestDemandWindowIsHalfTheRefreshInWholeMilliseconds: the demand window
// is half the refresh, truncated to whole milliseconds, and never below
// 1ms however short the refresh.
func TestDemandWindowIsHalfTheRefreshInWholeMilliseconds(t *testing.T) {
	for _, tc := range []struct{ refresh, want time.Duration }{
		{time.Second, 500 * time.Millisecond},
		{MinRefresh + 3*time.Millisecond, 6 * time.Millisecond},
		{time.Millisecond, time.Millisecond},
	} {
		c := &Config{Refresh: Duration(tc.refresh)}
		if got := c.DemandWindow(); got != tc.want {
			t.Errorf("refresh %v: demand window %v, want %v", tc.refresh, got, tc.want)
		}
	}
}
