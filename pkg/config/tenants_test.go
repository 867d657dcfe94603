package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// manyTenants is the sample with n tenants in block style: every third
// with an override in block form, the others on one line each.
func manyTenants(tb testing.TB, n int) []byte {
	tb.Helper()
	sample := string(SampleYAML())
	i := strings.Index(sample, "tenants:\n")
	j := strings.Index(sample, "default_tier:")
	var b strings.Builder
	b.WriteString(sample[:i])
	b.WriteString("tenants:\n")
	for k := range n {
		if k%3 == 0 {
			fmt.Fprintf(&b, "  t%07d:\n    tier: pro\n    # a comment\n    overrides:\n      write: {rate: 800/s, burst: 1600}\n", k)
		} else {
			fmt.Fprintf(&b, "  t%07d: {tier: free}\n", k)
		}
	}
	b.WriteString(sample[j:])
	return []byte(b.String())
}

func TestParseReadsManyTenantsInBatches(t *testing.T) {
	const n = 3*tenantBatch + 7
	c, err := Parse(manyTenants(t, n))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Tenants) != n {
		t.Fatalf("parsed %d tenants, want %d", len(c.Tenants), n)
	}
	if got := c.Tenants["t0000003"]; got.Tier != "pro" || got.Overrides["write"] != (LimitSpec{Rate: 800, Burst: 1600}) {
		t.Fatalf("t0000003 = %+v", got)
	}
	if got := c.Tenants[fmt.Sprintf("t%07d", n-2)]; got.Tier != "free" {
		t.Fatalf("last tenant = %+v", got)
	}
	// What Marshal writes, Parse reads back the same.
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if d := diffLines(c, again); d != "" {
		t.Fatalf("round trip changed the config:\n%s", d)
	}
}

// TestParseReportsTenantProblemsWithTheirLines checks the batched reader
// is as strict as the decoder and names lines of the whole document, far
// past the first batch.
func TestParseReportsTenantProblemsWithTheirLines(t *testing.T) {
	doc := manyTenants(t, 2*tenantBatch)
	lines := strings.Split(string(doc), "\n")
	find := func(prefix string) int {
		for i, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return i + 1
			}
		}
		t.Fatalf("no line %q", prefix)
		return 0
	}
	late := find("  t0000901:")
	lines[late-1] = "  t0000901: {tier: free, shadwo: true}"
	dup := find("  t0000902:")
	lines[dup-1] = "  t0000004: {tier: free}"
	rate := find("  t0000903:") + 4 // the override's line
	lines[rate-1] = "      write: {rate: fast, burst: 1600}"
	_, err := Parse([]byte(strings.Join(lines, "\n")))
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Parse: %v, want an invalid config", err)
	}
	for _, want := range []string{
		fmt.Sprintf(`unknown field "shadwo" (line %d)`, late),
		fmt.Sprintf(`mapping key "t0000004" already defined at line %d (line %d)`, find("  t0000004:"), dup),
		fmt.Sprintf(`rate "fast" is not a number optionally followed by`),
		fmt.Sprintf("(line %d)", rate),
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func TestParseReadsTenantsInOtherForms(t *testing.T) {
	cases := map[string]string{
		"flow":     "tenants: {acme: {tier: pro}, beta: {tier: free, shadow: true}}\n",
		"anchors":  "tenants:\n  acme: &t {tier: pro}\n  beta: *t\n",
		"merge":    "tenants:\n  acme: &t {tier: pro, shadow: true}\n  beta: {<<: *t, shadow: false}\n",
		"comments": "tenants:\n# first\n  acme:   # pro\n    tier: pro\n\n  beta: {tier: pro}\n",
	}
	for name, tenants := range cases {
		t.Run(name, func(t *testing.T) {
			doc := sampleWith(t, "tenants:\n  acme: {tier: pro, overrides: {write: {rate: 800/s, burst: 1600}}}\n", tenants)
			c, err := Parse(doc)
			if err != nil {
				t.Fatal(err)
			}
			if c.Tenants["acme"].Tier != "pro" || c.Tenants["beta"].Tier == "" {
				t.Fatalf("tenants = %+v", c.Tenants)
			}
			if name == "merge" && (c.Tenants["beta"].Shadow || c.Tenants["beta"].Tier != "pro") {
				t.Fatalf("merged tenant = %+v", c.Tenants["beta"])
			}
		})
	}
}

func TestParseRefusesWhatExceedsTheLimitsNamingThem(t *testing.T) {
	big := make([]byte, MaxConfigBytes+1)
	_, err := Parse(big)
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != "config.MaxConfigBytes" || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Parse of %d bytes: %v, want config.MaxConfigBytes", len(big), err)
	}

	var flow strings.Builder
	flow.WriteString("tenants: {")
	for i := range MaxInlineTenants + 1 {
		fmt.Fprintf(&flow, "t%d: {tier: free}, ", i)
	}
	flow.WriteString("}\n")
	doc := sampleWith(t, "tenants:\n  acme: {tier: pro, overrides: {write: {rate: 800/s, burst: 1600}}}\n", flow.String())
	if _, err := Parse(doc); !strings.Contains(fmt.Sprint(err), "config.MaxInlineTenants") {
		t.Fatalf("flow mapping of %d tenants: %v, want config.MaxInlineTenants", MaxInlineTenants+1, err)
	}

	c := Default()
	for i := range MaxRegions + 1 {
		c.Regions[fmt.Sprintf("r%d", i)] = Region{Weight: 1, MaxShare: 1}
	}
	if err := c.Validate(); !strings.Contains(fmt.Sprint(err), "config.MaxRegions") {
		t.Fatalf("%d regions: %v, want config.MaxRegions", len(c.Regions), err)
	}
}

