package envoyrls_test

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/quota"
)

// treeConfig has flat mappings and trees for the same domain, in the
// shapes of envoyproxy/ratelimit's documented examples.
const treeConfig = `
regions: {local: {weight: 1}}
classes:
  read: {}
  marketing: {}
  per_number: {}
  per_ip: {}
  users_db: {}
  user_a: {}
  user_b: {}
  api: {}
tiers:
  std:
    read: {rate: 10/s, burst: 10}
    marketing: {rate: 5/d, burst: 5}
    per_number: {rate: 100/d, burst: 100}
    per_ip: {rate: 10/s, burst: 10}
    users_db: {rate: 500/s, burst: 500}
    user_a: {rate: 10/s, burst: 10}
    user_b: {rate: 20/s, burst: 20}
    api: {rate: 1/s, burst: 1}
default_tier: std
envoy:
  descriptors:
    - {domain: edge, tenant_key: tenant, class: read}
  domains:
    - domain: edge
      descriptors:
        - key: message_type
          value: marketing
          descriptors:
            - {key: to_number, class: marketing}
        - {key: to_number, class: per_number}
        - {key: remote_address, class: per_ip}
        - {key: remote_address, value: 10.0.0.9, unlimited: true}
        - key: database
          value: users
          class: users_db
        - key: service
          descriptors:
            - {key: user, value: user-a, class: user_a, shadow_mode: true}
            - {key: user, value: user-b, class: user_b}
        - {key: path, value: "/api/*", class: api}
        - key: remote_address
          value: "10.1.*"
          descriptors:
            - {key: path, class: api}
`

func TestResolveTrees(t *testing.T) {
	cfg := regiontest.MustConfig(t, treeConfig)
	cases := []struct {
		name      string
		d         []string
		matched   bool
		tenant    string
		class     string
		shadow    bool
		unlimited bool
	}{
		{"flat mapping first", []string{"tenant", "acme", "remote_address", "1.2.3.4"}, true, "acme", "read", false, false},
		{"nested, any value", []string{"message_type", "marketing", "to_number", "2061111111"}, true, "2061111111", "marketing", false, false},
		{"top level, any value", []string{"to_number", "2061111111"}, true, "2061111111", "per_number", false, false},
		{"exact value wins over any value", []string{"remote_address", "10.0.0.9"}, false, "", "", false, true},
		{"any value", []string{"remote_address", "10.0.0.8"}, true, "10.0.0.8", "per_ip", false, false},
		{"every value named: one shared bucket", []string{"database", "users"}, true, "_", "users_db", false, false},
		{"value not configured", []string{"database", "orders"}, false, "", "", false, false},
		{"shadow node", []string{"service", "auth", "user", "user-a"}, true, "auth", "user_a", true, false},
		{"sibling without shadow", []string{"service", "auth", "user", "user-b"}, true, "auth", "user_b", false, false},
		{"prefix, a value with a byte no tenant allows: its digest", []string{"path", "/api/v1"}, true, envoyrls.Digest("/api/v1"), "api", false, false},
		{"two levels without exact values", []string{"remote_address", "10.1.2.3", "path", "x"}, true, "10.1.2.3:x", "api", false, false},
		{"deeper than the tree", []string{"remote_address", "10.0.0.8", "path", "x"}, false, "", "", false, false},
		{"shorter than the tree: the node has no limit", []string{"message_type", "marketing"}, false, "", "", false, false},
		{"unknown key", []string{"other", "x"}, false, "", "", false, false},
	}
	for _, c := range cases {
		targets, err := envoyrls.Resolve(cfg, request("edge", 0, desc(c.d...)))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		got := targets[0]
		if got.Matched != c.matched || got.Unlimited != c.unlimited || got.Shadow != c.shadow ||
			got.Key != (quota.Key{Tenant: c.tenant, Class: c.class}) {
			t.Errorf("%s: %+v, want matched %v tenant %q class %q shadow %v unlimited %v",
				c.name, got, c.matched, c.tenant, c.class, c.shadow, c.unlimited)
		}
		if got.Matched && (got.Cost != 1 || got.Resolved.ClassName != c.class) {
			t.Errorf("%s: cost %d, resolved %+v", c.name, got.Cost, got.Resolved)
		}
	}

	// A prefix node makes each value its own tenant; a value that is not
	// a valid tenant id has its digest for tenant.
	cfg.Envoy.Domains[0].Descriptors[6].Value = "user-*"
	cfg.Envoy.Domains[0].Descriptors[6].Key = "uid"
	targets, err := envoyrls.Resolve(cfg, request("edge", 0, desc("uid", "user-42")))
	if err != nil || targets[0].Key != (quota.Key{Tenant: "user-42", Class: "api"}) {
		t.Fatalf("prefix: %+v, %v", targets, err)
	}
	targets, err = envoyrls.Resolve(cfg, request("edge", 0, desc("uid", "user-4/2")))
	if err != nil || targets[0].Key != (quota.Key{Tenant: envoyrls.Digest("user-4/2"), Class: "api"}) {
		t.Fatalf("prefix with a byte no tenant allows: %+v, %v", targets, err)
	}

	// hits_addend: the request's, and a descriptor's own.
	targets, err = envoyrls.Resolve(cfg, request("edge", 3, desc("to_number", "1"), withHits(desc("to_number", "2"), 7)))
	if err != nil || targets[0].Cost != 3 || targets[1].Cost != 7 {
		t.Fatalf("costs: %+v, %v", targets, err)
	}
	// An unlimited descriptor is not examined further, as no cost is charged.
	if _, err := envoyrls.Resolve(cfg, request("edge", 0, withHits(desc("remote_address", "10.0.0.9"), 1<<30))); err != nil {
		t.Errorf("unlimited with a huge hits_addend: %v", err)
	}
	// A cost above the node's class burst can never pass: that
	// descriptor is Never, the other is charged as usual.
	targets, err = envoyrls.Resolve(cfg, request("edge", 2, desc("to_number", "1"), desc("uid", "user-1")))
	if err != nil || targets[0].Never || !targets[0].Matched || !targets[1].Never || !targets[1].Matched || targets[1].Cost != 2 {
		t.Errorf("cost above the burst: %+v, %v", targets, err)
	}
}

