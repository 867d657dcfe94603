package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"pgregory.net/rapid"
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

// TestValidateListsExactlyMaxProblemsWithoutACount: MaxProblems problems
// are all listed with no count after them; one more is counted.
func TestValidateListsExactlyMaxProblemsWithoutACount(t *testing.T) {
	for _, n := range []int{MaxProblems - 1, MaxProblems, MaxProblems + 1} {
		c := Default()
		for i := range n {
			c.Tenants[fmt.Sprintf("t%d", i)] = Tenant{Tier: "gold"}
		}
		err := c.Validate()
		multi, ok := err.(interface{ Unwrap() []error })
		if !ok {
			t.Fatalf("%d unknown tiers: Validate %v, want a list of problems", n, err)
		}
		got := multi.Unwrap()
		var more *MoreProblems
		counted := errors.As(got[len(got)-1], &more)
		switch {
		case n <= MaxProblems && (len(got) != n || counted):
			t.Errorf("%d unknown tiers: %d problems listed (last counted: %v), want all %d and no count", n, len(got), counted, n)
		case n > MaxProblems && (len(got) != MaxProblems+1 || !counted || more.N != n-MaxProblems):
			t.Errorf("%d unknown tiers: %d problems listed (last counted: %v), want %d then a count of %d", n, len(got), counted, MaxProblems, n-MaxProblems)
		}
	}
}

// TestParseListsAtMostMaxProblemsOfTheDecoder: problems the YAML decoder
// finds (unknown fields, in the document or among the tenants) are listed
// up to MaxProblems like Validate's, the rest counted in a last
// *MoreProblems (they were all listed).
func TestParseListsAtMostMaxProblemsOfTheDecoder(t *testing.T) {
	const n = 20 * MaxProblems
	var top, tenants strings.Builder
	for i := range n {
		fmt.Fprintf(&top, "unknown%d: 1\n", i)
		fmt.Fprintf(&tenants, "  t%d: {tierr: free}\n", i)
	}
	for _, tc := range []struct {
		name string
		doc  []byte
	}{
		{"unknown top-level fields", append(SampleYAML(), top.String()...)},
		{"unknown tenant fields", sampleWith(t, "default_tier:", tenants.String()+"default_tier:")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.doc)
			multi, ok := err.(interface{ Unwrap() []error })
			if !ok || len(multi.Unwrap()) != MaxProblems+1 {
				t.Fatalf("Parse: %d problems listed, want %d then a count", len(multi.Unwrap()), MaxProblems)
			}
			var more *MoreProblems
			if !errors.As(multi.Unwrap()[MaxProblems], &more) || more.N != n-MaxProblems || !errors.Is(more, ErrInvalidConfig) {
				t.Fatalf("last problem %v, want a MoreProblems of %d", multi.Unwrap()[MaxProblems], n-MaxProblems)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("and %d more problems not listed", n-MaxProblems)) {
				t.Fatalf("the count is not worded: %v", multi.Unwrap()[MaxProblems])
			}
		})
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

// TestTenantEqualComparesEveryField: tenants differing in their tier,
// shadow mode, number of overrides, an override's class or its limit are
// not equal; equal ones are, however their maps were built.
func TestTenantEqualComparesEveryField(t *testing.T) {
	base := func() Tenant {
		return Tenant{Tier: "pro", Shadow: true, Overrides: map[string]LimitSpec{"write": {Rate: 10, Burst: 20}}}
	}
	for _, tc := range []struct {
		name   string
		change func(*Tenant)
		equal  bool
	}{
		{"unchanged", func(*Tenant) {}, true},
		{"tier", func(t *Tenant) { t.Tier = "free" }, false},
		{"shadow", func(t *Tenant) { t.Shadow = false }, false},
		{"an override more", func(t *Tenant) { t.Overrides["read"] = LimitSpec{Rate: 1, Burst: 1} }, false},
		{"no overrides", func(t *Tenant) { t.Overrides = nil }, false},
		{"another class", func(t *Tenant) { t.Overrides = map[string]LimitSpec{"read": {Rate: 10, Burst: 20}} }, false},
		{"another rate", func(t *Tenant) { t.Overrides["write"] = LimitSpec{Rate: 11, Burst: 20} }, false},
		{"another burst", func(t *Tenant) { t.Overrides["write"] = LimitSpec{Rate: 10, Burst: 21} }, false},
	} {
		a, b := base(), base()
		tc.change(&b)
		if got := TenantEqual(a, b); got != tc.equal {
			t.Errorf("%s: TenantEqual = %v, want %v", tc.name, got, tc.equal)
		}
		if got := TenantEqual(b, a); got != tc.equal {
			t.Errorf("%s, swapped: TenantEqual = %v, want %v", tc.name, got, tc.equal)
		}
	}
	if !TenantEqual(Tenant{Tier: "free"}, Tenant{Tier: "free", Overrides: map[string]LimitSpec{}}) {
		t.Error("no overrides and an empty map differ")
	}
}

