package config

import (
	"strconv"
	"strings"
)

// MaxEnvoyDepth bounds the nesting of envoy.domains descriptors: Envoy
// builds a descriptor from a route's rate_limits actions, one entry per
// action, and no route needs more levels than this.
const MaxEnvoyDepth = 16

// EnvoyTenantShared is the tenant of a descriptor matched by an
// envoy.domains path whose every node names its value: every request on
// that path shares one bucket of the node's class.
const EnvoyTenantShared = "_"

// EnvoyDomain is the descriptor tree of one Envoy domain, in the shape of
// an envoyproxy/ratelimit config file (domain and nested descriptors), so
// such files carry over node for node (sluicectl import envoy-ratelimit).
type EnvoyDomain struct {
	// Domain is the Envoy rate-limit domain the tree decides.
	//
	//   - Required
	//   - Rule: no spaces or control characters; each domain at most once
	//     under envoy.domains
	//   - Example: edge
	Domain string `yaml:"domain"`
	// Descriptors are the tree's first level: a request descriptor's first
	// entry selects one of them.
	//
	//   - Required
	//   - Rule: at least one
	Descriptors []EnvoyNode `yaml:"descriptors"`
}

// EnvoyNode is one node of an envoy.domains tree. A request descriptor of
// n entries walks the tree one entry per level: at each level the node
// with the entry's key and exactly its value wins, else the first node
// with the key whose value is a wildcard pattern (holds a *) that the
// entry's value matches, else the node with the key and no value;
// nothing is retried on another branch. The node the last entry reaches
// decides the descriptor (class, unlimited) when it says how; otherwise,
// or when the walk stops early, the descriptor is unmatched (OK, charged
// to no key).
//
// A pattern's * stands for any run of bytes, none too, anywhere in the
// value ("/api/*" is a prefix, "/api/*/action" matches "/api/v2/action",
// "/api/*/x/*" has two wildcards); the other bytes match themselves.
// There is no escape: a value with a * is always a pattern, matched as
// envoyproxy/ratelimit matches it (its releases from before it took a *
// before the end as a wildcard matched such a * as itself).
//
// The quota key charged is (tenant, class): the tenant is made of the
// values of the entries matched by nodes without an exact value (no
// value, or a pattern without share_threshold), in order: joined by ":"
// when they are plain (letters, digits and . _ @ -), else their digest
// (envoyrls.TreeTenant), so each distinct value has its own bucket as in
// envoyproxy/ratelimit; or "_" (EnvoyTenantShared) when the path names
// every value (exact values, patterns with share_threshold). Tenants
// listed under tenants get their tier.
type EnvoyNode struct {
	// Key is the descriptor entry key this node matches.
	//
	//   - Required
	//   - Rule: no spaces or control characters; no two nodes of one list
	//     have the same key and value
	//   - Example: remote_address
	Key string `yaml:"key"`
	// Value is the entry value this node matches: exactly, or as a
	// wildcard pattern when it holds a * (each * matches any run of
	// bytes, none too, anywhere in the value, as in envoyproxy/ratelimit;
	// a pattern whose only * ends it is a prefix); left out, any value. A
	// value matched by a pattern without share_threshold, or by a node
	// without a value, becomes part of the tenant.
	//
	//   - Default: none: any value
	//   - Rule: no control characters
	//   - Example: /api/*
	Value string `yaml:"value,omitempty"`
	// ShareThreshold makes every value this node's pattern matches share
	// one bucket (envoyproxy/ratelimit's share_threshold): the matched
	// value is left out of the tenant, as an exact value is. Without it
	// each matching value has a bucket of its own.
	//
	//   - Default: false
	//   - Rule: needs a value holding a *
	//   - Example: true
	ShareThreshold bool `yaml:"share_threshold,omitempty"`
	// Class is the limit of descriptors that end at this node: they charge
	// (tenant, class) at the class's limit in the tenant's tier.
	//
	//   - Default: none: descriptors ending here are unmatched unless
	//     unlimited is set
	//   - Rule: must name a class under classes; not with unlimited
	//   - Example: per_ip
	Class string `yaml:"class,omitempty"`
	// Unlimited answers descriptors that end at this node OK and charges
	// nothing (envoyproxy/ratelimit's unlimited: true, and its descriptors
	// without a limit that take precedence over a wildcard sibling).
	//
	//   - Default: false
	//   - Rule: not with class or shadow_mode
	//   - Example: true
	Unlimited bool `yaml:"unlimited,omitempty"`
	// ShadowMode decides descriptors that end at this node as usual and
	// counts the verdict (shadow_denied in
	// sluice_envoy_decisions_total), but always answers OK.
	//
	//   - Default: false
	//   - Rule: needs class
	//   - Example: true
	ShadowMode bool `yaml:"shadow_mode,omitempty"`
	// Descriptors are the nodes of the next level, for descriptors with
	// more entries.
	//
	//   - Default: none
	//   - Rule: at most 16 levels in all (MaxEnvoyDepth); a node without
	//     class, unlimited or descriptors is refused (it would do nothing)
	Descriptors []EnvoyNode `yaml:"descriptors,omitempty"`
}