// edgesConfig: flat mappings for two domains (a class_key one first, then
// a fixed class as fallback), and a tree whose prefixes overlap.
const edgesConfig = `
regions: {local: {weight: 1}}
classes:
  read: {}
  write: {}
  other: {}
  per_ip: {}
  net10: {}
  net101: {}
  big: {}
  huge: {}
tiers:
  std:
    read: {rate: 10/s, burst: 10}
    write: {rate: 10/s, burst: 10}
    other: {rate: 10/s, burst: 10}
    per_ip: {rate: 10/s, burst: 10}
    net10: {rate: 10/s, burst: 10}
    net101: {rate: 10/s, burst: 10}
    big: {rate: 1048576/s, burst: 1048576}
    huge: {rate: 1000000000/s, burst: 1000000000}
default_tier: std
envoy:
  descriptors:
    - {domain: other, tenant_key: user, class: other}
    - {domain: flat, tenant_key: tenant, class_key: class}
    - {domain: flat, tenant_key: tenant, class: read}
    - {domain: flat, tenant_key: bulk, class: big}
    - {domain: flat, tenant_key: whole, class: huge}
  domains:
    - domain: flat
      descriptors:
        - {key: user, class: per_ip}
    - domain: tree
      descriptors:
        - {key: ip, value: "10.*", class: net10}
        - {key: ip, value: "10.1.*", class: net101}
        - {key: ip, class: per_ip}
        - {key: addr, value: "10.1.*", descriptors: [{key: path, class: net101}]}
        - {key: addr, class: per_ip}
`

