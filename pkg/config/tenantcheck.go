package config

import (
	"context"
	"errors"
	"math"

	"github.com/sluicehq/sluice/pkg/quota"
)

// validateCounts refuses more regions, classes, tiers or tenants than the
// documented maxima.
func (c *Config) validateCounts(p *problems) {
	for _, l := range []struct {
		path, limit string
		n, max      int
	}{
		{"regions", "config.MaxRegions", len(c.Regions), MaxRegions},
		{"classes", "config.MaxClasses", len(c.Classes), MaxClasses},
		{"tiers", "config.MaxTiers", len(c.Tiers), MaxTiers},
		{"tenants", "config.MaxTenants", len(c.Tenants), MaxTenants},
	} {
		if l.n > l.max {
			*p = append(*p, &FieldError{Path: l.path, Message: (&LimitError{Limit: l.limit, Max: int64(l.max), Got: int64(l.n), What: l.path}).Error()})
		}
	}
}

// validateTenants checks every tenant (TenantProblems), in name order.
func (c *Config) validateTenants(ctx context.Context, p *problems) error {
	fill := c.fillChecker()
	for i, id := range sortedKeys(c.Tenants) {
		if i%ctxCheckEvery == 0 {
			if err := canceled(ctx); err != nil {
				return err
			}
		}
		c.tenantProblems(p, fill, id, c.Tenants[id])
	}
	return nil
}

// TenantProblems checks one tenant against c's tiers, classes and regions,
// as Validate checks each listed tenant: all its problems joined, each a
// *FieldError, or nil. It is what lets one tenant change be checked
// without checking every other tenant; c itself must be valid.
func (c *Config) TenantProblems(id string, t Tenant) error {
	var p problems
	c.tenantProblems(&p, c.fillChecker(), id, t)
	return errors.Join(p...)
}

func (c *Config) tenantProblems(p *problems, fill func(*problems, string, LimitSpec), id string, t Tenant) {
	path := "tenants." + id
	if err := quota.ValidateID("tenant id", id); err != nil {
		p.add(path, "%s", quotaMessage(err))
	}
	switch {
	case t.Tier == "":
		p.add(path+".tier", "is required")
	case c.Tiers[t.Tier] == nil:
		p.add(path+".tier", "tier %q is not configured under tiers", t.Tier)
	}
	for _, class := range sortedKeys(t.Overrides) {
		opath := path + ".overrides." + class
		if _, ok := c.Classes[class]; !ok {
			p.add(opath, "class %q is not configured under classes", class)
			continue
		}
		checkLimit(p, opath, t.Overrides[class])
		checkUnit(p, opath, c.Classes[class], t.Overrides[class])
		if fill != nil {
			fill(p, opath, t.Overrides[class])
		}
	}
}

// fillChecker returns the check that a limit's burst refills within
// MaxFill at the least-weighted region's static share, or nil when the
// region weights are invalid (validateRegions reports them). The share's
// fraction is computed once, as staticShare computes it, so each check is
// constant time.
func (c *Config) fillChecker() func(p *problems, path string, l LimitSpec) {
	least, sum := "", 0.0
	for _, name := range sortedKeys(c.Regions) {
		w := c.Regions[name].Weight
		if !(w > 0) || math.IsInf(w, 0) {
			return nil
		}
		sum += w
		if least == "" || w < c.Regions[least].Weight {
			least = name
		}
	}
	if least == "" {
		return nil
	}
	fraction := c.Regions[least].Weight / c.weightSum() * staticShareScale
	return func(p *problems, path string, l LimitSpec) {
		if !(l.Rate > 0) || float64(l.Rate) > MaxRate || !(l.Burst >= 1) || l.Burst > MaxBurst {
			return // reported by checkLimit
		}
		share := float64(l.Rate) * fraction
		if fill := l.Burst / share; !(fill <= MaxFill.Seconds()) {
			p.add(path+".rate", "%q is too slow for burst %v: region %s (weight %v of %v) would take %.3g s to refill it at its static share, more than %v",
				l.Rate.String(), l.Burst, least, c.Regions[least].Weight, sum, fill, MaxFill)
		}
	}
}