func TestValidateListsAtMostMaxProblems(t *testing.T) {
	c := Default()
	for i := range MaxProblems + 10 {
		c.Tenants[fmt.Sprintf("t%d", i)] = Tenant{Tier: "gold"}
	}
	err := c.Validate()
	multi, ok := err.(interface{ Unwrap() []error })
	if !ok || len(multi.Unwrap()) != MaxProblems+1 {
		t.Fatalf("Validate: %d problems, want %d then a count", len(multi.Unwrap()), MaxProblems)
	}
	if !strings.Contains(err.Error(), "and 10 more problems") {
		t.Fatalf("last line lacks the count: %v", multi.Unwrap()[MaxProblems])
	}
}

func TestParseStopsWhenCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c, err := ParseContext(ctx, manyTenants(t, 2*tenantBatch))
	if !errors.Is(err, context.Canceled) || c != nil {
		t.Fatalf("ParseContext with a canceled context: %v, %v", c, err)
	}
	if err := Default().ValidateContext(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("ValidateContext with a canceled context: %v", err)
	}
}

func TestTenantRoundTripsAlone(t *testing.T) {
	for _, tn := range []Tenant{
		{Tier: "pro"},
		{Tier: "free", Shadow: true, Overrides: map[string]LimitSpec{"write": {Rate: 0.1, Burst: 1}, "read": {Rate: 1e9, Burst: 1e9}}},
		{Tier: "123"}, {Tier: "true"}, {Tier: "a b"},
	} {
		data, err := MarshalTenant(tn)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseTenant(data)
		if err != nil || !TenantEqual(got, tn) {
			t.Fatalf("%s read back as %+v, %v; want %+v", data, got, err, tn)
		}
	}
	if _, err := ParseTenant([]byte("{tier: pro, overides: {}}")); !strings.Contains(fmt.Sprint(err), `unknown field "overides"`) {
		t.Fatalf("ParseTenant of a misspelt field: %v", err)
	}
}

func TestTenantProblemsChecksOneTenant(t *testing.T) {
	c := Default()
	if err := c.TenantProblems("beta", Tenant{Tier: "pro"}); err != nil {
		t.Fatal(err)
	}
	err := c.TenantProblems("beta", Tenant{Tier: "gold", Overrides: map[string]LimitSpec{"nosuch": {Rate: 1, Burst: 1}}})
	for _, want := range []string{`tenants.beta.tier: tier "gold"`, `tenants.beta.overrides.nosuch: class "nosuch"`} {
		if !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func TestDiffListsTenantsApartWhenThereAreMany(t *testing.T) {
	old, err := Parse(manyTenants(t, DiffWholeTenants))
	if err != nil {
		t.Fatal(err)
	}
	new, _ := Parse(manyTenants(t, DiffWholeTenants))
	delete(new.Tenants, "t0000001")
	new.Tenants["t0000002"] = Tenant{Tier: "pro"}
	new.Tenants["zeta"] = Tenant{Tier: "free", Shadow: true}
	new.DefaultTier = "pro"
	d := Diff(old, new)
	for _, want := range []string{
		"-default_tier: free\n+default_tier: pro\n",
		"@@ tenants: 1 added, 1 changed, 1 removed (2000 listed before, 2000 after) @@\n",
		"-  t0000001:\n-    tier: free\n-  t0000002:\n-    tier: free\n+  t0000002:\n+    tier: pro\n+  zeta:\n+    tier: free\n+    shadow: true\n",
	} {
		if !strings.Contains(d, want) {
			t.Errorf("diff lacks %q:\n%s", want, d)
		}
	}
	if bytes.Count([]byte(d), []byte("\n")) > 30 {
		t.Errorf("diff of 3 tenant changes is %d lines", bytes.Count([]byte(d), []byte("\n")))
	}
}

// BenchmarkParseTenants parses the sample with 10,000 and 100,000
// tenants; time per op grows with the count (linear: ratio ≈ 10).
func BenchmarkParseTenants(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		doc := manyTenants(b, n)
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				if _, err := Parse(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDiffTenants diffs two configs of 10,000 and 100,000 tenants
// that differ in one tenant.
func BenchmarkDiffTenants(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		old, err := Parse(manyTenants(b, n))
		if err != nil {
			b.Fatal(err)
		}
		new, _ := Parse(manyTenants(b, n))
		new.Tenants["t0000001"] = Tenant{Tier: "pro"}
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			for b.Loop() {
				if Diff(old, new) == "" {
					b.Fatal("no diff")
				}
			}
		})
	}
}