// TestResolveEdges pins how descriptors map to keys at the edges: a
// mapping serves only its own domain; a class_key mapping whose class
// entry is missing gives way to the next mapping; a key repeated with the
// same value is not ambiguous; the first matching prefix wins and a
// prefix is the value up to its '*', no shorter; a descriptor's
// hits_addend of 1 and of exactly quota.MaxCost are costs.
func TestResolveEdges(t *testing.T) {
	cfg := regiontest.MustConfig(t, edgesConfig)
	cases := []struct {
		name    string
		req     *rlsv3.RateLimitRequest
		matched bool
		key     quota.Key
		cost    int64
	}{
		{"another domain's mapping is not used", request("flat", 0, desc("user", "u1")), true, quota.Key{Tenant: "u1", Class: "per_ip"}, 1},
		{"class_key mapping", request("flat", 0, desc("tenant", "acme", "class", "write")), true, quota.Key{Tenant: "acme", Class: "write"}, 1},
		{"no class entry: the next mapping", request("flat", 0, desc("tenant", "acme")), true, quota.Key{Tenant: "acme", Class: "read"}, 1},
		{"same key, same value twice", request("flat", 0, desc("tenant", "acme", "class", "write", "tenant", "acme")), true, quota.Key{Tenant: "acme", Class: "write"}, 1},
		{"first matching prefix", request("tree", 0, desc("ip", "10.1.2.3")), true, quota.Key{Tenant: "10.1.2.3", Class: "net10"}, 1},
		{"prefix is the whole value before *", request("tree", 0, desc("addr", "10.10.0.1")), true, quota.Key{Tenant: "10.10.0.1", Class: "per_ip"}, 1},
		{"descriptor hits_addend 1", request("flat", 5, withHits(desc("tenant", "acme"), 1)), true, quota.Key{Tenant: "acme", Class: "read"}, 1},
		{"descriptor hits_addend at the maximum", request("flat", 0, withHits(desc("bulk", "b1"), quota.MaxCost)), true, quota.Key{Tenant: "b1", Class: "big"}, quota.MaxCost},
		{"request hits_addend at the maximum", request("flat", quota.MaxCost, desc("bulk", "b1")), true, quota.Key{Tenant: "b1", Class: "big"}, quota.MaxCost},
		{"descriptor hits_addend above the maximum: never admitted", request("flat", 0, withHits(desc("bulk", "b1"), quota.MaxCost+1)), true, quota.Key{Tenant: "b1", Class: "big"}, quota.MaxCost + 1},
		{"descriptor hits_addend of 2^64-1", request("flat", 0, withHits(desc("bulk", "b1"), math.MaxUint64)), true, quota.Key{Tenant: "b1", Class: "big"}, math.MaxInt64},
		{"request hits_addend above the maximum: never admitted", request("flat", quota.MaxCost+1, desc("bulk", "b1")), true, quota.Key{Tenant: "b1", Class: "big"}, quota.MaxCost + 1},
		{"above the maximum, below the burst: never admitted", request("flat", quota.MaxCost+1, desc("whole", "w1")), true, quota.Key{Tenant: "w1", Class: "huge"}, quota.MaxCost + 1},
		{"class_key mapping, a tenant no tenant id allows: its digest", request("flat", 0, desc("tenant", "ac me", "class", "write")), true, quota.Key{Tenant: envoyrls.Digest("ac me"), Class: "write"}, 1},
		{"a class no class is named: the next mapping", request("flat", 0, desc("tenant", "acme", "class", "wr ite")), true, quota.Key{Tenant: "acme", Class: "read"}, 1},
		{"mapping, hits_addend 0: needs no token, unmatched", request("flat", 0, withHits(desc("tenant", "acme", "class", "write"), 0)), false, quota.Key{}, 0},
		{"tree, hits_addend 0: needs no token, unmatched", request("tree", 3, withHits(desc("ip", "192.0.2.1"), 0)), false, quota.Key{}, 0},
	}
	for _, c := range cases {
		targets, err := envoyrls.Resolve(cfg, c.req)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got := targets[0]; got.Matched != c.matched || got.Key != c.key || got.Cost != c.cost || got.Never != (c.cost > quota.MaxCost) {
			t.Errorf("%s: %+v, want matched %v key %v cost %d", c.name, got, c.matched, c.key, c.cost)
		}
	}
	for _, c := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		msg  string
	}{
		{"same key, another value", request("flat", 0, desc("tenant", "acme", "class", "write", "tenant", "acme2")), "appears again"},
		{"class key, another value", request("flat", 0, desc("tenant", "acme", "class", "write", "class", "read")), `key "class" appears again`},
		{"tree descriptor, negative hits", request("tree", 0, negative(desc("ip", "192.0.2.1"))), "is_negative_hits"},
	} {
		if _, err := envoyrls.Resolve(cfg, c.req); !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want ErrInvalid mentioning %q", c.name, err, c.msg)
		}
	}
}

