package envoyrls_test

import (
	"slices"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/quota"
)

// sentValues are values Envoy sends as descriptor entries (paths, e-mail
// addresses, base64, user agents, text, IPv6 addresses), none of them a
// valid tenant as it is.
var sentValues = []string{
	"/v1/orders", "a+b@x.com", "dGVzdA==", "hello world", "Zoë",
	strings.Repeat("v", 200), "Mozilla/5.0 (X11)", "2001:db8::1", ":x", "a:", "",
}

// TestTreeTenant pins the tenant of every tuple of values a tree path
// collects: plain values joined by ":" as before, every other tuple its
// digest, the empty tuple the shared bucket.
func TestTreeTenant(t *testing.T) {
	max := strings.Repeat("a", quota.MaxTenantLen)
	for _, c := range []struct {
		name   string
		values []string
		want   string // "" means Digest(values...)
	}{
		{"no values: the shared bucket", nil, "_"},
		{"one plain value keeps its tenant", []string{"203.0.113.7"}, "203.0.113.7"},
		{"every allowed byte but ':'", []string{"aZ09._@-"}, "aZ09._@-"},
		{"plain values joined by ':'", []string{"billing", "u-1234"}, "billing:u-1234"},
		{"a later value may be empty", []string{"a", ""}, "a:"},
		{"empty values in the middle", []string{"a", "", "", "b"}, "a:::b"},
		{"128 bytes in one value", []string{max}, max},
		{"128 bytes joined", []string{max[:60], max[:67]}, max[:60] + ":" + max[:67]},
		{"129 bytes in one value", []string{max + "a"}, ""},
		{"129 bytes joined", []string{max[:60], max[:68]}, ""},
		{"the first value empty", []string{"", "a"}, ""},
		{"one empty value", []string{""}, ""},
		{"the single value _ (the shared bucket's tenant)", []string{"_"}, ""},
		{"_ beside another value stays plain", []string{"_", "x"}, "_:x"},
		{"a value with ':'", []string{"2001:db8::1"}, ""},
		{"a value with ':' beside another", []string{"p:q", "r"}, ""},
		{"a path", []string{"/v1/orders"}, ""},
		{"a digest as the package doc shows it (a change moves every such bucket)", []string{"/v1/orders"}, ":f617defe5354411b6a43152194a48108"},
		{"a plus sign", []string{"a+b@x.com"}, ""},
		{"base64 padding", []string{"dGVzdA=="}, ""},
		{"a space", []string{"hello world"}, ""},
		{"UTF-8", []string{"Zoë"}, ""},
		{"200 bytes", []string{strings.Repeat("v", 200)}, ""},
		{"a user agent", []string{"Mozilla/5.0 (X11)"}, ""},
		{"a digest's form", []string{envoyrls.Digest("x")}, ""},
	} {
		want := c.want
		if want == "" {
			want = envoyrls.Digest(c.values...)
		}
		got := envoyrls.TreeTenant(c.values...)
		if got != want {
			t.Errorf("%s: TreeTenant(%q) = %q, want %q", c.name, c.values, got, want)
		}
		if err := (quota.Key{Tenant: got, Class: "c"}).Validate(); err != nil {
			t.Errorf("%s: TreeTenant(%q) = %q: %v", c.name, c.values, got, err)
		}
		if envoyrls.IsDigest(got) != (c.want == "" || c.want[0] == ':') {
			t.Errorf("%s: TreeTenant(%q) = %q: IsDigest %v", c.name, c.values, got, envoyrls.IsDigest(got))
		}
	}
}

