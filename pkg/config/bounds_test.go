package config

import (
	"context"
	"errors"
	"math"
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
		{"refresh of 1ns is below MinRefresh, not missing", func(c *Config) { c.Refresh = 1 },
			[]string{"refresh: must be at least 10ms, got 1ns"}},
		{"refresh of MinRefresh", func(c *Config) { c.Refresh = Duration(MinRefresh) }, nil},
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
		{"min shares summing to exactly 1 + 1e-9", func(c *Config) {
			sum := 1 + shareSumSlack // in float64, at run time
			setRegion(c, "eu-west", Region{Weight: 1, MinShare: sum - 0.5, MaxShare: 1})
			setRegion(c, "us-east", Region{Weight: 2, MinShare: 0.5, MaxShare: 1})
		}, nil},
		{"max share below the weight share", func(c *Config) { setRegion(c, "us-east", Region{Weight: 2, MaxShare: 0.49}) },
			[]string{"regions.us-east.max_share: must be at least the region's weight share 0.5 (weight 2 of 4; its static share of every key), got 0.49: below it, a key the region needs more of would be granted less than it runs on uncontended"}},
		{"max share at the weight share", func(c *Config) { setRegion(c, "us-east", Region{Weight: 2, MaxShare: 0.5}) }, nil},
		{"max share below the weight share, weights unknown", func(c *Config) {
			setRegion(c, "us-east", Region{Weight: 2, MaxShare: 0.1})
			setRegion(c, "eu-west", Region{Weight: -1, MaxShare: 1})
		}, []string{"regions.eu-west.weight: must be a finite number > 0, got -1"}},
		{"max share twice the slack below the weight share", func(c *Config) {
			setRegion(c, "us-east", Region{Weight: 2, MaxShare: 0.5 * (1 - 2*shareSumSlack)})
		}, []string{"regions.us-east.max_share: must be at least the region's weight share 0.5 (weight 2 of 4; its static share of every key), got 0.499999999: below it, a key the region needs more of would be granted less than it runs on uncontended"}},
		{"max share a float rounding below the weight share", func(c *Config) {
			share := 0.5 // us-east's, weight 2 of 4
			setRegion(c, "us-east", Region{Weight: 2, MaxShare: share * (1 - shareSumSlack)})
		}, nil},
		{"max share below the weight share, a max share out of range", func(c *Config) {
			setRegion(c, "us-east", Region{Weight: 2, MaxShare: 0.1})
			setRegion(c, "eu-west", Region{Weight: 1, MaxShare: 1.5})
		}, []string{"regions.eu-west.max_share: must be in (0, 1], got 1.5"}},
		{"max share 0, weights known", func(c *Config) { setRegion(c, "us-east", Region{Weight: 2, MaxShare: 0}) },
			[]string{"regions.us-east.max_share: must be in (0, 1], got 0"}},
		{"min share above a max share out of range", func(c *Config) { setRegion(c, "us-east", Region{Weight: 2, MinShare: 0.2, MaxShare: 0}) },
			[]string{"regions.us-east.max_share: must be in (0, 1], got 0"}},
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

// TestDefaultsOfLeftOutFields: a class's burst unit is its max_cost, 1
// when left out (or not positive); its partition share is the one set,
// else 1 for on_failure open and 0 otherwise; the shard map has
// global_shards shards, one when left out or out of bounds.
func TestDefaultsOfLeftOutFields(t *testing.T) {
	for _, tc := range []struct {
		maxCost int64
		want    float64
	}{{0, 1}, {-1, 1}, {1, 1}, {2, 2}, {1 << 20, 1 << 20}} {
		if got := (Class{MaxCost: tc.maxCost}).Unit(); got != tc.want {
			t.Errorf("Unit of max_cost %d = %v, want %v", tc.maxCost, got, tc.want)
		}
	}
	for _, tc := range []struct {
		c    Class
		want float64
	}{
		{Class{OnFailure: OnFailureOpen}, 1},
		{Class{OnFailure: OnFailureLocal}, 0},
		{Class{OnFailure: OnFailureClosed}, 0},
		{Class{OnFailure: OnFailureOpen, PartitionShare: ptr(0.25)}, 0.25},
		{Class{OnFailure: OnFailureClosed, PartitionShare: ptr(0.5)}, 0.5},
		{Class{OnFailure: OnFailureOpen, PartitionShare: ptr(0.0)}, 0},
	} {
		if got := tc.c.PartitionFraction(); got != tc.want {
			t.Errorf("PartitionFraction of %+v = %v, want %v", tc.c, got, tc.want)
		}
	}
	for _, tc := range []struct {
		shards int64
		want   int
	}{{0, 1}, {1, 1}, {4, 4}, {256, 256}, {257, 1}, {-1, 1}} {
		if got := (&Config{GlobalShards: tc.shards}).ShardMap().N(); got != tc.want {
			t.Errorf("ShardMap of global_shards %d has %d shards, want %d", tc.shards, got, tc.want)
		}
	}
}

// TestParseTakesADocumentOfMaxConfigBytes: a document of exactly
// MaxConfigBytes is read (here it is not YAML), not refused for its size.
func TestParseTakesADocumentOfMaxConfigBytes(t *testing.T) {
	_, err := Parse(make([]byte, MaxConfigBytes))
	var le *LimitError
	if err == nil || errors.As(err, &le) || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Parse of %d NUL bytes: %v, want a YAML error", MaxConfigBytes, err)
	}
}