// wildcardConfig: values with a * anywhere, as envoyproxy/ratelimit's
// README documents them (in the middle, several in one value), beside
// exact and value-less siblings, and patterns with share_threshold.
const wildcardConfig = `
regions: {local: {weight: 1}}
classes: {action: {}, v2_action: {}, nested: {}, any_path: {}, files: {}, routes: {}}
tiers:
  std:
    action: {rate: 1/s, burst: 1}
    v2_action: {rate: 1/s, burst: 1}
    nested: {rate: 1/s, burst: 1}
    any_path: {rate: 1/s, burst: 1}
    files: {rate: 1/s, burst: 1}
    routes: {rate: 1/s, burst: 1}
default_tier: std
envoy:
  domains:
    - domain: w
      descriptors:
        - {key: path, value: "/api/v2/action", class: v2_action}
        - {key: path, value: "/api/*/action", class: action}
        - {key: path, value: "/api/*/resource/*/action", class: nested}
        - {key: path, value: "/api/*/other", unlimited: true}
        - {key: path, class: any_path}
        - {key: file, value: "files/*", share_threshold: true, class: files}
        - key: route
          value: "api/*"
          share_threshold: true
          descriptors:
            - {key: method, class: routes}
        - key: route
          value: "*/v1"
          descriptors:
            - {key: method, class: routes}
`

// TestResolveWildcards: a * anywhere in a node's value matches any run of
// bytes; an exact sibling is tried first, the first matching pattern in
// order next, the node without a value last; each matching value has its
// own bucket, and one shared by every value with share_threshold.
func TestResolveWildcards(t *testing.T) {
	cfg := regiontest.MustConfig(t, wildcardConfig)
	cases := []struct {
		name      string
		d         []string
		matched   bool
		tenant    string
		class     string
		unlimited bool
	}{
		{"exact value before the pattern", []string{"path", "/api/v2/action"}, true, "_", "v2_action", false},
		{"* in the middle", []string{"path", "/api/v1/action"}, true, envoyrls.Digest("/api/v1/action"), "action", false},
		{"* in the middle, another value: its own bucket", []string{"path", "/api/user-id/action"}, true, envoyrls.Digest("/api/user-id/action"), "action", false},
		{"* spans a slash", []string{"path", "/api/a/b/action"}, true, envoyrls.Digest("/api/a/b/action"), "action", false},
		{"the suffix differs: the node without a value", []string{"path", "/api/v1/action2"}, true, envoyrls.Digest("/api/v1/action2"), "any_path", false},
		{"two *: the first matching pattern in order", []string{"path", "/api/v1/resource/7/action"}, true, envoyrls.Digest("/api/v1/resource/7/action"), "action", false},
		{"two *, the second pattern", []string{"path", "/api/v1/resource/7/action/x"}, true, envoyrls.Digest("/api/v1/resource/7/action/x"), "any_path", false},
		{"an unlimited pattern", []string{"path", "/api/v1/other"}, false, "", "", true},
		{"share_threshold: one bucket", []string{"file", "files/a.pdf"}, true, "_", "files", false},
		{"share_threshold: the same bucket", []string{"file", "files/b.csv"}, true, "_", "files", false},
		{"share_threshold: no match", []string{"file", "docs/a.pdf"}, false, "", "", false},
		{"share_threshold above a value-less node", []string{"route", "api/v1", "method", "GET"}, true, "GET", "routes", false},
		{"share_threshold above, another route, the same bucket", []string{"route", "api/v2", "method", "GET"}, true, "GET", "routes", false},
		{"a leading *, each value its own", []string{"route", "web/v1", "method", "GET"}, true, envoyrls.TreeTenant("web/v1", "GET"), "routes", false},
	}
	for _, c := range cases {
		targets, err := envoyrls.Resolve(cfg, request("w", 0, desc(c.d...)))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		got := targets[0]
		if got.Matched != c.matched || got.Unlimited != c.unlimited || got.Key != (quota.Key{Tenant: c.tenant, Class: c.class}) {
			t.Errorf("%s: %+v, want matched %v tenant %q class %q unlimited %v", c.name, got, c.matched, c.tenant, c.class, c.unlimited)
		}
	}
}

