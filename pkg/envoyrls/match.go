package envoyrls

import (
	"fmt"
	"strconv"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// target is one descriptor of a request after validation: either a quota
// key to charge, or unmatched.
type target struct {
	matched bool
	key     quota.Key
	cost    int64
	res     config.Resolved
}

// resolveRequest validates the whole request and maps each descriptor to
// its target, without side effects, so that a request with any bad part
// can be refused before anything is charged. Every error wraps
// quota.ErrInvalid and names the field.
func resolveRequest(cfg *config.Config, req *rlsv3.RateLimitRequest) ([]target, error) {
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
	if err := quota.ValidateCost(requestCost); err != nil {
		return nil, fmt.Errorf("hits_addend: %w", err)
	}
	targets := make([]target, len(descs))
	for i, d := range descs {
		t, err := resolveDescriptor(cfg.Envoy.Descriptors, domain, d, requestCost)
		if err != nil {
			return nil, fmt.Errorf("descriptors[%d]: %w", i, err)
		}
		if t.matched {
			if t.res, err = cfg.Resolve(t.key); err != nil {
				return nil, fmt.Errorf("descriptors[%d] (tenant %q, class %q): %w", i, t.key.Tenant, t.key.Class, err)
			}
			// The limiter refuses such a cost too, but only when its turn
			// comes, after earlier descriptors were charged.
			if t.cost > t.res.Limit.Burst {
				return nil, fmt.Errorf("descriptors[%d] (tenant %q, class %q): %w: cost %d exceeds the key's burst %d, so it can never be admitted",
					i, t.key.Tenant, t.key.Class, quota.ErrInvalid, t.cost, t.res.Limit.Burst)
			}
		}
		targets[i] = t
	}
	return targets, nil
}

// resolveDescriptor finds the first mapping of domain that d matches and
// checks the parts of d that Sluice acts on. Descriptors that match no
// mapping are returned unmatched and their other fields are not examined:
// they may be meant for limits Sluice does not own.
func resolveDescriptor(mappings []config.EnvoyDescriptor, domain string, d *ratelimitv3.RateLimitDescriptor, requestCost int64) (target, error) {
	entries := d.GetEntries()
	if len(entries) == 0 {
		return target{}, fmt.Errorf("%w: entries: the descriptor has none", quota.ErrInvalid)
	}
	for _, m := range mappings {
		if m.Domain != domain {
			continue
		}
		tenant, ok, err := entryValue(entries, m.TenantKey)
		if err != nil {
			return target{}, err
		}
		if !ok {
			continue
		}
		class := m.Class
		if m.ClassKey != "" {
			if class, ok, err = entryValue(entries, m.ClassKey); err != nil {
				return target{}, err
			}
			if !ok {
				continue
			}
		}
		key := quota.Key{Tenant: tenant, Class: class}
		if err := key.Validate(); err != nil {
			return target{}, fmt.Errorf("%s: %w", mappingFields(m), err)
		}
		cost, err := descriptorCost(d, requestCost)
		if err != nil {
			return target{}, err
		}
		return target{matched: true, key: key, cost: cost}, nil
	}
	return target{}, nil
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
// descriptor fields Sluice cannot honour.
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
	v := d.GetHitsAddend().GetValue()
	if v == 0 {
		return 0, fmt.Errorf("%w: hits_addend is 0; Sluice charges at least 1 token (leave it unset to use the request's)", quota.ErrInvalid)
	}
	if v > quota.MaxCost {
		return 0, fmt.Errorf("%w: hits_addend %s exceeds the maximum cost %d", quota.ErrInvalid, strconv.FormatUint(v, 10), quota.MaxCost)
	}
	return int64(v), nil
}

// mappingFields names the entries a mapping reads, for error messages.
func mappingFields(m config.EnvoyDescriptor) string {
	if m.ClassKey != "" {
		return fmt.Sprintf("entries %q and %q", m.TenantKey, m.ClassKey)
	}
	return fmt.Sprintf("entry %q (class %q fixed by the mapping)", m.TenantKey, m.Class)
}
