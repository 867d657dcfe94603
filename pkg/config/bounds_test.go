package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// problemList is Validate's problems as their texts.
func problemList(c *Config) []string {
	var out []string
	for _, e := range c.problems() {
		out = append(out, e.Error())
	}
	return out
}

// TestValidateEdgeCases pins each rule's exact verdict where a bound
// meets another: the problems Validate reports for a sample changed in one
// place, all of them.
func TestValidateEdgeCases(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(c *Config)
		want   []string // every problem; none means accepted
	}{
		{"epoch of 1ns is below MinEpoch, not missing", func(c *Config) { c.Epoch = 1; c.GrantValidity = 4; c.RegionLease = Duration(time.Minute) },
			[]string{"epoch: must be at least 10ms, got 1ns"}},
		{"grant validity under 4 epochs of 1ns", func(c *Config) { c.Epoch = 1; c.GrantValidity = 3 },
			[]string{"epoch: must be at least 10ms, got 1ns", "grant_validity: must be at least 4 × epoch (4ns), got 3ns"}},
		{"grant validity of 1ns is short, not missing", func(c *Config) { c.GrantValidity = 1 },
			[]string{"grant_validity: must be at least 4 × epoch (4s), got 1ns"}},
		{"a missing epoch does not bound grant validity", func(c *Config) { c.Epoch = 0; c.GrantValidity = 1 },
			[]string{"epoch: must be > 0, got 0s"}},
		{"lease ttl zero", func(c *Config) { c.LeaseTTL = 0 }, []string{"lease_ttl: must be > 0, got 0s"}},
		{"lease ttl of 1ns is short, not missing", func(c *Config) { c.LeaseTTL = 1 },
			[]string{"refresh: must be less than lease_ttl / 2 (0s), got 1s"}},
		{"refresh of 1ns", func(c *Config) { c.Refresh = 1 }, nil},
		{"region lease of 1ns is short, not missing", func(c *Config) { c.RegionLease = 1 },
			[]string{"region_lease: must be at least 2 × grant_validity (10s), got 1ns"}},
		{"region lease under 2 grant validities of 1ns", func(c *Config) { c.GrantValidity = 1; c.RegionLease = 1 },
			[]string{"grant_validity: must be at least 4 × epoch (4s), got 1ns", "region_lease: must be at least 2 × grant_validity (2ns), got 1ns"}},
		{"a missing grant validity does not bound region lease", func(c *Config) { c.GrantValidity = 0; c.RegionLease = 1 },
			[]string{"grant_validity: must be > 0, got 0s"}},
		{"an invalid min share is not summed", func(c *Config) {
			setRegion(c, "eu-west", Region{Weight: 1, MinShare: 1.5, MaxShare: 1})
			setRegion(c, "us-east", Region{Weight: 2, MinShare: 0.5, MaxShare: 1})
		}, []string{"regions.eu-west.min_share: must be in [0, 1], got 1.5"}},
		{"an invalid max share is not compared", func(c *Config) { setRegion(c, "eu-west", Region{Weight: 1, MinShare: 0.5, MaxShare: 1.5}) },
			[]string{"regions.eu-west.max_share: must be in (0, 1], got 1.5"}},
		{"min share 0 and max share 1", func(c *Config) { setRegion(c, "eu-west", Region{Weight: 1, MinShare: 0, MaxShare: 1}) }, nil},
		{"partition share 0", func(c *Config) {
			setClass(c, "export", Class{Mode: ModeStrict, OnFailure: OnFailureClosed, Reclaim: ReclaimNone, PartitionShare: ptr(0.0)})
		}, nil},
		{"max_cost 0 means 1", func(c *Config) {
			setClass(c, "export", Class{Mode: ModeStrict, OnFailure: OnFailureClosed, Reclaim: ReclaimNone, MaxCost: 0})
		}, nil},
		{"a burst of 0 is only a bad burst, not one below max_cost", func(c *Config) {
			setClass(c, "bulk", Class{Mode: ModeLease, OnFailure: OnFailureLocal, Reclaim: ReclaimNone, MaxCost: 10})
			for _, tier := range c.Tiers {
				tier["bulk"] = LimitSpec{Rate: 100, Burst: 10}
			}
			c.Tiers["pro"]["bulk"] = LimitSpec{Rate: 100, Burst: 0}
		}, []string{"tiers.pro.bulk.burst: must be a whole number of tokens in [1, 1000000000], got 0"}},
		{"a burst equal to max_cost", func(c *Config) {
			setClass(c, "bulk", Class{Mode: ModeLease, OnFailure: OnFailureLocal, Reclaim: ReclaimNone, MaxCost: 10})
			for _, tier := range c.Tiers {
				tier["bulk"] = LimitSpec{Rate: 100, Burst: 10}
			}
		}, nil},
		{"an unknown class's limit is not checked", func(c *Config) { c.Tiers["free"]["bogus"] = LimitSpec{Rate: 0, Burst: 0} },
			[]string{`tiers.free.bogus: class "bogus" is not configured under classes`}},
		{"an envoy mapping without tenant key nor class key", func(c *Config) {
			c.Envoy.Descriptors[0] = EnvoyDescriptor{Domain: "d", Class: "read"}
		}, []string{"envoy.descriptors[0].tenant_key: is required"}},
		{"an envoy key with two spaces is one problem", func(c *Config) { c.Envoy.Descriptors[0].ClassKey = "a b c" },
			[]string{`envoy.descriptors[0].class_key: "a b c" has a space or control character at offset 1`}},
		{"an envoy key with a tab", func(c *Config) { c.Envoy.Descriptors[0].ClassKey = "a\tb" },
			[]string{`envoy.descriptors[0].class_key: "a\tb" has a space or control character at offset 1`}},
		{"an envoy key of printable bytes", func(c *Config) { c.Envoy.Descriptors[0].ClassKey = "!~" }, nil},
		{"a rate at MaxRate is checked for its fill only", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: MaxRate, Burst: 1} }, nil},
		{"a burst of 1", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: 1, Burst: 1} }, nil},
		{"demand alpha left out", func(c *Config) { c.DemandAlpha = 0 }, nil},
		{"demand alpha -1", func(c *Config) { c.DemandAlpha = -1 }, []string{"demand_alpha: must be in (0, 1], got -1"}},
		{"min shares summing to 1 plus float rounding", func(c *Config) {
			// 0.34 + 0.56 + 0.1 is 1.0000000000000002 in float64.
			setRegion(c, "ap-south", Region{Weight: 1, MinShare: 0.34, MaxShare: 1})
			setRegion(c, "eu-west", Region{Weight: 1, MinShare: 0.56, MaxShare: 1})
			setRegion(c, "us-east", Region{Weight: 2, MinShare: 0.1, MaxShare: 1})
		}, nil},
		{"min shares summing to 1 + 1.5e-9", func(c *Config) {
			setRegion(c, "eu-west", Region{Weight: 1, MinShare: 0.5 + 1.5e-9, MaxShare: 1})
			setRegion(c, "us-east", Region{Weight: 2, MinShare: 0.5, MaxShare: 1})
		}, []string{"regions: min_share of all regions sums to 1, must be at most 1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mutate(c)
			got := problemList(c)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			if err := c.Validate(); (err == nil) != (len(tc.want) == 0) || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}