// TestGuardRuleBounds: a request may carry MaxDescriptors descriptors of
// MaxEntries entries each; one entry more is refused naming
// entries_per_descriptor and the descriptor.
func TestGuardRuleBounds(t *testing.T) {
	// The documented bounds: 64 descriptors of 32 entries each.
	if envoyrls.MaxDescriptors != 64 || envoyrls.MaxEntries != 32 {
		t.Errorf("MaxDescriptors %d, MaxEntries %d; want 64 and 32", envoyrls.MaxDescriptors, envoyrls.MaxEntries)
	}
	rule := envoyrls.GuardRule()
	entries := func(n int) *ratelimitv3.RateLimitDescriptor {
		kv := make([]string, 0, 2*n)
		for i := range n {
			kv = append(kv, "k"+strconv.Itoa(i), "v")
		}
		return desc(kv...)
	}
	full := make([]*ratelimitv3.RateLimitDescriptor, envoyrls.MaxDescriptors)
	for i := range full {
		full[i] = entries(envoyrls.MaxEntries)
	}
	req := request("d", 0, full...)
	if n := rule.Units(req); n != envoyrls.MaxDescriptors || rule.Max != envoyrls.MaxDescriptors {
		t.Errorf("units %d, max %d; want both %d", n, rule.Max, envoyrls.MaxDescriptors)
	}
	if bound, why := rule.Check(req); bound != "" {
		t.Errorf("%d descriptors of %d entries: refused %s: %s", envoyrls.MaxDescriptors, envoyrls.MaxEntries, bound, why)
	}
	req = request("d", 0, entries(1), entries(envoyrls.MaxEntries+1))
	if bound, why := rule.Check(req); bound != "entries_per_descriptor" || !strings.Contains(why, "descriptors[1]") {
		t.Errorf("%d entries: %q, %q; want entries_per_descriptor naming descriptors[1]", envoyrls.MaxEntries+1, bound, why)
	}
}

// TestResolveShadow: a descriptor is in shadow mode when its class is
// (the config's shadow: true) or its tree node says shadow_mode, and not
// otherwise.
func TestResolveShadow(t *testing.T) {
	flat := regiontest.MustConfig(t, testConfig)
	tree := regiontest.MustConfig(t, treeConfig)
	for _, c := range []struct {
		name   string
		cfg    string
		req    *rlsv3.RateLimitRequest
		shadow bool
	}{
		{"class in shadow mode", "flat", request("sluice", 0, desc("tenant", "acme", "class", "audit")), true},
		{"class not in shadow mode", "flat", request("sluice", 0, desc("tenant", "acme", "class", "write")), false},
		{"tree node in shadow mode", "tree", request("edge", 0, desc("service", "s", "user", "user-a")), true},
		{"tree node not in shadow mode", "tree", request("edge", 0, desc("service", "s", "user", "user-b")), false},
	} {
		cfg := flat
		if c.cfg == "tree" {
			cfg = tree
		}
		targets, err := envoyrls.Resolve(cfg, c.req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := targets[0]; !got.Matched || got.Shadow != c.shadow {
			t.Errorf("%s: %+v, want matched with shadow %v", c.name, got, c.shadow)
		}
	}
}