// TestTenantsAreDistinct: tuples that one join would run together, and
// the values Envoy sends, each have a tenant of their own.
func TestTenantsAreDistinct(t *testing.T) {
	tuples := [][]string{
		{}, {"_"}, {"p:q", "r"}, {"p", "q:r"}, {"p:q:r"}, {"p", "q", "r"},
		{"a", ""}, {"a:"}, {"", "a"}, {":a"}, {""}, {"", ""}, {":"},
		{"ab", "c"}, {"a", "bc"}, {"a\x01", "b"}, {"a", "\x01b"},
	}
	for _, v := range sentValues {
		tuples = append(tuples, []string{v}, []string{"x", v}, []string{v, "x"})
	}
	seen := map[string][]string{}
	for _, tu := range tuples {
		tenant := envoyrls.TreeTenant(tu...)
		if prev, dup := seen[tenant]; dup && !slices.Equal(prev, tu) {
			t.Errorf("TreeTenant(%q) = TreeTenant(%q) = %q", tu, prev, tenant)
		}
		seen[tenant] = tu
	}
}

// TestMappingTenant pins the tenant an envoy.descriptors mapping takes
// from its tenant_key entry: any valid tenant as it is (':' included),
// the digest TreeTenant gives any other single value.
func TestMappingTenant(t *testing.T) {
	for _, c := range []struct{ value, want string }{
		{"acme", "acme"},
		{"org:team", "org:team"},
		{":x", ":x"},
		{"_", "_"},
		{strings.Repeat("a", quota.MaxTenantLen), strings.Repeat("a", quota.MaxTenantLen)},
		{strings.Repeat("a", quota.MaxTenantLen+1), ""},
		{"", ""},
		{"a b", ""},
		{"/v1/orders", ""},
		{envoyrls.Digest("a b"), ""},
		{":0123456789abcdef0123456789ABCDEF", ":0123456789abcdef0123456789ABCDEF"}, // upper case: not a digest
		{":0123456789abcdef0123456789abcdeg", ":0123456789abcdef0123456789abcdeg"}, // g: not a digest
		{":0123456789abcdef0123456789abcde", ":0123456789abcdef0123456789abcde"},   // 31 digits: not a digest
		{"x0123456789abcdef0123456789abcdef", "x0123456789abcdef0123456789abcdef"}, // no ':': not a digest
	} {
		want := c.want
		if want == "" {
			want = envoyrls.Digest(c.value)
			if d := envoyrls.TreeTenant(c.value); d != want {
				t.Errorf("TreeTenant(%q) = %q, MappingTenant's digest %q", c.value, d, want)
			}
		}
		if got := envoyrls.MappingTenant(c.value); got != want {
			t.Errorf("MappingTenant(%q) = %q, want %q", c.value, got, want)
		}
	}
	if a, b := envoyrls.MappingTenant(envoyrls.Digest("a b")), envoyrls.Digest("a b"); a == b {
		t.Errorf("a value of a digest's form keeps it: %q", a)
	}
}

// anyValueConfig has buckets of two per value, under a node without a
// value, a prefix node and a path of two such nodes, and a per-address
// bucket of three; nothing refills during a test.
const anyValueConfig = `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}}
classes:
  per_value: {mode: lease}
  per_ip:    {mode: lease}
  pair:      {mode: lease}
tiers:
  std:
    per_value: {rate: 1/h, burst: 2}
    per_ip:    {rate: 1/h, burst: 3}
    pair:      {rate: 1/h, burst: 2}
default_tier: std
envoy:
  domains:
    - domain: edge
      descriptors:
        - {key: path, value: "/v1/*", class: per_value}
        - {key: header, class: per_value}
        - {key: remote_address, class: per_ip}
        - key: a
          descriptors: [{key: b, class: pair}]
`

