package config

import (
	"bytes"
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// sampleWith returns the built-in sample with old replaced by new; old must
// occur in it, so a changed sample breaks the test loudly.
func sampleWith(t *testing.T, old, new string) []byte {
	t.Helper()
	sample := SampleYAML()
	if !bytes.Contains(sample, []byte(old)) {
		t.Fatalf("sample has no %q", old)
	}
	return bytes.Replace(sample, []byte(old), []byte(new), 1)
}

func TestSampleParsesToDesignValues(t *testing.T) {
	c, err := Parse(SampleYAML())
	if err != nil {
		t.Fatalf("sample: %v", err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Fatal("Default() differs from parsing the sample")
	}
	if c.Epoch != Duration(time.Second) || c.GrantValidity != Duration(5*time.Second) ||
		c.LeaseTTL != Duration(5*time.Second) || c.Refresh != Duration(time.Second) {
		t.Errorf("durations = %v %v %v %v", c.Epoch, c.GrantValidity, c.LeaseTTL, c.Refresh)
	}
	if got := c.Regions["us-east"]; got != (Region{Weight: 2, MaxShare: 1}) {
		t.Errorf("us-east = %+v", got)
	}
	if got := c.Classes["export"]; got != (Class{Mode: ModeStrict, OnFailure: OnFailureClosed, Reclaim: ReclaimReported}) {
		t.Errorf("export = %+v", got)
	}
	if got := c.Classes["read"]; got != (Class{Mode: ModeLease, OnFailure: OnFailureLocal, Reclaim: ReclaimReported}) {
		t.Errorf("read = %+v", got)
	}
	if got := c.Tiers["free"]["export"]; got != (LimitSpec{Rate: 0.1, Burst: 1}) {
		t.Errorf("free/export = %+v, want 6/m = 0.1/s burst 1", got)
	}
	if got := c.Tenants["acme"]; got.Tier != "pro" || got.Overrides["write"] != (LimitSpec{Rate: 800, Burst: 1600}) {
		t.Errorf("acme = %+v", got)
	}
	if c.DefaultTier != "free" {
		t.Errorf("default_tier = %q", c.DefaultTier)
	}
}

func TestDefaultReturnsIndependentCopies(t *testing.T) {
	a, b := Default(), Default()
	a.Tiers["free"]["read"] = LimitSpec{Rate: 1, Burst: 1}
	if b.Tiers["free"]["read"].Rate != 10 {
		t.Fatal("changing one Default() changed another")
	}
}

func TestDefaultsFillOmittedFields(t *testing.T) {
	c, err := Parse([]byte(`
epoch: 2s
regions: {r1: {weight: 1}}
classes: {c1: {}}
tiers: {t1: {c1: {rate: 1, burst: 1}}}
default_tier: t1
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.GrantValidity != Duration(10*time.Second) {
		t.Errorf("grant_validity = %v, want 5 × epoch = 10s", c.GrantValidity)
	}
	if c.LeaseTTL != Duration(DefaultLeaseTTL) || c.Refresh != Duration(DefaultRefresh) {
		t.Errorf("lease_ttl, refresh = %v, %v", c.LeaseTTL, c.Refresh)
	}
	if got := c.Regions["r1"]; got.MinShare != 0 || got.MaxShare != 1 {
		t.Errorf("region shares = %+v, want min 0 max 1", got)
	}
	if got := c.Classes["c1"]; got != (Class{Mode: ModeLease, OnFailure: OnFailureLocal, Reclaim: ReclaimReported}) {
		t.Errorf("class defaults = %+v", got)
	}
}

func TestRegionLeaseDefaults(t *testing.T) {
	base := `
regions: {r1: {weight: 1}}
classes: {c1: {}}
tiers: {t1: {c1: {rate: 1, burst: 1}}}
default_tier: t1
`
	for _, tc := range []struct {
		name, head string
		want       time.Duration
	}{
		{"left out", "", DefaultRegionLease},
		{"left out with a long grant validity", "grant_validity: 45s\n", 90 * time.Second},
		{"set", "region_lease: 10m\n", 10 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.head + base))
			if err != nil {
				t.Fatal(err)
			}
			if got := time.Duration(c.RegionLease); got != tc.want {
				t.Fatalf("region_lease = %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := Parse([]byte("region_lease: 5s\n" + base)); err == nil ||
		!strings.Contains(err.Error(), "region_lease: must be at least 2 × grant_validity (10s), got 5s") {
		t.Fatalf("region_lease below 2 × grant_validity: err = %v", err)
	}
}

func TestPartitionShareDefaultsByOnFailure(t *testing.T) {
	c, err := Parse([]byte(`
regions: {r1: {weight: 1}}
classes:
  open:   {on_failure: open}
  local:  {on_failure: local}
  closed: {on_failure: closed}
  half:   {on_failure: open, partition_share: 0.5}
  zero:   {on_failure: open, partition_share: 0}
tiers: {t1: {open: {rate: 1, burst: 1}, local: {rate: 1, burst: 1}, closed: {rate: 1, burst: 1}, half: {rate: 1, burst: 1}, zero: {rate: 1, burst: 1}}}
default_tier: t1
`))
	if err != nil {
		t.Fatal(err)
	}
	for class, want := range map[string]float64{"open": 1, "local": 0, "closed": 0, "half": 0.5, "zero": 0, "unknown": 0} {
		if got := c.PartitionShareOf(class); got != want {
			t.Errorf("PartitionShareOf(%q) = %v, want %v", class, got, want)
		}
	}
	// Left out stays left out: changing on_failure later changes the default.
	if c.Classes["open"].PartitionShare != nil {
		t.Errorf("a left-out partition_share was filled in: %v", *c.Classes["open"].PartitionShare)
	}
	out, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(out, []byte("partition_share: 0\n")) || bytes.Count(out, []byte("partition_share")) != 2 {
		t.Errorf("marshaled partition_share wrong (want exactly the two set ones):\n%s", out)
	}
}

func TestDrainedRegionStaticShareIsItsFloor(t *testing.T) {
	c, err := Parse(sampleWith(t, "eu-west:  {weight: 1}", "eu-west:  {weight: 1, drained: true}"))
	if err != nil {
		t.Fatal(err)
	}
	undrained := Default()
	for _, tc := range []struct {
		class     string
		share     float64
		onFailure OnFailure
	}{{"read", 0, OnFailureLocal}, {"half", 0.5, OnFailureOpen}, {"open", 1, OnFailureOpen}} {
		cl := Class{Mode: ModeLease, OnFailure: tc.onFailure, Reclaim: ReclaimReported, MaxCost: 2}
		if tc.class == "half" {
			cl.PartitionShare = ptr(0.5)
		}
		res := Resolved{Limit: quota.Limit{Rate: 400, Burst: 41}, Class: cl, ClassName: tc.class}
		full, fullBurst, err := undrained.StaticShareOf("eu-west", res)
		if err != nil {
			t.Fatal(err)
		}
		wantRate, wantBurst := hierarchy.Floor(full, fullBurst, tc.share, 2)
		rate, burst, err := c.StaticShareOf("eu-west", res)
		if err != nil {
			t.Fatal(err)
		}
		if rate != wantRate || burst != wantBurst {
			t.Errorf("%s: drained eu-west static share = %v, %v; want the floor %v, %v (of %v, %v)", tc.class, rate, burst, wantRate, wantBurst, full, fullBurst)
		}
		if fr, fb, _ := undrained.FloorOf("eu-west", res); fr != wantRate || fb != wantBurst {
			t.Errorf("%s: FloorOf = %v, %v; want %v, %v", tc.class, fr, fb, wantRate, wantBurst)
		}
		// The other regions' static shares do not change.
		for _, other := range []string{"us-east", "ap-south"} {
			r1, b1, _ := undrained.StaticShareOf(other, res)
			r2, b2, _ := c.StaticShareOf(other, res)
			if r1 != r2 || b1 != b2 {
				t.Errorf("%s: %s static share moved from %v, %v to %v, %v", tc.class, other, r1, b1, r2, b2)
			}
		}
	}
}

func TestMarshalParseRoundTrip(t *testing.T) {
	for _, name := range []string{"sample", "full.yaml"} {
		t.Run(name, func(t *testing.T) {
			src := SampleYAML()
			if name != "sample" {
				src = readTestdata(t, name)
			}
			c, err := Parse(src)
			if err != nil {
				t.Fatal(err)
			}
			out, err := c.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse(out)
			if err != nil {
				t.Fatalf("marshaled config does not parse: %v\n%s", err, out)
			}
			if !reflect.DeepEqual(c, back) {
				t.Fatalf("round trip changed the config:\n%s", Diff(c, back))
			}
			again, err := back.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, again) {
				t.Fatalf("Marshal is not stable:\n%s\n---\n%s", out, again)
			}
		})
	}
}

func TestMarshalWritesRatesInShortestForm(t *testing.T) {
	c, err := Parse(readTestdata(t, "full.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rate: 10/s", "rate: 2.5/s", "rate: 6/m", "rate: 1000/h", "max_share: 0.8", "min_share: 0.2"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// eu-west has max_share 1 by default: written as nothing, not "max_share: 1".
	if bytes.Contains(out, []byte("max_share: 1\n")) {
		t.Errorf("output spells out the default max_share:\n%s", out)
	}
}

// TestValidateRules breaks one rule per case, starting from the valid
// sample, and checks the message names the field.
func TestValidateRules(t *testing.T) {
	long := strings.Repeat("c", 65)
	cases := []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"epoch zero", func(c *Config) { c.Epoch = 0 }, "epoch: must be > 0, got 0s"},
		{"epoch below 10ms", func(c *Config) { c.Epoch = Duration(5 * time.Millisecond) }, "epoch: must be at least 10ms, got 5ms"},
		{"grant validity below 2 epochs", func(c *Config) { c.GrantValidity = Duration(1500 * time.Millisecond) },
			"grant_validity: must be at least 4 × epoch (4s), got 1.5s"},
		{"grant validity zero", func(c *Config) { c.GrantValidity = 0 }, "grant_validity: must be > 0"},
		{"lease ttl negative", func(c *Config) { c.LeaseTTL = Duration(-time.Second) }, "lease_ttl: must be > 0, got -1s"},
		{"refresh not below half the ttl", func(c *Config) { c.Refresh = Duration(2500 * time.Millisecond) },
			"refresh: must be less than lease_ttl / 2 (2.5s), got 2.5s"},
		{"refresh zero", func(c *Config) { c.Refresh = 0 }, "refresh: must be > 0"},
		{"no regions", func(c *Config) { c.Regions = nil }, "regions: at least one region is required"},
		{"region weight zero", func(c *Config) { setRegion(c, "eu-west", Region{Weight: 0, MaxShare: 1}) },
			"regions.eu-west.weight: must be a finite number > 0, got 0"},
		{"region weight NaN", func(c *Config) { setRegion(c, "eu-west", Region{Weight: math.NaN(), MaxShare: 1}) },
			"regions.eu-west.weight: must be a finite number > 0, got NaN"},
		{"region weight infinite", func(c *Config) { setRegion(c, "eu-west", Region{Weight: math.Inf(1), MaxShare: 1}) },
			"regions.eu-west.weight: must be a finite number > 0, got +Inf"},
		{"min share above 1", func(c *Config) { setRegion(c, "eu-west", Region{Weight: 1, MinShare: 1.5, MaxShare: 1}) },
			"regions.eu-west.min_share: must be in [0, 1], got 1.5"},
		{"min share negative", func(c *Config) { setRegion(c, "eu-west", Region{Weight: 1, MinShare: -0.1, MaxShare: 1}) },
			"regions.eu-west.min_share: must be in [0, 1], got -0.1"},
		{"max share above 1", func(c *Config) { setRegion(c, "eu-west", Region{Weight: 1, MaxShare: 2}) },
			"regions.eu-west.max_share: must be in (0, 1], got 2"},
		{"min share above max share", func(c *Config) { setRegion(c, "eu-west", Region{Weight: 1, MinShare: 0.4, MaxShare: 0.3}) },
			"regions.eu-west.min_share: must not exceed max_share (0.3), got 0.4"},
		{"min shares sum above 1", func(c *Config) {
			setRegion(c, "us-east", Region{Weight: 2, MinShare: 0.5, MaxShare: 1})
			setRegion(c, "eu-west", Region{Weight: 1, MinShare: 0.3, MaxShare: 1})
			setRegion(c, "ap-south", Region{Weight: 1, MinShare: 0.3, MaxShare: 1})
		}, "regions: min_share of all regions sums to 1.1, must be at most 1"},
		{"region name with a space", func(c *Config) { setRegion(c, "us east", Region{Weight: 1, MaxShare: 1}) },
			`regions.us east: region name "us east" has byte ' ' at offset 2`},
		{"no classes", func(c *Config) { c.Classes = nil }, "classes: at least one class is required"},
		{"bad mode", func(c *Config) {
			setClass(c, "export", Class{Mode: "strikt", OnFailure: OnFailureClosed, Reclaim: ReclaimNone})
		},
			`classes.export.mode: must be lease or strict, got "strikt"`},
		{"bad on_failure", func(c *Config) {
			setClass(c, "export", Class{Mode: ModeStrict, OnFailure: "retry", Reclaim: ReclaimNone})
		},
			`classes.export.on_failure: must be local, open or closed, got "retry"`},
		{"bad reclaim", func(c *Config) {
			setClass(c, "export", Class{Mode: ModeStrict, OnFailure: OnFailureOpen, Reclaim: "some"})
		},
			`classes.export.reclaim: must be reported or none, got "some"`},
		{"class name too long", func(c *Config) {
			setClass(c, long, Class{Mode: ModeLease, OnFailure: OnFailureLocal, Reclaim: ReclaimNone})
		}, "classes." + long + ": class is 65 bytes long, the limit is 64"},
		{"no tiers", func(c *Config) { c.Tiers = nil }, "tiers: at least one tier is required"},
		{"tier misses a class", func(c *Config) { delete(c.Tiers["pro"], "export") },
			"tiers.pro.export: missing: every tier needs a limit for every class"},
		{"tier names an unknown class", func(c *Config) { c.Tiers["free"]["bogus"] = LimitSpec{Rate: 1, Burst: 1} },
			`tiers.free.bogus: class "bogus" is not configured under classes`},
		{"rate zero", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: 0, Burst: 5} },
			`tiers.free.write.rate: must be > 0, got "0/s"`},
		{"rate negative", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: -1, Burst: 5} },
			`tiers.free.write.rate: must be > 0, got "-1/s"`},
		{"rate infinite", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: Rate(math.Inf(1)), Burst: 5} },
			`tiers.free.write.rate: must be > 0, got "+Inf/s"`},
		{"burst zero", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: 1, Burst: 0} },
			"tiers.free.write.burst: must be a whole number of tokens in [1, 1000000000], got 0"},
		{"burst fractional", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: 1, Burst: 2.5} },
			"tiers.free.write.burst: must be a whole number of tokens in [1, 1000000000], got 2.5"},
		{"burst too large", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: 1, Burst: 1 << 54} },
			"tiers.free.write.burst: must be a whole number of tokens in [1, 1000000000], got 1.8014398509481984e+16"},
		{"burst of 2^53 (a key TTL beyond PEXPIRE)", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: 1, Burst: 1 << 53} },
			"tiers.free.write.burst: must be a whole number of tokens in [1, 1000000000], got 9.007199254740992e+15"},
		{"rate too large", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: 2e9, Burst: 5} },
			`tiers.free.write.rate: must be at most 1000000000/s, got "2000000000/s"`},
		{"rate too slow for its burst", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: 1, Burst: 1e9} },
			`tiers.free.write.rate: "1/s" is too slow for burst 1e+09: region ap-south (weight 1 of 4) would take 4e+09 s to refill it at its static share, more than 87600h0m0s`},
		{"override too slow for its burst", func(c *Config) {
			c.Tenants["acme"].Overrides["write"] = LimitSpec{Rate: 1e-6, Burst: 100}
		}, `tenants.acme.overrides.write.rate: "0.0036/h" is too slow for burst 100`},
		{"lease ttl above a day", func(c *Config) { c.LeaseTTL = Duration(25 * time.Hour); c.Refresh = Duration(time.Hour) },
			"lease_ttl: must be at most 24h0m0s, got 25h0m0s"},
		{"tier name with a brace", func(c *Config) { c.Tiers["{x}"] = c.Tiers["pro"] },
			`tiers.{x}: tier name "{x}" has byte '{' at offset 0`},
		{"default tier missing", func(c *Config) { c.DefaultTier = "" }, "default_tier: is required"},
		{"default tier unknown", func(c *Config) { c.DefaultTier = "gold" }, `default_tier: tier "gold" is not configured under tiers`},
		{"tenant id with a pipe", func(c *Config) { c.Tenants["a|b"] = Tenant{Tier: "free"} },
			`tenants.a|b: tenant id "a|b" has byte '|' at offset 1`},
		{"tenant without tier", func(c *Config) { c.Tenants["beta"] = Tenant{} }, "tenants.beta.tier: is required"},
		{"tenant tier unknown", func(c *Config) { c.Tenants["beta"] = Tenant{Tier: "gold"} },
			`tenants.beta.tier: tier "gold" is not configured under tiers`},
		{"override of an unknown class", func(c *Config) {
			c.Tenants["acme"].Overrides["bogus"] = LimitSpec{Rate: 1, Burst: 1}
		}, `tenants.acme.overrides.bogus: class "bogus" is not configured under classes`},
		{"override with a bad rate", func(c *Config) {
			c.Tenants["acme"].Overrides["write"] = LimitSpec{Rate: 0, Burst: 1}
		}, `tenants.acme.overrides.write.rate: must be > 0, got "0/s"`},
		{"envoy domain missing", func(c *Config) { c.Envoy.Descriptors[0].Domain = "" },
			"envoy.descriptors[0].domain: is required"},
		{"envoy tenant key missing", func(c *Config) { c.Envoy.Descriptors[0].TenantKey = "" },
			"envoy.descriptors[0].tenant_key: is required"},
		{"envoy key with a space", func(c *Config) { c.Envoy.Descriptors[0].TenantKey = "ten ant" },
			`envoy.descriptors[0].tenant_key: "ten ant" has a space or control character at offset 3`},
		{"envoy class neither keyed nor fixed", func(c *Config) { c.Envoy.Descriptors[0].ClassKey = "" },
			"envoy.descriptors[0]: set class_key (the entry naming the class) or class (a fixed class)"},
		{"envoy class both keyed and fixed", func(c *Config) { c.Envoy.Descriptors[0].Class = "read" },
			`envoy.descriptors[0]: set only one of class_key ("class") and class ("read")`},
		{"envoy fixed class unknown", func(c *Config) {
			c.Envoy.Descriptors[0] = EnvoyDescriptor{Domain: "d", TenantKey: "t", Class: "bogus"}
		}, `envoy.descriptors[0].class: class "bogus" is not configured under classes`},
		{"envoy class key equals tenant key", func(c *Config) { c.Envoy.Descriptors[0].ClassKey = "tenant" },
			`envoy.descriptors[0].class_key: must differ from tenant_key "tenant"`},
		{"region lease below two grant validities", func(c *Config) { c.RegionLease = Duration(9 * time.Second) },
			"region_lease: must be at least 2 × grant_validity (10s), got 9s"},
		{"region lease zero", func(c *Config) { c.RegionLease = 0 }, "region_lease: must be > 0, got 0s"},
		{"region lease negative", func(c *Config) { c.RegionLease = Duration(-time.Minute) }, "region_lease: must be > 0, got -1m0s"},
		{"region lease above two days", func(c *Config) { c.RegionLease = Duration(49 * time.Hour) },
			"region_lease: must be at most 48h0m0s, got 49h0m0s"},
		{"global shards above the bound", func(c *Config) { c.GlobalShards = 257 }, "global_shards: must be in 1..256, got 257"},
		{"global shards negative", func(c *Config) { c.GlobalShards = -1 }, "global_shards: must be in 1..256, got -1"},
		{"partition share above 1", func(c *Config) {
			setClass(c, "export", Class{Mode: ModeStrict, OnFailure: OnFailureClosed, Reclaim: ReclaimNone, PartitionShare: ptr(1.5)})
		}, "classes.export.partition_share: must be in [0, 1] (a fraction of the static share), got 1.5"},
		{"partition share negative", func(c *Config) {
			setClass(c, "export", Class{Mode: ModeStrict, OnFailure: OnFailureClosed, Reclaim: ReclaimNone, PartitionShare: ptr(-0.1)})
		}, "classes.export.partition_share: must be in [0, 1] (a fraction of the static share), got -0.1"},
		{"partition share NaN", func(c *Config) {
			setClass(c, "export", Class{Mode: ModeStrict, OnFailure: OnFailureClosed, Reclaim: ReclaimNone, PartitionShare: ptr(math.NaN())})
		}, "classes.export.partition_share: must be in [0, 1] (a fraction of the static share), got NaN"},
		{"every region drained", func(c *Config) {
			for name, r := range c.Regions {
				r.Drained = true
				c.Regions[name] = r
			}
		}, "regions: every region is drained: at least one must serve"},
		{"envoy duplicate descriptor", func(c *Config) {
			c.Envoy.Descriptors = append(c.Envoy.Descriptors, c.Envoy.Descriptors[0])
		}, "envoy.descriptors[1]: duplicates envoy.descriptors[0]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mutate(c)
			err := c.Validate()
			if err == nil {
				t.Fatalf("Validate accepted a config breaking %q", tc.name)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error does not wrap ErrInvalidConfig: %v", err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Errorf("error holds no *FieldError: %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error lacks %q:\n%v", tc.want, err)
			}
		})
	}
}

func setRegion(c *Config, name string, r Region) { c.Regions[name] = r }

func ptr[T any](v T) *T { return &v }

// setClass adds or replaces a class and gives every tier a limit for it,
// so the class is the only thing wrong.
func setClass(c *Config, name string, cl Class) {
	c.Classes[name] = cl
	for _, tier := range c.Tiers {
		if _, ok := tier[name]; !ok {
			tier[name] = LimitSpec{Rate: 1, Burst: 1}
		}
	}
}

func TestValidateAcceptsTheSampleAndChangesNothing(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Tiers["free"]["read"] = LimitSpec{Rate: 0, Burst: 0}
	before, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if c.Validate() == nil {
		t.Fatal("Validate accepted rate 0")
	}
	after, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatal("Validate changed the config")
	}
}

func TestParseReportsEveryProblemAtOnce(t *testing.T) {
	_, err := Parse(readTestdata(t, "many_errors.yaml"))
	if err == nil {
		t.Fatal("Parse accepted many_errors.yaml")
	}
	want := []string{
		"epoch: must be at least 10ms, got 5ms",
		"grant_validity: must be at least 4 × epoch (20ms), got 8ms",
		"refresh: must be less than lease_ttl / 2 (1s), got 1s",
		"regions.us-east.weight: must be a finite number > 0, got 0",
		"regions.eu-west.min_share: must not exceed max_share (0.5), got 0.6",
		"regions: min_share of all regions sums to 1.3",
		`classes.read.mode: must be lease or strict, got "fast"`,
		`classes.write.on_failure: must be local, open or closed, got "maybe"`,
		`classes.write.reclaim: must be reported or none, got "all"`,
		"tiers.free.write: missing",
		`tiers.free.bogus: class "bogus" is not configured`,
		`tiers.free.read.rate: must be > 0, got "0/s"`,
		"tiers.free.read.burst: must be a whole number",
		`default_tier: tier "platinum" is not configured`,
		`tenants.acme.tier: tier "gold" is not configured`,
		`tenants.acme.overrides.export: class "export" is not configured`,
		"envoy.descriptors[0].domain: is required",
		"envoy.descriptors[0]: set class_key",
	}
	msg := err.Error()
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error lacks %q", w)
		}
	}
	if got := strings.Count(msg, "\n") + 1; got != len(want) {
		t.Errorf("error has %d lines, want %d:\n%s", got, len(want), msg)
	}
}

// TestParseRejectsBadDocuments covers what only the YAML form can get
// wrong: syntax, unknown fields, value forms, explicit zeros.
func TestParseRejectsBadDocuments(t *testing.T) {
	cases := []struct {
		name string
		doc  []byte
		want []string
	}{
		{"unknown top-level field", sampleWith(t, "epoch: 1s", "epoc: 1s"), []string{`unknown field "epoc" (line 2)`}},
		{"unknown class field", sampleWith(t, "read:   {mode: lease,", "read:   {mod: lease,"), []string{`unknown field "mod" (line 11)`}},
		{"unknown region field", sampleWith(t, "us-east:  {weight: 2}", "us-east:  {wieght: 2}"), []string{`unknown field "wieght" (line 7)`}},
		{"rate with an unknown unit", sampleWith(t, "rate: 10/s", "rate: 10/x"), []string{`rate "10/x" has unit "x"`, "(line 15)"}},
		{"rate that is not a number", sampleWith(t, "rate: 10/s", "rate: abc"), []string{`rate "abc" is not a number`, "(line 15)"}},
		{"rate negative", sampleWith(t, "rate: 10/s", "rate: -1/s"), []string{`tiers.free.read.rate: must be > 0, got "-1/s"`}},
		{"rate zero", sampleWith(t, "rate: 10/s", "rate: 0/s"), []string{`tiers.free.read.rate: must be > 0, got "0/s"`}},
		{"rate as a mapping", sampleWith(t, "rate: 10/s", "rate: {per: s}"), []string{"a rate must be a scalar like 10/s, got a mapping (line 15)"}},
		{"duration zero", sampleWith(t, "epoch: 1s", "epoch: 0s"), []string{`duration "0s" must be positive`, "(line 2)"}},
		{"duration negative", sampleWith(t, "lease_ttl: 5s", "lease_ttl: -5s"), []string{`duration "-5s" must be positive`, "(line 4)"}},
		{"duration without unit", sampleWith(t, "refresh: 1s", "refresh: 1"), []string{`duration "1": want a number with a unit`, "(line 5)"}},
		{"duration out of range", sampleWith(t, "refresh: 1s", "refresh: 9999999999h"), []string{`duration "9999999999h" is out of range (at most 2562047h47m16.854775807s)`, "(line 5)"}},
		{"duration at the edge of the range", sampleWith(t, "refresh: 1s", "refresh: 2562048h"), []string{`duration "2562048h" is out of range`, "(line 5)"}},
		{"duration with a bad unit", sampleWith(t, "refresh: 1s", "refresh: 5sec"), []string{`duration "5sec": want a number with a unit`, "(line 5)"}},
		{"explicit zero max share", sampleWith(t, "eu-west:  {weight: 1}", "eu-west:  {weight: 1, max_share: 0}"),
			[]string{"regions.eu-west.max_share: must be in (0, 1], got 0 at line 8"}},
		{"explicit zero demand_alpha", sampleWith(t, "epoch: 1s", "epoch: 1s\ndemand_alpha: 0"),
			[]string{"demand_alpha: must be in (0, 1], got 0 at line 3"}},
		{"explicit zero global_shards", sampleWith(t, "epoch: 1s", "epoch: 1s\nglobal_shards: 0"),
			[]string{"global_shards: must be in 1..256, got 0 at line 3"}},
		{"fractional global_shards", sampleWith(t, "epoch: 1s", "epoch: 1s\nglobal_shards: 1.5"),
			[]string{"global_shards: must be a whole number in 1..256, got 1.5 at line 3"}},
		{"fractional global_shards below 1", sampleWith(t, "epoch: 1s", "epoch: 1s\nglobal_shards: 0.5"),
			[]string{"global_shards: must be a whole number in 1..256, got 0.5 at line 3"}},
		{"explicit zero max_cost", sampleWith(t, "read:   {mode: lease,", "read:   {max_cost: 0, mode: lease,"),
			[]string{"classes.read.max_cost: must be in 1..1048576, got 0 at line 11"}},
		{"fractional max_cost", sampleWith(t, "read:   {mode: lease,", "read:   {max_cost: 5.99, mode: lease,"),
			[]string{"classes.read.max_cost: must be a whole number in 1..1048576, got 5.99 at line 11"}},
		{"weight not a number", sampleWith(t, "us-east:  {weight: 2}", "us-east:  {weight: heavy}"),
			[]string{`"heavy" is not a number (line 7)`}},
		{"duplicate key", sampleWith(t, "ap-south: {weight: 1}", "us-east: {weight: 1}"), []string{`mapping key "us-east" already defined`}},
		{"syntax error", []byte("regions: [\n"), []string{"did not find expected node content (line 1)"}},
		{"a scalar for the document", []byte("00"), []string{`"00" is not a mapping (line 1)`}},
		{"a scalar over several lines for the document", []byte("00\n\n0"), []string{`"00\n0" is not a mapping (line 1)`}},
		{"a weight over several lines", sampleWith(t, "us-east:  {weight: 2}", "us-east:  {weight: \"heavy\n\n  load\"}"),
			[]string{`"heavy\nload" is not a number (line 7)`}},
		{"two documents", append(SampleYAML(), []byte("---\nepoch: 2s\n")...), []string{"want exactly one YAML document"}},
		{"empty document", []byte("# nothing\n"), []string{"the document is empty"}},
		{"several problems at once", sampleWith(t, "epoch: 1s", "epoch: 0s\nbogus: 1"),
			[]string{`duration "0s" must be positive`, `unknown field "bogus" (line 3)`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(tc.doc)
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", c)
			}
			if c != nil {
				t.Error("Parse returned a config along with an error")
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error does not wrap ErrInvalidConfig: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			// The person editing the file never sees the decoder's Go
			// words: type names, YAML tags, its package prefix.
			for _, leak := range []string{"config.", "float64", "not found in type", "!!", "yaml:", "unmarshal"} {
				if strings.Contains(err.Error(), leak) {
					t.Errorf("error leaks %q:\n%v", leak, err)
				}
			}
		})
	}
}

// TestParseKeepsWrittenNumbersAndDefaultsAbsentOnes: demand_alpha,
// global_shards and max_cost keep what is written (a whole number may be
// written 2.0) and take their default 1 only when left out.
func TestParseKeepsWrittenNumbersAndDefaultsAbsentOnes(t *testing.T) {
	c, err := Parse(sampleWith(t, "epoch: 1s", "epoch: 1s\ndemand_alpha: 0.5\nglobal_shards: 2.0"))
	if err != nil {
		t.Fatal(err)
	}
	if c.DemandAlpha != 0.5 || c.GlobalShards != 2 {
		t.Errorf("demand_alpha %v, global_shards %d; want 0.5 and 2", c.DemandAlpha, c.GlobalShards)
	}
	c, err = Parse(sampleWith(t, "read:   {mode: lease,", "read:   {max_cost: 5, mode: lease,"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Classes["read"].MaxCost; got != 5 {
		t.Errorf("max_cost %d, want 5", got)
	}
	c = Default()
	if c.DemandAlpha != 1 || c.ShardMap().N() != 1 || c.Classes["read"].Unit() != 1 {
		t.Errorf("left out: demand_alpha %v, shards %d, read's unit %v; want 1, 1, 1", c.DemandAlpha, c.ShardMap().N(), c.Classes["read"].Unit())
	}
}

func TestParseAcceptsRateForms(t *testing.T) {
	cases := []struct {
		yaml string
		want Rate
	}{
		{"10/s", 10}, {"6/m", 0.1}, {"1000/h", 1000.0 / 3600}, {"0.5/s", 0.5}, {"2.5/s", 2.5},
		{"7", 7}, {"2.5", 2.5}, {`"7"`, 7}, {"1e3/h", 1000.0 / 3600},
	}
	for _, tc := range cases {
		t.Run(tc.yaml, func(t *testing.T) {
			c, err := Parse(sampleWith(t, "rate: 10/s", "rate: "+tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Tiers["free"]["read"].Rate; got != tc.want {
				t.Fatalf("rate = %v, want %v", float64(got), float64(tc.want))
			}
		})
	}
}

// TestValidateAcceptsEveryBound sets one field to exactly a bound the
// rules allow, starting from the valid sample: every bound is inclusive
// where the message says "at least", "at most" or "in [...]", and the
// cross-field rules accept their edge (grant_validity = 4 × epoch,
// region_lease = 2 × grant_validity, min_share = max_share, min shares
// summing to 1, burst = max_cost, one region left serving).
func TestValidateAcceptsEveryBound(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(c *Config)
	}{
		{"epoch of MinEpoch", func(c *Config) { c.Epoch = Duration(MinEpoch) }},
		{"grant validity of 4 epochs", func(c *Config) { c.GrantValidity = Duration(4 * time.Second) }},
		{"refresh just below half the ttl", func(c *Config) { c.Refresh = Duration(2500*time.Millisecond - 1) }},
		{"region lease of 2 grant validities", func(c *Config) { c.RegionLease = Duration(10 * time.Second) }},
		{"region lease of MaxRegionLease", func(c *Config) { c.RegionLease = Duration(MaxRegionLease) }},
		{"intervals of MaxInterval", func(c *Config) {
			c.GrantValidity, c.LeaseTTL, c.RegionLease = Duration(MaxInterval), Duration(MaxInterval), Duration(MaxRegionLease)
		}},
		{"one global shard", func(c *Config) { c.GlobalShards = 1 }},
		{"the most global shards", func(c *Config) { c.GlobalShards = 256 }},
		{"demand alpha 1", func(c *Config) { c.DemandAlpha = 1 }},
		{"demand alpha small", func(c *Config) { c.DemandAlpha = 1e-9 }},
		{"min share 1, the others 0", func(c *Config) { setRegion(c, "eu-west", Region{Weight: 1, MinShare: 1, MaxShare: 1}) }},
		{"min share equal to max share", func(c *Config) { setRegion(c, "eu-west", Region{Weight: 1, MinShare: 0.3, MaxShare: 0.3}) }},
		{"min shares summing to 1 in float", func(c *Config) {
			setRegion(c, "us-east", Region{Weight: 2, MinShare: 0.7, MaxShare: 1})
			setRegion(c, "eu-west", Region{Weight: 1, MinShare: 0.2, MaxShare: 1})
			setRegion(c, "ap-south", Region{Weight: 1, MinShare: 0.1, MaxShare: 1})
		}},
		{"all regions but one drained", func(c *Config) {
			for _, name := range []string{"eu-west", "ap-south"} {
				r := c.Regions[name]
				r.Drained = true
				c.Regions[name] = r
			}
		}},
		{"partition share 1", func(c *Config) {
			setClass(c, "export", Class{Mode: ModeStrict, OnFailure: OnFailureClosed, Reclaim: ReclaimNone, PartitionShare: ptr(1.0)})
		}},
		{"max_cost of quota.MaxCost, burst equal to it", func(c *Config) {
			c.Classes["bulk"] = Class{Mode: ModeLease, OnFailure: OnFailureLocal, Reclaim: ReclaimNone, MaxCost: quota.MaxCost}
			for _, tier := range c.Tiers {
				tier["bulk"] = LimitSpec{Rate: 1e6, Burst: quota.MaxCost}
			}
		}},
		{"rate and burst at their maxima", func(c *Config) { c.Tiers["free"]["write"] = LimitSpec{Rate: MaxRate, Burst: MaxBurst} }},
		{"envoy mapping with a fixed class and printable keys", func(c *Config) {
			c.Envoy.Descriptors = append(c.Envoy.Descriptors, EnvoyDescriptor{Domain: "edge~1", TenantKey: "!customer~", Class: "read"})
		}},
	}
	for _, tc := range cases {
		c := Default()
		tc.mutate(c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s: refused: %v", tc.name, err)
		}
	}
}

// TestValidateRefusesPastEveryBound: one step past the bounds that
// TestValidateRules does not reach is refused, naming the field.
func TestValidateRefusesPastEveryBound(t *testing.T) {
	bulk := func(maxCost int64, burst float64) func(c *Config) {
		return func(c *Config) {
			c.Classes["bulk"] = Class{Mode: ModeLease, OnFailure: OnFailureLocal, Reclaim: ReclaimNone, MaxCost: maxCost}
			for _, tier := range c.Tiers {
				tier["bulk"] = LimitSpec{Rate: 1e6, Burst: burst}
			}
		}
	}
	cases := []struct {
		name   string
		mutate func(c *Config)
		want   string
	}{
		{"demand alpha above 1", func(c *Config) { c.DemandAlpha = 1.5 }, "demand_alpha: must be in (0, 1], got 1.5"},
		{"demand alpha negative", func(c *Config) { c.DemandAlpha = -0.5 }, "demand_alpha: must be in (0, 1], got -0.5"},
		{"max share 0", func(c *Config) { setRegion(c, "eu-west", Region{Weight: 1, MaxShare: 0}) },
			"regions.eu-west.max_share: must be in (0, 1], got 0"},
		{"max_cost above quota.MaxCost", bulk(quota.MaxCost+1, quota.MaxCost+1), "classes.bulk.max_cost: must be in 1..1048576"},
		{"max_cost negative", bulk(-1, 5), "classes.bulk.max_cost: must be in 1..1048576 (left out means 1), got -1"},
		{"burst one below max_cost", bulk(10, 9), "tiers.free.bulk.burst: 9 is below the class's max_cost 10"},
		{"grant validity just below 4 epochs", func(c *Config) { c.GrantValidity = Duration(4*time.Second - 1) },
			"grant_validity: must be at least 4 × epoch"},
		{"region lease just below 2 grant validities", func(c *Config) { c.RegionLease = Duration(10*time.Second - 1) },
			"region_lease: must be at least 2 × grant_validity"},
		{"envoy key with DEL", func(c *Config) { c.Envoy.Descriptors[0].TenantKey = "ten\x7fant" },
			`envoy.descriptors[0].tenant_key: "ten\x7fant" has a space or control character at offset 3`},
		{"epoch just below MinEpoch", func(c *Config) { c.Epoch = Duration(MinEpoch - 1) }, "epoch: must be at least 10ms"},
		{"rate just above MaxRate", func(c *Config) { c.Tiers["pro"]["read"] = LimitSpec{Rate: MaxRate * (1 + 1e-12), Burst: 4000} },
			"tiers.pro.read.rate: must be at most"},
		{"burst just above MaxBurst", func(c *Config) { c.Tiers["pro"]["read"] = LimitSpec{Rate: MaxRate, Burst: MaxBurst + 1} },
			"tiers.pro.read.burst: must be a whole number"},
		{"min shares summing just above 1", func(c *Config) {
			setRegion(c, "us-east", Region{Weight: 2, MinShare: 0.5, MaxShare: 1})
			setRegion(c, "eu-west", Region{Weight: 1, MinShare: 0.5 + 1e-6, MaxShare: 1})
		}, "regions: min_share of all regions sums to"},
	}
	for _, tc := range cases {
		c := Default()
		tc.mutate(c)
		if err := c.Validate(); err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
}