// TestParseDocumentsAroundTheTenantBlock: a document of only a tenants
// block is read (and found to lack the rest), not called empty; problems in
// the tenant block and in the rest are reported together, and a second
// tenants key is refused wherever it is; an empty block
// lists no tenants; an explicit zero max_share is caught in any form of
// zero.
func TestParseDocumentsAroundTheTenantBlock(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  []byte
		want []string
		not  []string
	}{
		{"only tenants", []byte("tenants:\n  acme: {tier: pro}\n"),
			[]string{"regions: at least one region is required", "tiers: at least one tier is required"}, []string{"empty"}},
		{"problems in and out of the block", sampleWith(t, "tenants:\n  acme: {tier: pro,", "epoc: 1s\ntenants:\n  acme: {tierr: pro,"),
			[]string{`unknown field "epoc" (line 17)`, `unknown field "tierr" (line 19)`}, nil},
		{"a problem after the block keeps its line", sampleWith(t, "default_tier: free", "default_tierr: free"),
			[]string{`unknown field "default_tierr" (line 19)`}, nil},
		{"a problem in the block only", sampleWith(t, "  acme: {tier: pro,", "  acme: {tierr: pro,"),
			[]string{`unknown field "tierr" (line 18)`}, nil},
		{"a second tenants block right after the first", sampleWith(t, "default_tier:", "tenants:\n  beta: {tier: free}\ndefault_tier:"),
			[]string{`mapping key "tenants" already defined`}, nil},
		{"a second tenants block further down", append(SampleYAML(), "tenants:\n  beta: {tier: free}\n"...),
			[]string{`mapping key "tenants" already defined`}, nil},
		{"explicit max_share 0 on the last region", sampleWith(t, "ap-south: {weight: 1}", "ap-south: {weight: 1, max_share: 0}"),
			[]string{"regions.ap-south.max_share: must be in (0, 1], got 0 at line 9"}, nil},
		{"explicit max_share 0.0", sampleWith(t, "eu-west:  {weight: 1}", "eu-west:  {weight: 1, max_share: 0.0}"),
			[]string{"regions.eu-west.max_share: must be in (0, 1], got 0 at line 8"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(tc.doc)
			if err == nil || c != nil || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Parse: %v, %v; want an invalid config", c, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(err.Error(), w) {
					t.Errorf("error says %q:\n%v", w, err)
				}
			}
		})
	}
	// A merge key among the tenants is read by the whole reader, merging.
	c, err := Parse(sampleWith(t, "  acme:", "  <<: {beta: {tier: free}}\n  acme:"))
	if err != nil || c.Tenants["beta"].Tier != "free" || c.Tenants["acme"].Tier != "pro" {
		t.Fatalf("tenants merged into the block: %v, %v", c, err)
	}
	c, err = Parse(sampleWith(t, "tenants:\n  acme: {tier: pro, overrides: {write: {rate: 800/s, burst: 1600}}}\n", "tenants:\n# none yet\n"))
	if err != nil || len(c.Tenants) != 0 {
		t.Fatalf("an empty tenant block: %v, %v", c, err)
	}
	c, err = Parse(sampleWith(t, "eu-west:  {weight: 1}", "eu-west:  {weight: 1, max_share: 1}"))
	if err != nil || c.Regions["eu-west"].MaxShare != 1 {
		t.Fatalf("an explicit max_share of 1: %v, %v", c, err)
	}
}

