package config

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/shard"
)

const (
	// MinEpoch is the shortest allowed epoch: below it the allocation loop
	// would spend its time on RPC round trips.
	MinEpoch = 10 * time.Millisecond
	// MinRefresh is the shortest allowed refresh (quota.MinRefresh).
	MinRefresh = quota.MinRefresh
	// MaxBurst is the largest burst (tokens): the regional scripts hold
	// tokens at micro-token resolution (see quota.MaxBurst).
	MaxBurst = quota.MaxBurst
	// MaxRate is the largest rate (tokens/s; see quota.MaxRate).
	MaxRate = quota.MaxRate
	// MaxInterval bounds epoch, grant_validity, lease_ttl and refresh, so
	// a rate times any of them stays below 2^53 tokens (exact in float64).
	MaxInterval = 24 * time.Hour
	// MaxFill bounds how long a region takes to refill a key's whole burst
	// at its static share of the rate (the least-weighted region's is the
	// longest). A key's Redis TTL is two such refills plus the grant
	// validity, so this keeps every TTL far inside what PEXPIRE accepts;
	// longer is a rate in the wrong unit, not a limit.
	MaxFill = 10 * 365 * 24 * time.Hour
	// shareSumSlack absorbs float rounding when min_share fractions such as
	// 0.1 + 0.2 + 0.7 are summed.
	shareSumSlack = 1e-9
)

// FieldError is one validation problem. It wraps ErrInvalidConfig.
type FieldError struct {
	// Path is the field path, like "tiers.free.write.rate".
	Path string
	// Message says what is wrong and what was found.
	Message string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Message }

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *FieldError) Unwrap() error { return ErrInvalidConfig }

// problems collects FieldErrors in a deterministic order.
type problems []error

func (p *problems) add(path, format string, args ...any) {
	*p = append(*p, &FieldError{Path: path, Message: fmt.Sprintf(format, args...)})
}

// Validate checks every rule and returns all problems joined (errors.Join),
// each a *FieldError naming its field path (at most MaxProblems, then a
// count of the rest), or nil. It does not apply defaults: a zero duration
// is reported as missing.
func (c *Config) Validate() error { return errors.Join(capProblems(c.problems())...) }

// ValidateContext is Validate that stops when ctx is done, returning an
// error wrapping ctx's.
func (c *Config) ValidateContext(ctx context.Context) error {
	p, err := c.problemsContext(ctx)
	if err != nil {
		return err
	}
	return errors.Join(capProblems(p)...)
}

func (c *Config) problems() []error {
	p, _ := c.problemsContext(context.Background())
	return p
}

// problemsContext collects every problem; the work is linear in the
// number of tenants and stops when ctx is done.
func (c *Config) problemsContext(ctx context.Context) ([]error, error) {
	var p problems
	c.validateCounts(&p)
	c.validateDurations(&p)
	c.validateRegions(&p)
	c.validateClasses(&p)
	c.validateTiers(&p)
	if err := c.validateTenants(ctx, &p); err != nil {
		return nil, err
	}
	c.validateEnvoy(&p)
	c.validateAuth(&p)
	c.validateDerived(&p)
	return p, nil
}

func (c *Config) validateDurations(p *problems) {
	epoch, validity := time.Duration(c.Epoch), time.Duration(c.GrantValidity)
	ttl, refresh := time.Duration(c.LeaseTTL), time.Duration(c.Refresh)
	switch {
	case epoch <= 0:
		p.add("epoch", "must be > 0, got %v", epoch)
	case epoch < MinEpoch:
		p.add("epoch", "must be at least %v, got %v", MinEpoch, epoch)
	}
	switch {
	case validity <= 0:
		p.add("grant_validity", "must be > 0, got %v", validity)
	case epoch > 0 && validity < 4*epoch:
		// Above-share grants end up to 3 epochs before V (the allocator
		// learns a donor's fallback time one epoch late), so shorter
		// validities leave recipients nothing to use.
		p.add("grant_validity", "must be at least 4 × epoch (%v), got %v", 4*epoch, validity)
	}
	if a := c.DemandAlpha; a != 0 && !(a > 0 && a <= 1) {
		p.add("demand_alpha", "must be in (0, 1], got %v", a)
	}
	if ttl <= 0 {
		p.add("lease_ttl", "must be > 0, got %v", ttl)
	}
	switch {
	case refresh <= 0:
		p.add("refresh", "must be > 0, got %v", refresh)
	case refresh < MinRefresh:
		p.add("refresh", "must be at least %v, got %v", MinRefresh, refresh)
	case ttl > 0 && refresh >= ttl/2:
		p.add("refresh", "must be less than lease_ttl / 2 (%v), got %v", ttl/2, refresh)
	}
	switch regionLease := time.Duration(c.RegionLease); {
	case regionLease <= 0:
		p.add("region_lease", "must be > 0, got %v", regionLease)
	case validity > 0 && regionLease < 2*validity:
		// Shorter, and a region would lose its static share in a
		// partition barely longer than one grant.
		p.add("region_lease", "must be at least 2 × grant_validity (%v), got %v", 2*validity, regionLease)
	case regionLease > MaxRegionLease:
		p.add("region_lease", "must be at most %v, got %v", MaxRegionLease, regionLease)
	}
	if n := c.GlobalShards; n != 0 && (n < 1 || n > shard.MaxShards) {
		p.add("global_shards", "must be in 1..%d, got %d", shard.MaxShards, n)
	}
}

