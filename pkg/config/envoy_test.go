package config

import (
	"errors"
	"strings"
	"testing"
)

const envoyDomainsYAML = `
regions: {local: {weight: 1}}
classes: {read: {}, per_ip: {}}
tiers:
  std: {read: {rate: 10/s, burst: 10}, per_ip: {rate: 5/d, burst: 5}}
default_tier: std
envoy:
  descriptors:
    - {domain: edge, tenant_key: tenant, class: read}
  domains:
    - domain: edge
      descriptors:
        - key: remote_address
          class: per_ip
          shadow_mode: true
        - key: remote_address
          value: 10.0.0.1
          unlimited: true
        - key: service
          descriptors:
            - {key: user, value: "user-*", class: read}
`

// TestEnvoyDomainsRoundTrip: the trees parse, survive Marshal and Parse,
// and a day rate is written back per day.
func TestEnvoyDomainsRoundTrip(t *testing.T) {
	c, err := Parse([]byte(envoyDomainsYAML))
	if err != nil {
		t.Fatal(err)
	}
	tree := c.EnvoyTree("edge")
	if tree == nil || len(tree.Descriptors) != 3 || !tree.Descriptors[0].ShadowMode || tree.Descriptors[2].Descriptors[0].Exact() {
		t.Fatalf("tree %+v", tree)
	}
	if c.EnvoyTree("other") != nil {
		t.Error("a tree for a domain not configured")
	}
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "rate: 5/d") || !strings.Contains(string(data), "unlimited: true") {
		t.Errorf("marshalled:\n%s", data)
	}
	again, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if Diff(c, again) != "" {
		t.Errorf("round trip changed the config:\n%s", Diff(c, again))
	}
}

func TestEnvoyDomainsValidation(t *testing.T) {
	deep := "    - domain: deep\n      descriptors:\n"
	indent := "        "
	for i := range MaxEnvoyDepth + 1 {
		deep += indent + "- key: k\n"
		if i == MaxEnvoyDepth {
			deep += indent + "  class: read\n"
			break
		}
		deep += indent + "  descriptors:\n"
		indent += "    "
	}
	cases := []struct {
		name, domains, want string
	}{
		{"domain missing", "    - descriptors: [{key: a, class: read}]\n", "envoy.domains[0].domain: is required"},
		{"domain twice", "    - {domain: e, descriptors: [{key: a, class: read}]}\n    - {domain: e, descriptors: [{key: b, class: read}]}\n",
			`envoy.domains[1].domain: domain "e" is already under envoy.domains[0]`},
		{"no descriptors", "    - {domain: e}\n", "envoy.domains[0].descriptors: at least one descriptor is required"},
		{"key missing", "    - {domain: e, descriptors: [{value: a, class: read}]}\n", "envoy.domains[0].descriptors[0].key: is required"},
		{"key with a space", "    - {domain: e, descriptors: [{key: a b, class: read}]}\n",
			`envoy.domains[0].descriptors[0].key: "a b" has a space`},
		{"value with a control character", "    - {domain: e, descriptors: [{key: a, value: \"x\\ty\", class: read}]}\n",
			`envoy.domains[0].descriptors[0].value: "x\ty" has a control character at offset 1`},
		{"same key and value twice", "    - {domain: e, descriptors: [{key: a, descriptors: [{key: b, value: v, class: read}, {key: b, value: v, unlimited: true}]}]}\n",
			`envoy.domains[0].descriptors[0].descriptors[1]: duplicates envoy.domains[0].descriptors[0].descriptors[0] (key "b", value "v")`},
		{"class and unlimited", "    - {domain: e, descriptors: [{key: a, class: read, unlimited: true}]}\n",
			`envoy.domains[0].descriptors[0]: set only one of class ("read") and unlimited`},
		{"unknown class", "    - {domain: e, descriptors: [{key: a, class: write}]}\n",
			`envoy.domains[0].descriptors[0].class: class "write" is not configured under classes`},
		{"shadow without class", "    - {domain: e, descriptors: [{key: a, unlimited: true, shadow_mode: true}]}\n",
			"envoy.domains[0].descriptors[0].shadow_mode: needs class"},
		{"a node that does nothing", "    - {domain: e, descriptors: [{key: a, value: b}]}\n",
			"envoy.domains[0].descriptors[0]: does nothing: set class, unlimited: true or nested descriptors"},
		{"share_threshold on an exact value", "    - {domain: e, descriptors: [{key: a, value: files, share_threshold: true, class: read}]}\n",
			"envoy.domains[0].descriptors[0].share_threshold: needs a value holding a *"},
		{"share_threshold without a value", "    - {domain: e, descriptors: [{key: a, share_threshold: true, class: read}]}\n",
			"envoy.domains[0].descriptors[0].share_threshold: needs a value holding a *"},
		{"too deep", deep, "nested more than 16 levels deep"},
		{"a node that is not a mapping", "    - {domain: e, descriptors: [remote_address]}\n", `is not a mapping (line 7)`},
	}
	base := "regions: {local: {weight: 1}}\nclasses: {read: {}}\ntiers: {std: {read: {rate: 1/s, burst: 1}}}\ndefault_tier: std\nenvoy:\n  domains:\n"
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(base + tc.domains))
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.domains)
			}
			var fe *FieldError
			decoding := strings.Contains(tc.want, "(line ") // found while decoding, before validation
			if !errors.Is(err, ErrInvalidConfig) || (!decoding && !errors.As(err, &fe)) {
				t.Errorf("not a FieldError wrapping ErrInvalidConfig: %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error lacks %q:\n%v", tc.want, err)
			}
		})
	}
}