// TestAnyValueHasItsBucket: on a real regional service, every value
// Envoy can send under a node without an exact value is decided in a
// bucket of its own (two values never share one, nor do the tuples one
// join by ':' runs together), and a descriptor carrying such a value no
// longer frees the request's other descriptors from their limits.
func TestAnyValueHasItsBucket(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, anyValueConfig)
	p := startProcess(t, rs, cfg, "envoy-anyvalue", true)
	codes := func(resp *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
		var out []rlsv3.RateLimitResponse_Code
		for _, s := range resp.GetStatuses() {
			out = append(out, s.GetCode())
		}
		return out
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

	// Burst 2 each: two rounds pass, the third is over limit, for every
	// value alike; values that shared a bucket would run out in the
	// second round.
	reqs := []*rlsv3.RateLimitRequest{
		request("edge", 0, desc("path", "/v1/users")),
		request("edge", 0, desc("path", "/v1/users/")),
		request("edge", 0, desc("a", "p:q", "b", "r")),
		request("edge", 0, desc("a", "p", "b", "q:r")),
		request("edge", 0, desc("a", "p", "b", "q")),
		request("edge", 0, desc("a", "p", "b", "")),
		request("edge", 0, desc("a", "p:", "b", "")),
	}
	for _, v := range sentValues {
		reqs = append(reqs, request("edge", 0, desc("header", v)))
	}
	for round, want := range []rlsv3.RateLimitResponse_Code{ok, ok, over} {
		for _, r := range reqs {
			if got := ask(t, p.rls, r).GetOverallCode(); got != want {
				t.Errorf("round %d, %v: %v, want %v", round+1, r.GetDescriptors(), got, want)
			}
		}
	}

	// A caller changing a header on every request is still charged on
	// the address it comes from: three pass, the fourth is over limit.
	for i, want := range [][]rlsv3.RateLimitResponse_Code{{ok, ok}, {ok, ok}, {ok, ok}, {over, ok}} {
		r := request("edge", 0, desc("remote_address", "192.0.2.1"), desc("header", "x y "+string(rune('a'+i))))
		if got := codes(ask(t, p.rls, r)); !slices.Equal(got, want) {
			t.Errorf("request %d with a new header value: %v, want %v", i+1, got, want)
		}
	}
}

// TestCostAboveTheBurst: a descriptor costing more than its key's burst
// is OVER_LIMIT with no time after which it would pass, charges nothing,
// and charges none of the request's other descriptors either (answered OK
// as not decided, with no current_limit): the request is refused anyway.
func TestCostAboveTheBurst(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, anyValueConfig)
	p := startProcess(t, rs, cfg, "envoy-cost", true)
	resp := ask(t, p.rls, request("edge", 0, withHits(desc("remote_address", "192.0.2.9"), 25), desc("remote_address", "192.0.2.10")))
	st := resp.GetStatuses()
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || len(st) != 2 ||
		st[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st[0].GetDurationUntilReset() != nil || st[0].GetLimitRemaining() != 0 ||
		st[0].GetCurrentLimit().GetName() != "per_ip" ||
		st[1].GetCode() != rlsv3.RateLimitResponse_OK || st[1].GetCurrentLimit() != nil {
		t.Fatalf("a cost of 25 on a burst of 3 beside a cost of 1: %v", resp)
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == envoyrls.HeaderRetryAfter || h.GetKey() == envoyrls.HeaderReset {
			t.Errorf("a time is promised to a cost no wait admits: %s: %s", h.GetKey(), h.GetValue())
		}
	}
	// Nothing was charged for it: its bucket still holds the burst.
	resp = ask(t, p.rls, request("edge", 3, desc("remote_address", "192.0.2.9")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Fatalf("the whole burst after the refused cost: %v", resp)
	}
	// Above quota.MaxCost, in the request and in a descriptor, alike.
	for _, r := range []*rlsv3.RateLimitRequest{
		request("edge", quota.MaxCost+1, desc("remote_address", "192.0.2.11")),
		request("edge", 0, withHits(desc("remote_address", "192.0.2.11"), 1<<40)),
	} {
		if resp := ask(t, p.rls, r); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[0].GetDurationUntilReset() != nil {
			t.Errorf("%v: %v, want OVER_LIMIT without a reset", r, resp)
		}
	}
	if n := counter(t, p.reg, "sluice_envoy_decisions_total", map[string]string{"class": "per_ip", "tier": "std", "result": "over_limit"}); n != 3 {
		t.Errorf("decisions_total{per_ip, over_limit} = %v, want 3", n)
	}
}