// TestParseNamesTheKindOfAMisplacedValue: a rate or duration written as a
// mapping or a sequence is refused naming what was found, at its line.
func TestParseNamesTheKindOfAMisplacedValue(t *testing.T) {
	for _, tc := range []struct {
		old, new, want string
	}{
		{"epoch: 1s", "epoch: {seconds: 1}", "a duration must be a scalar like 1s or 250ms, got a mapping (line 2)"},
		{"epoch: 1s", "epoch: [1s]", "a duration must be a scalar like 1s or 250ms, got a sequence (line 2)"},
		{"rate: 10/s", "rate: [10/s]", "a rate must be a scalar like 10/s, got a sequence (line 15)"},
	} {
		_, err := Parse(sampleWith(t, tc.old, tc.new))
		if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.new, err, tc.want)
		}
	}
}

// TestParseContextStopsWhenDone: a context already done stops Parse of a
// document without tenants too, with an error wrapping the context's.
func TestParseContextStopsWhenDone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	doc := sampleWith(t, "tenants:\n  acme: {tier: pro, overrides: {write: {rate: 800/s, burst: 1600}}}\n", "")
	if c, err := ParseContext(ctx, doc); !errors.Is(err, context.Canceled) || c != nil {
		t.Fatalf("ParseContext with a done context: %v, %v; want context.Canceled", c, err)
	}
	if _, err := ParseContext(context.Background(), doc); err != nil {
		t.Fatalf("the same document: %v", err)
	}
}

// TestTenantsWrittenEmpty: a tenant or its overrides left empty (null) in
// a block are read as empty, as the decoder reads them: the tenant then
// lacks its tier.
func TestTenantsWrittenEmpty(t *testing.T) {
	for _, block := range []string{"  beta:\n", "  beta: ~\n", "  beta: null\n"} {
		_, err := Parse(sampleWith(t, "  acme:", block+"  acme:"))
		if err == nil || !strings.Contains(err.Error(), "tenants.beta.tier: is required") || strings.Contains(err.Error(), "is not") {
			t.Errorf("%q: %v, want only its tier missing", block, err)
		}
	}
	c, err := Parse(sampleWith(t, "  acme:", "  beta:\n    tier: free\n    overrides:\n  acme:"))
	if err != nil || c.Tenants["beta"].Tier != "free" || len(c.Tenants["beta"].Overrides) != 0 {
		t.Fatalf("a tenant with empty overrides: %+v, %v", c.Tenants["beta"], err)
	}
}

// TestParseTenantForms: ParseTenant reads the stored JSON form, one
// override included, merges only on a plain << key, and refuses an empty
// tenant as empty.
func TestParseTenantForms(t *testing.T) {
	got, err := ParseTenant([]byte(`{"tier":"pro","overrides":{"write":{"rate":"800/s","burst":1600}}}`))
	want := Tenant{Tier: "pro", Overrides: map[string]LimitSpec{"write": {Rate: 800, Burst: 1600}}}
	if err != nil || !TenantEqual(got, want) {
		t.Errorf("one override: %+v, %v; want %+v", got, err, want)
	}
	for _, empty := range []string{"", "# nothing\n"} {
		if _, err := ParseTenant([]byte(empty)); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "the tenant is empty") {
			t.Errorf("ParseTenant(%q): %v, want the tenant is empty", empty, err)
		}
	}
	// Only a plain << merges; a quoted one is a key like any other.
	if got, err := ParseTenant([]byte(`{"<<": {tier: pro}}`)); err == nil || !strings.Contains(err.Error(), `unknown field "<<"`) {
		t.Errorf("a quoted << key: %+v, %v; want it refused as an unknown field", got, err)
	}
	if got, err := ParseTenant([]byte("{<<: {tier: pro}}")); err != nil || got.Tier != "pro" {
		t.Errorf("a merge key: %+v, %v", got, err)
	}
	if _, err := ParseTenant([]byte("{tier: [")); err == nil || strings.Contains(err.Error(), "empty") {
		t.Errorf("ParseTenant of bad YAML: %v, want a syntax error", err)
	}
}