// TestMatchValue: a * stands for any run of bytes, none too, anywhere in
// the pattern, as in envoyproxy/ratelimit's README (trailing, in the
// middle, several); the other bytes match themselves.
func TestMatchValue(t *testing.T) {
	cases := []struct {
		pattern, value string
		want           bool
	}{
		{"value*", "value1", true},
		{"value*", "value", true},
		{"value*", "valu", false},
		{"/api/*/action", "/api/123/action", true},
		{"/api/*/action", "/api/user-id/action", true},
		{"/api/*/action", "/api/v1/x/action", true},
		{"/api/*/action", "/api//action", true},
		{"/api/*/action", "/api/123/other", false},
		{"/api/*/action", "/api/action", false}, // the two slashes are not one
		{"/api/*/action", "/api/123/action/", false},
		{"/api/*/resource/*/action", "/api/v1/resource/123/action", true},
		{"/api/*/resource/*/action", "/api/v2/resource/456/action", true},
		{"/api/*/resource/*/action", "/api/v2/resource/action", false},
		{"/api/*/resource/*/action", "/api/resource/resource/resource/action", true},
		{"*", "", true},
		{"*", "anything", true},
		{"*x", "x", true},
		{"*x", "yx", true},
		{"*x", "xy", false},
		{"a*a", "a", false}, // prefix and suffix may not overlap
		{"a*a", "aa", true},
		{"a*b*a", "aba", true},
		{"a*b*a", "aa", false},
		{"a*b*a", "aab", false},
		{"a**b", "ab", true},
		{"*.*.*", "1.2.3", true},
		{"*.*.*", "1.2", false},
		{"ab*ba", "aba", false},
		{"exact", "exact", true},
		{"exact", "exacts", false},
	}
	for _, c := range cases {
		if got := MatchValue(c.pattern, c.value); got != c.want {
			t.Errorf("MatchValue(%q, %q) = %v, want %v", c.pattern, c.value, got, c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { MatchValue("/api/*/resource/*/action", "/api/v1/resource/123/action") }); n != 0 {
		t.Errorf("MatchValue allocates %v times", n)
	}
	for _, n := range []EnvoyNode{{Value: "a*b"}, {Value: "*"}, {Value: "a*"}} {
		if n.Exact() || !n.Pattern() || n.Named() {
			t.Errorf("%q: exact %v, pattern %v, named %v", n.Value, n.Exact(), n.Pattern(), n.Named())
		}
	}
	if n := (EnvoyNode{Value: "a*b", ShareThreshold: true}); !n.Named() {
		t.Errorf("a pattern with share_threshold is not named")
	}
}