func (c *Config) validateRegions(p *problems) {
	if len(c.Regions) == 0 {
		p.add("regions", "at least one region is required")
		return
	}
	var minSum float64
	drained := 0
	for _, name := range sortedKeys(c.Regions) {
		r := c.Regions[name]
		path := "regions." + name
		checkName(p, path, "region", name)
		if !(r.Weight > 0) || math.IsInf(r.Weight, 0) {
			p.add(path+".weight", "must be a finite number > 0, got %v", r.Weight)
		}
		minOK := r.MinShare >= 0 && r.MinShare <= 1
		if !minOK {
			p.add(path+".min_share", "must be in [0, 1], got %v", r.MinShare)
		}
		maxOK := r.MaxShare > 0 && r.MaxShare <= 1
		if !maxOK {
			p.add(path+".max_share", "must be in (0, 1], got %v", r.MaxShare)
		}
		if minOK && maxOK && r.MinShare > r.MaxShare {
			p.add(path+".min_share", "must not exceed max_share (%v), got %v", r.MaxShare, r.MinShare)
		}
		if minOK {
			minSum += r.MinShare
		}
		if r.Drained {
			drained++
		}
	}
	c.validateMaxShares(p)
	if drained == len(c.Regions) {
		p.add("regions", "every region is drained: at least one must serve (restore one first)")
	}
	if minSum > 1+shareSumSlack {
		p.add("regions", "min_share of all regions sums to %.6g, must be at most 1", minSum)
	}
}

// validateMaxShares refuses a max_share below the region's weight share
// (w_r / Σw, its static share of every key): the global tier grants a
// contended key at most max_share of the rate, so such a region would be
// held below what it runs on uncontended exactly when its demand grows,
// and the rest granted to regions that may not need it. Checked only when
// every weight and max_share is valid.
func (c *Config) validateMaxShares(p *problems) {
	var sum float64
	for _, r := range c.Regions {
		if !(r.Weight > 0) || math.IsInf(r.Weight, 0) || !(r.MaxShare > 0 && r.MaxShare <= 1) {
			return
		}
		sum += r.Weight
	}
	for _, name := range sortedKeys(c.Regions) {
		r := c.Regions[name]
		if share := r.Weight / sum; r.MaxShare < share*(1-shareSumSlack) {
			p.add("regions."+name+".max_share", "must be at least the region's weight share %.6g (weight %v of %v; its static share of every key), got %v: below it, a key the region needs more of would be granted less than it runs on uncontended",
				share, r.Weight, sum, r.MaxShare)
		}
	}
}

func (c *Config) validateClasses(p *problems) {
	if len(c.Classes) == 0 {
		p.add("classes", "at least one class is required")
		return
	}
	for _, name := range sortedKeys(c.Classes) {
		cl := c.Classes[name]
		path := "classes." + name
		checkClassName(p, path, name)
		switch cl.Mode {
		case ModeLease, ModeStrict:
		default:
			p.add(path+".mode", "must be lease or strict, got %q", cl.Mode)
		}
		switch cl.OnFailure {
		case OnFailureLocal, OnFailureOpen, OnFailureClosed:
		default:
			p.add(path+".on_failure", "must be local, open or closed, got %q", cl.OnFailure)
		}
		switch cl.Reclaim {
		case ReclaimReported, ReclaimNone:
		default:
			p.add(path+".reclaim", "must be reported or none, got %q", cl.Reclaim)
		}
		if cl.MaxCost < 0 || cl.MaxCost > quota.MaxCost {
			p.add(path+".max_cost", "must be in 1..%d (left out means 1), got %d", quota.MaxCost, cl.MaxCost)
		}
		if s := cl.PartitionShare; s != nil && !(*s >= 0 && *s <= 1) {
			p.add(path+".partition_share", "must be in [0, 1] (a fraction of the static share), got %v", *s)
		}
	}
}

// checkUnit refuses a burst below its class's max_cost: a request of that
// cost could never be admitted.
func checkUnit(p *problems, path string, cl Class, l LimitSpec) {
	if l.Burst >= 1 && l.Burst < cl.Unit() {
		p.add(path+".burst", "%v is below the class's max_cost %d: such a request could never be admitted", l.Burst, cl.MaxCost)
	}
}