// TestLimitsAreTheDocumented pins the maxima docs/operations.md gives
// ("Config limits"), in numbers rather than through the constants.
func TestLimitsAreTheDocumented(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want int64
	}{
		{"MaxConfigBytes (128 MiB)", MaxConfigBytes, 128 * 1024 * 1024},
		{"MaxTenants", MaxTenants, 2000000},
		{"MaxInlineTenants", MaxInlineTenants, 10000},
		{"MaxRegions", MaxRegions, 64},
		{"MaxClasses", MaxClasses, 256},
		{"MaxTiers", MaxTiers, 1024},
		{"MaxProblems", MaxProblems, 1000},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %d, want the documented %d", tc.name, tc.got, tc.want)
		}
	}
}

// TestLimitErrorNamesWhatWasFound: a limit's error names the count found
// when there is one, whatever it is, and only the limit when counting
// stopped at it (Got 0).
func TestLimitErrorNamesWhatWasFound(t *testing.T) {
	for _, tc := range []struct {
		e    LimitError
		want string
	}{
		{LimitError{Limit: "config.MaxTenants", Max: 2000000, Got: 2000001, What: "tenants"}, "config.MaxTenants: 2000001 tenants is more than the limit of 2000000"},
		{LimitError{Limit: "config.MaxRegions", Max: 0, Got: 1, What: "regions"}, "config.MaxRegions: 1 regions is more than the limit of 0"},
		{LimitError{Limit: "config.MaxTenants", Max: 2000000, What: "tenants"}, "config.MaxTenants: more than the limit of 2000000 tenants"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.e, got, tc.want)
		}
		if !errors.Is(&tc.e, ErrInvalidConfig) {
			t.Errorf("%+v does not wrap ErrInvalidConfig", tc.e)
		}
	}
}

// TestRefillTimeOfExactlyMaxFillIsAccepted: a limit whose burst takes
// exactly MaxFill to refill at the smallest region's static share is
// accepted; one float step slower is refused.
func TestRefillTimeOfExactlyMaxFillIsAccepted(t *testing.T) {
	c := Default()
	least := ""
	for name, r := range c.Regions {
		if least == "" || r.Weight < c.Regions[least].Weight {
			least = name
		}
	}
	fraction := c.Regions[least].Weight / c.weightSum() * staticShareScale
	const burst = 1e6
	rate := burst / (MaxFill.Seconds() * fraction)
	for range 64 {
		if burst/(rate*fraction) == MaxFill.Seconds() {
			break
		}
		rate = math.Nextafter(rate, math.Inf(1))
	}
	if burst/(rate*fraction) != MaxFill.Seconds() {
		t.Skip("no rate refills this burst in exactly MaxFill")
	}
	c.Tiers["free"]["write"] = LimitSpec{Rate: Rate(rate), Burst: burst}
	if got := problemList(c); len(got) != 0 {
		t.Fatalf("refill in exactly MaxFill: %v, want accepted", got)
	}
	c.Tiers["free"]["write"] = LimitSpec{Rate: Rate(math.Nextafter(rate, 0)), Burst: burst}
	if got := problemList(c); len(got) != 1 || !strings.Contains(got[0], "is too slow for burst") {
		t.Fatalf("refill a float step slower than MaxFill: %v, want refused as too slow", got)
	}
}