// TestTenantBlockReadsAsTheWholeDocument checks the block reader against
// the YAML decoder reading the whole document: block-style tenants of any
// indentation, with comments and blank lines anywhere, one-line or nested
// entries, anchors and merge keys (one source or several, the entry's own
// fields winning), the block first, in the middle or last, lines ending in
// LF or CRLF, are read apart from the rest of the document, to the same
// tenants; and an unknown field in any entry is reported at its line.
func TestTenantBlockReadsAsTheWholeDocument(t *testing.T) {
	sample := string(SampleYAML())
	i := strings.Index(sample, "tenants:\n")
	j := strings.Index(sample, "default_tier:")
	head, tail := sample[:i], sample[j:]
	rapid.Check(t, func(t *rapid.T) {
		indent := strings.Repeat(" ", rapid.IntRange(1, 4).Draw(t, "indent"))
		var lines []string
		noise := func() {
			switch rapid.IntRange(0, 5).Draw(t, "noise") {
			case 0:
				lines = append(lines, "")
			case 1:
				lines = append(lines, "# a comment at the margin")
			case 2:
				lines = append(lines, strings.Repeat(" ", rapid.IntRange(1, 9).Draw(t, "comment indent"))+"# an indented comment")
			}
		}
		header := "tenants:"
		if rapid.Bool().Draw(t, "header comment") {
			header += "   # listed tenants"
		}
		lines = append(lines, header)
		n := rapid.IntRange(0, 12).Draw(t, "tenants")
		bad := rapid.IntRange(-1, n-1).Draw(t, "bad entry")
		badLine := 0
		var anchors []string
		for k := range n {
			noise()
			name := fmt.Sprintf("t%d", k)
			tier := rapid.SampledFrom([]string{"free", "pro"}).Draw(t, "tier")
			field := "tier"
			if k == bad {
				field = "tierr"
			}
			form := rapid.IntRange(0, 5).Draw(t, "form")
			if len(anchors) == 0 && form >= 4 {
				form = 3
			}
			switch form {
			case 0:
				if k == bad {
					badLine = len(lines) + 1
				}
				lines = append(lines, fmt.Sprintf("%s%s: {%s: %s}", indent, name, field, tier))
			case 3: // an anchor
				if k == bad {
					badLine = len(lines) + 1
				}
				anchor := fmt.Sprintf("a%d", k)
				anchors = append(anchors, anchor)
				lines = append(lines, fmt.Sprintf("%s%s: &%s {%s: %s, shadow: true, overrides: {read: {rate: 1/s, burst: 2}}}", indent, name, anchor, field, tier))
			case 4: // merged from an anchor, its own fields first
				if k == bad {
					badLine = len(lines) + 1
				}
				from := rapid.SampledFrom(anchors).Draw(t, "from")
				lines = append(lines, fmt.Sprintf("%s%s: {%s: %s, <<: *%s, shadow: false}", indent, name, field, tier, from))
			case 5: // merged from several anchors, the first winning
				if k == bad {
					badLine = len(lines) + 1
				}
				lines = append(lines, fmt.Sprintf("%s%s: {<<: [*%s, *%s], %s: %s}", indent, name, anchors[len(anchors)-1], anchors[0], field, tier))
			case 1:
				lines = append(lines, indent+name+":")
				noise()
				if k == bad {
					badLine = len(lines) + 1
				}
				lines = append(lines, fmt.Sprintf("%s%s%s: %s", indent, indent, field, tier))
				noise()
				lines = append(lines, indent+indent+"shadow: true")
			case 2:
				lines = append(lines, indent+name+":")
				if k == bad {
					badLine = len(lines) + 1
				}
				lines = append(lines, fmt.Sprintf("%s  %s: %s", indent, field, tier),
					indent+"  overrides:", indent+"    write:", indent+"      rate: 800/s", indent+"      burst: 1600")
			}
		}
		noise()
		block := strings.Join(lines, "\n") + "\n"
		var doc string
		offset := 0 // lines before the block
		switch rapid.IntRange(0, 2).Draw(t, "place") {
		case 0:
			doc = head + block + tail
			offset = strings.Count(head, "\n")
		case 1:
			doc = block + head + tail
		case 2:
			doc = head + tail + block
			offset = strings.Count(head+tail, "\n")
		}
		if rapid.Bool().Draw(t, "CRLF") {
			doc = strings.ReplaceAll(doc, "\n", "\r\n")
		}
		// The block is read apart, not with the whole document (which
		// would take time quadratic in the tenants, and refuse more than
		// MaxInlineTenants).
		b, found, split := findTenantBlock([]byte(doc))
		if !found || !split || len(b.entries)-1 != n {
			t.Fatalf("findTenantBlock: found %v, split %v, %d entries; want a block of %d:\n%s", found, split, len(b.entries)-1, n, doc)
		}
		if _, _, ok, err := readTenantBlock(context.Background(), []byte(doc), b); !ok || err != nil {
			t.Fatalf("readTenantBlock: ok %v, %v; want it read apart:\n%s", ok, err, doc)
		}
		c, err := Parse([]byte(doc))
		if bad >= 0 {
			want := fmt.Sprintf(`unknown field "tierr" (line %d)`, offset+badLine)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Parse: %v, want %q in:\n%s", err, want, doc)
			}
			return
		}
		if err != nil {
			t.Fatalf("Parse: %v\n%s", err, doc)
		}
		var whole struct {
			Tenants map[string]Tenant `yaml:"tenants"`
		}
		if err := yaml.Unmarshal([]byte(doc), &whole); err != nil {
			t.Fatal(err)
		}
		if len(c.Tenants) != len(whole.Tenants) {
			t.Fatalf("%d tenants, the decoder reads %d:\n%s", len(c.Tenants), len(whole.Tenants), doc)
		}
		for name, want := range whole.Tenants {
			if got, ok := c.Tenants[name]; !ok || !TenantEqual(got, want) {
				t.Fatalf("tenant %s = %+v, the decoder reads %+v:\n%s", name, got, want, doc)
			}
		}
	})
}
