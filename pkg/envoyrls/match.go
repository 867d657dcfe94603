package envoyrls

import (
	"fmt"
	"math"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Target is one descriptor of a request after resolution: a quota key to
// charge (Matched), an unlimited descriptor, or unmatched; the last two
// are answered OK and charge nothing.
type Target struct {
	// Matched says the descriptor charges Key. It is false for a
	// descriptor no envoy.descriptors mapping or envoy.domains tree
	// matches, for one whose own hits_addend is 0 (it needs no token) and
	// for an Unlimited one; Key, Cost and Resolved are then zero.
	Matched bool
	// Key is the quota key the descriptor charges.
	Key quota.Key
	// Cost is the tokens the descriptor charges: its own hits_addend, else
	// the request's, else 1.
	Cost int64
	// Never means the descriptor is over limit without asking the
	// limiter, and charges nothing: its cost exceeds what one request on
	// the key can ever be admitted (the key's burst, or quota.MaxCost).
	Never bool
	// Resolved is Key's limit and class from the config.
	Resolved config.Resolved
	// Shadow means the descriptor is never refused: its verdict is
	// counted, and the answer is OK. Set when the tree node says
	// shadow_mode or the class or tenant is in shadow mode.
	Shadow bool
	// Unlimited means an envoy.domains node with unlimited: true decided
	// the descriptor: it is answered OK and charges nothing (Matched is
	// false).
	Unlimited bool
}

// Resolve validates the whole request and maps each descriptor to its
// Target, in the request's order, without side effects, so that a request
// with any bad part can be refused before anything is charged. It is a
// pure function of its arguments. Every error wraps quota.ErrInvalid and
// names the field.
func Resolve(cfg *config.Config, req *rlsv3.RateLimitRequest) ([]Target, error) {
	return resolveInto(nil, cfg, req)
}

// resolveInto is Resolve appending to dst[:0] (whose room it uses when
// there is enough).
func resolveInto(dst []Target, cfg *config.Config, req *rlsv3.RateLimitRequest) ([]Target, error) {
	domain := req.GetDomain()
	if domain == "" {
		return nil, fmt.Errorf("%w: domain is empty", quota.ErrInvalid)
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, fmt.Errorf("%w: descriptors: the request has none; Envoy sends at least one", quota.ErrInvalid)
	}
	requestCost := int64(req.GetHitsAddend())
	if requestCost == 0 {
		requestCost = 1
	}
	targets := dst[:0]
	if cap(targets) < len(descs) {
		targets = make([]Target, 0, len(descs))
	}
	targets = targets[:len(descs)]
	tree := cfg.EnvoyTree(domain)
	for i, d := range descs {
		t, err := resolveDescriptor(cfg.Envoy.Descriptors, cfg.Classes, domain, d, requestCost)
		if err == nil && !t.Matched && tree != nil {
			t, err = resolveTree(tree, d, requestCost)
		}
		if err != nil {
			return nil, fmt.Errorf("descriptors[%d]: %w", i, err)
		}
		if t.Matched {
			if t.Resolved, err = cfg.Resolve(t.Key); err != nil {
				return nil, fmt.Errorf("descriptors[%d] (tenant %q, class %q): %w", i, t.Key.Tenant, t.Key.Class, err)
			}
			t.Shadow = t.Shadow || t.Resolved.Shadow
			// No wait admits such a cost (the limiter would refuse it as
			// invalid): it is over limit, as envoyproxy/ratelimit answers
			// a hit count above the limit.
			t.Never = t.Cost > min(t.Resolved.Limit.Burst, quota.MaxCost)
		}
		targets[i] = t
	}
	return targets, nil
}

// resolveDescriptor finds the first mapping of domain that d matches and
// checks the parts of d that Sluice acts on. A class_key entry naming no
// class of classes does not match (it is no Sluice limit). Descriptors
// that match no mapping are returned unmatched and their other fields are
// not examined: they may be meant for limits Sluice does not own.
func resolveDescriptor(mappings []config.EnvoyDescriptor, classes map[string]config.Class, domain string, d *ratelimitv3.RateLimitDescriptor, requestCost int64) (Target, error) {
	entries := d.GetEntries()
	if len(entries) == 0 {
		return Target{}, fmt.Errorf("%w: entries: the descriptor has none", quota.ErrInvalid)
	}
	for _, m := range mappings {
		if m.Domain != domain {
			continue
		}
		tenant, ok, err := entryValue(entries, m.TenantKey)
		if err != nil {
			return Target{}, err
		}
		if !ok {
			continue
		}
		class := m.Class
		if m.ClassKey != "" {
			if class, ok, err = entryValue(entries, m.ClassKey); err != nil {
				return Target{}, err
			}
			if _, known := classes[class]; !ok || !known {
				continue
			}
		}
		cost, err := descriptorCost(d, requestCost)
		if err != nil || cost == 0 {
			return Target{}, err
		}
		return Target{Matched: true, Key: quota.Key{Tenant: MappingTenant(tenant), Class: class}, Cost: cost}, nil
	}
	return Target{}, nil
}

// resolveTree walks the domain's tree with d's entries, one level per
// entry (see config.EnvoyNode): exact value first, then the first
// wildcard pattern (a value holding *) that matches, then the node without
// a value; no other branch is tried. The node the last entry reaches
// decides.
func resolveTree(tree *config.EnvoyDomain, d *ratelimitv3.RateLimitDescriptor, requestCost int64) (Target, error) {
	entries := d.GetEntries()
	if len(entries) == 0 {
		return Target{}, fmt.Errorf("%w: entries: the descriptor has none", quota.ErrInvalid)
	}
	nodes := tree.Descriptors
	var node *config.EnvoyNode
	// The values of the entries no exact node (nor a pattern with
	// share_threshold) matched: a path has at most config.MaxEnvoyDepth
	// levels.
	var wildArr [config.MaxEnvoyDepth]string
	wild := wildArr[:0]
	for i, e := range entries {
		node = matchNode(nodes, e.GetKey(), e.GetValue())
		if node == nil {
			return Target{}, nil
		}
		if !node.Named() {
			wild = append(wild, e.GetValue())
		}
		if i < len(entries)-1 {
			nodes = node.Descriptors
		}
	}
	switch {
	case node.Unlimited:
		return Target{Unlimited: true}, nil
	case node.Class == "":
		return Target{}, nil
	}
	key := quota.Key{Tenant: TreeTenant(wild...), Class: node.Class}
	cost, err := descriptorCost(d, requestCost)
	if err != nil || cost == 0 {
		return Target{}, err
	}
	return Target{Matched: true, Key: key, Cost: cost, Shadow: node.ShadowMode}, nil
}

// matchNode picks the node of one level for an entry: exact value, else
// the first matching wildcard pattern, else the node without a value.
func matchNode(nodes []config.EnvoyNode, key, value string) *config.EnvoyNode {
	var pattern, any *config.EnvoyNode
	for i := range nodes {
		n := &nodes[i]
		if n.Key != key {
			continue
		}
		switch {
		case n.Value == "":
			any = n
		case n.Exact():
			if n.Value == value {
				return n
			}
		case pattern == nil && config.MatchValue(n.Value, value):
			pattern = n
		}
	}
	if pattern != nil {
		return pattern
	}
	return any
}

// entryValue is the value of the entry with key k. The same key twice with
// different values is ambiguous and refused rather than guessed.
func entryValue(entries []*ratelimitv3.RateLimitDescriptor_Entry, k string) (string, bool, error) {
	value, found := "", false
	for i, e := range entries {
		if e.GetKey() != k {
			continue
		}
		if found && e.GetValue() != value {
			return "", false, fmt.Errorf("%w: entries[%d]: key %q appears again with value %q after %q",
				quota.ErrInvalid, i, k, e.GetValue(), value)
		}
		value, found = e.GetValue(), true
	}
	return value, found, nil
}

// descriptorCost applies the descriptor's own hits_addend and refuses the
// descriptor fields Sluice cannot honour. A cost of 0 (a hits_addend of 0)
// needs no token: the descriptor is admitted without a bucket.
func descriptorCost(d *ratelimitv3.RateLimitDescriptor, requestCost int64) (int64, error) {
	if d.GetIsNegativeHits() {
		return 0, fmt.Errorf("%w: is_negative_hits: Sluice does not refund tokens", quota.ErrInvalid)
	}
	if d.GetLimit() != nil {
		return 0, fmt.Errorf("%w: limit: per-descriptor limit overrides are not supported; limits come from the Sluice config (tiers, tenants)",
			quota.ErrInvalid)
	}
	if d.GetHitsAddend() == nil {
		return requestCost, nil
	}
	return int64(min(d.GetHitsAddend().GetValue(), math.MaxInt64)), nil
}