// Exact reports whether the node matches one value only (its value is set
// and holds no *).
func (n *EnvoyNode) Exact() bool {
	return n.Value != "" && strings.IndexByte(n.Value, '*') < 0
}

// Pattern reports whether the node's value is a wildcard pattern (holds a
// *).
func (n *EnvoyNode) Pattern() bool {
	return strings.IndexByte(n.Value, '*') >= 0
}

// Named reports whether the entry value the node matches stays out of the
// tenant: an exact value, or a pattern with share_threshold.
func (n *EnvoyNode) Named() bool {
	return n.Exact() || n.ShareThreshold && n.Pattern()
}

// MatchValue reports whether value matches pattern, where each * of
// pattern stands for any run of bytes (none too) and every other byte
// for itself. It allocates nothing.
func MatchValue(pattern, value string) bool {
	head, rest, ok := strings.Cut(pattern, "*")
	if !ok {
		return pattern == value
	}
	if !strings.HasPrefix(value, head) {
		return false
	}
	value = value[len(head):]
	i := strings.LastIndexByte(rest, '*')
	tail := rest[i+1:]
	if !strings.HasSuffix(value, tail) {
		return false
	}
	value = value[:len(value)-len(tail)]
	if i < 0 {
		return true
	}
	// The pieces between the first and the last * in order, each at its
	// earliest place: a later place leaves less room for the next.
	for mid := rest[:i]; ; {
		piece, more, found := strings.Cut(mid, "*")
		j := strings.Index(value, piece)
		if j < 0 {
			return false
		}
		value = value[j+len(piece):]
		if !found {
			return true
		}
		mid = more
	}
}

// EnvoyTree returns the envoy.domains tree of domain, or nil.
func (c *Config) EnvoyTree(domain string) *EnvoyDomain {
	for i := range c.Envoy.Domains {
		if c.Envoy.Domains[i].Domain == domain {
			return &c.Envoy.Domains[i]
		}
	}
	return nil
}

func (c *Config) validateEnvoyDomains(p *problems) {
	seen := make(map[string]int, len(c.Envoy.Domains))
	for i, d := range c.Envoy.Domains {
		path := "envoy.domains[" + strconv.Itoa(i) + "]"
		checkDescriptorField(p, path+".domain", d.Domain, true)
		if first, dup := seen[d.Domain]; dup && d.Domain != "" {
			p.add(path+".domain", "domain %q is already under envoy.domains[%d]", d.Domain, first)
		} else {
			seen[d.Domain] = i
		}
		if len(d.Descriptors) == 0 {
			p.add(path+".descriptors", "at least one descriptor is required")
		}
		c.validateEnvoyNodes(p, path+".descriptors", d.Descriptors, 1)
	}
}

func (c *Config) validateEnvoyNodes(p *problems, path string, nodes []EnvoyNode, depth int) {
	if depth > MaxEnvoyDepth {
		p.add(path, "nested more than %d levels deep", MaxEnvoyDepth)
		return
	}
	type kv struct{ key, value string }
	seen := make(map[kv]int, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		npath := path + "[" + strconv.Itoa(i) + "]"
		checkDescriptorField(p, npath+".key", n.Key, true)
		for j, r := range n.Value {
			if r < ' ' || r == 0x7f {
				p.add(npath+".value", "%q has a control character at offset %d", n.Value, j)
				break
			}
		}
		if first, dup := seen[kv{n.Key, n.Value}]; dup {
			p.add(npath, "duplicates %s[%d] (key %q, value %q)", path, first, n.Key, n.Value)
		} else {
			seen[kv{n.Key, n.Value}] = i
		}
		if n.ShareThreshold && !n.Pattern() {
			p.add(npath+".share_threshold", "needs a value holding a * (a wildcard pattern): a node without a value gives each value its own bucket, an exact value has one")
		}
		switch {
		case n.Class != "" && n.Unlimited:
			p.add(npath, "set only one of class (%q) and unlimited", n.Class)
		case n.Class != "":
			if _, ok := c.Classes[n.Class]; !ok {
				p.add(npath+".class", "class %q is not configured under classes", n.Class)
			}
		case n.ShadowMode:
			p.add(npath+".shadow_mode", "needs class: shadow mode decides a limit and answers OK")
		case !n.Unlimited && len(n.Descriptors) == 0:
			p.add(npath, "does nothing: set class, unlimited: true or nested descriptors")
		}
		c.validateEnvoyNodes(p, npath+".descriptors", n.Descriptors, depth+1)
	}
}