func (c *Config) validateTiers(p *problems) {
	if len(c.Tiers) == 0 {
		p.add("tiers", "at least one tier is required")
	}
	classes := sortedKeys(c.Classes)
	for _, name := range sortedKeys(c.Tiers) {
		tier := c.Tiers[name]
		path := "tiers." + name
		checkName(p, path, "tier", name)
		for _, class := range classes {
			if _, ok := tier[class]; !ok {
				p.add(path+"."+class, "missing: every tier needs a limit for every class")
			}
		}
		for _, class := range sortedKeys(tier) {
			if _, ok := c.Classes[class]; !ok {
				p.add(path+"."+class, "class %q is not configured under classes", class)
				continue
			}
			checkLimit(p, path+"."+class, tier[class])
			checkUnit(p, path+"."+class, c.Classes[class], tier[class])
		}
	}
	switch {
	case c.DefaultTier == "":
		p.add("default_tier", "is required: the tier of tenants not listed under tenants")
	case c.Tiers[c.DefaultTier] == nil:
		p.add("default_tier", "tier %q is not configured under tiers", c.DefaultTier)
	}
}

func (c *Config) validateEnvoy(p *problems) {
	seen := make(map[EnvoyDescriptor]int, len(c.Envoy.Descriptors))
	for i, d := range c.Envoy.Descriptors {
		path := "envoy.descriptors[" + strconv.Itoa(i) + "]"
		checkDescriptorField(p, path+".domain", d.Domain, true)
		checkDescriptorField(p, path+".tenant_key", d.TenantKey, true)
		checkDescriptorField(p, path+".class_key", d.ClassKey, false)
		switch {
		case d.ClassKey == "" && d.Class == "":
			p.add(path, "set class_key (the entry naming the class) or class (a fixed class)")
		case d.ClassKey != "" && d.Class != "":
			p.add(path, "set only one of class_key (%q) and class (%q)", d.ClassKey, d.Class)
		case d.Class != "":
			if _, ok := c.Classes[d.Class]; !ok {
				p.add(path+".class", "class %q is not configured under classes", d.Class)
			}
		}
		if d.TenantKey != "" && d.TenantKey == d.ClassKey {
			p.add(path+".class_key", "must differ from tenant_key %q", d.TenantKey)
		}
		if first, dup := seen[d]; dup {
			p.add(path, "duplicates envoy.descriptors[%d]", first)
		} else {
			seen[d] = i
		}
	}
	c.validateEnvoyDomains(p)
}

func checkDescriptorField(p *problems, path, v string, required bool) {
	if v == "" {
		if required {
			p.add(path, "is required")
		}
		return
	}
	for i, r := range v {
		if r <= ' ' || r == 0x7f {
			p.add(path, "%q has a space or control character at offset %d", v, i)
			return
		}
	}
}

func checkLimit(p *problems, path string, l LimitSpec) {
	if !(l.Rate > 0) || math.IsInf(float64(l.Rate), 0) {
		p.add(path+".rate", "must be > 0, got %q", l.Rate.String())
	} else if l.Rate > MaxRate {
		p.add(path+".rate", "must be at most %d/s, got %q", MaxRate, l.Rate.String())
	}
	if !(l.Burst >= 1) || l.Burst > MaxBurst || l.Burst != math.Trunc(l.Burst) {
		p.add(path+".burst", "must be a whole number of tokens in [1, %d], got %v", MaxBurst, l.Burst)
	}
}

// checkName applies quota's id rules to a region or tier name.
func checkName(p *problems, path, what, name string) {
	if err := quota.ValidateID(what+" name", name); err != nil {
		p.add(path, "%s", quotaMessage(err))
	}
}

// checkClassName applies quota's class rules, which are also what a class
// must satisfy inside a quota.Key.
func checkClassName(p *problems, path, name string) {
	if err := (quota.Key{Tenant: "t", Class: name}).Validate(); err != nil {
		p.add(path, "%s", quotaMessage(err))
	}
}

// quotaMessage is a quota validation message without its "invalid
// argument: " prefix, which would read oddly inside a config error.
func quotaMessage(err error) string {
	return strings.TrimPrefix(err.Error(), quota.ErrInvalid.Error()+": ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// validateDerived bounds the durations from above and what the regional
// scripts derive from the limits (a key's TTL, rate x time, tokens in
// micro-tokens, with checkLimit's bounds), so no accepted config can make
// a script fail or a derived value overflow.
func (c *Config) validateDerived(p *problems) {
	for _, d := range []struct {
		name string
		v    Duration
	}{{"epoch", c.Epoch}, {"grant_validity", c.GrantValidity}, {"lease_ttl", c.LeaseTTL}, {"refresh", c.Refresh}} {
		if time.Duration(d.v) > MaxInterval {
			p.add(d.name, "must be at most %v, got %v", MaxInterval, time.Duration(d.v))
		}
	}
	fill := c.fillChecker()
	if fill == nil {
		return // bad weights are reported by validateRegions
	}
	check := func(path string, l LimitSpec) { fill(p, path, l) }
	for _, tier := range sortedKeys(c.Tiers) {
		for _, class := range sortedKeys(c.Tiers[tier]) {
			check("tiers."+tier+"."+class, c.Tiers[tier][class])
		}
	}
	// Tenants' overrides are checked by validateTenants (checkFill).
}
