package config

import (
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

// staticShareScale shrinks every static share by a relative 1e-12 so that
// the shares of all regions never sum above the key's rate despite float
// rounding. Rounding in the weight sum, the division and the product is at
// most (n+2) × 2^-53 relative for n regions, below 1e-12 for n < 9000.
const staticShareScale = 1 - 1e-12

// Resolved is what the config says about one quota key.
type Resolved struct {
	// Limit is the key's global rate (tokens/s) and burst (tokens).
	Limit quota.Limit
	// Class is the key's class settings.
	Class Class
	// ClassName is the key's class.
	ClassName string
	// Tier is the tier the limit came from (the tenant's or DefaultTier).
	Tier string
	// Shadow is set when the class or the tenant is in shadow mode.
	Shadow bool
}

// Resolve returns the limit and class settings of k. A tenant not listed
// gets DefaultTier; a listed tenant's override for the class wins over its
// tier. An invalid key or an unknown class is an error wrapping
// quota.ErrInvalid. Resolve does not allocate unless it fails.
func (c *Config) Resolve(k quota.Key) (Resolved, error) {
	if err := k.Validate(); err != nil {
		return Resolved{}, err
	}
	class, ok := c.Classes[k.Class]
	if !ok {
		return Resolved{}, fmt.Errorf("%w: class %q is not configured", quota.ErrInvalid, k.Class)
	}
	tierName := c.DefaultTier
	tenant, listed := c.Tenants[k.Tenant]
	if listed {
		tierName = tenant.Tier
	}
	spec, ok := tenant.Overrides[k.Class]
	if !ok {
		spec, ok = c.Tiers[tierName][k.Class]
	}
	if !ok {
		// Only a config that skipped Validate gets here.
		return Resolved{}, fmt.Errorf("%w: tier %q has no limit for class %q", ErrInvalidConfig, tierName, k.Class)
	}
	return Resolved{
		Limit:     quota.Limit{Rate: float64(spec.Rate), Burst: int64(spec.Burst)},
		Class:     class,
		ClassName: k.Class,
		Tier:      tierName,
		Shadow:    class.Shadow || tenant.Shadow,
	}, nil
}

// StaticShareOf is region's safe fallback share of a resolved key while
// it holds a static lease: its rate share rate·w_r/Σw and its burst split
// in whole units of the class's MaxCost (see StaticShare). For a drained
// region it is the floor of that (FloorOf): the other regions' shares do
// not grow, so a drain frees capacity only through grants.
func (c *Config) StaticShareOf(region string, res Resolved) (rateShare, burstShare float64, err error) {
	rate, burst, err := c.staticShare(region, res.Limit.Rate, float64(res.Limit.Burst), res.Class.Unit())
	if err != nil || !c.Regions[region].Drained {
		return rate, burst, err
	}
	rate, burst = hierarchy.Floor(rate, burst, res.Class.PartitionFraction(), res.Class.Unit())
	return rate, burst, nil
}

// FloorOf is what region runs a resolved key on without a static lease:
// the class's partition_share of its undrained static share
// (hierarchy.Floor). A drained region's StaticShareOf equals it.
func (c *Config) FloorOf(region string, res Resolved) (rateShare, burstShare float64, err error) {
	rate, burst, err := c.staticShare(region, res.Limit.Rate, float64(res.Limit.Burst), res.Class.Unit())
	if err != nil {
		return 0, 0, err
	}
	rate, burst = hierarchy.Floor(rate, burst, res.Class.PartitionFraction(), res.Class.Unit())
	return rate, burst, nil
}

// PartitionShareOf is the fraction of its static share a region keeps for
// class once its static lease has lapsed: the class's partition_share, by
// default 1 for on_failure open and 0 otherwise. An unknown class gets 0,
// the conservative floor.
func (c *Config) PartitionShareOf(class string) float64 {
	cl, ok := c.Classes[class]
	if !ok {
		return 0
	}
	return cl.PartitionFraction()
}

// StaticShare is region's safe fallback share of a key with the given
// global rate (tokens/s) and burst (tokens), for a class whose largest cost
// is 1: rate·w_r/Σw (fractional), and the burst split in whole tokens by
// largest remainder (hierarchy.StaticBursts), so a burst of 1 lives in one
// region instead of a fraction of a token in each. The result is
// deterministic and the same as the global tier's; the shares of all
// regions sum to at most rate (see staticShareScale) and exactly to burst.
// An unknown region or a negative or non-finite rate or burst is an error
// wrapping quota.ErrInvalid.
func (c *Config) StaticShare(region string, rate, burst float64) (rateShare, burstShare float64, err error) {
	return c.staticShare(region, rate, burst, 1)
}

func (c *Config) staticShare(region string, rate, burst, unit float64) (rateShare, burstShare float64, err error) {
	r, ok := c.Regions[region]
	if !ok {
		return 0, 0, fmt.Errorf("%w: region %q is not configured", quota.ErrInvalid, region)
	}
	if !(rate >= 0) || math.IsInf(rate, 0) {
		return 0, 0, fmt.Errorf("%w: rate %v must be a finite number >= 0", quota.ErrInvalid, rate)
	}
	if !(burst >= 0) || math.IsInf(burst, 0) {
		return 0, 0, fmt.Errorf("%w: burst %v must be a finite number >= 0", quota.ErrInvalid, burst)
	}
	fraction := r.Weight / c.weightSum() * staticShareScale
	var buf [16]hierarchy.Region
	var bursts [16]float64
	regions, out := buf[:0], bursts[:0]
	at := 0
	for name, rg := range c.Regions {
		if name == region {
			at = len(regions)
		}
		regions = append(regions, hierarchy.Region{Name: name, Weight: rg.Weight})
		out = append(out, 0)
	}
	hierarchy.StaticBursts(burst, unit, regions, out)
	return rate * fraction, out[at], nil
}

// weightSum adds the region weights in name order, so the float result
// does not depend on map iteration order. Selecting the next name by a scan
// is quadratic but allocation-free, and region counts are small.
func (c *Config) weightSum() float64 {
	var sum float64
	prev, started := "", false
	for range len(c.Regions) {
		next, found := "", false
		for name := range c.Regions {
			if (!started || name > prev) && (!found || name < next) {
				next, found = name, true
			}
		}
		sum += c.Regions[next].Weight
		prev, started = next, true
	}
	return sum
}

// DemandWindow is the shortest window over which the regional scripts
// measure one instance's demand rate: half the refresh, in whole
// milliseconds and at least 1ms. Instances report at every refresh, so a
// window closes at about every Sync, while a refill report in between
// (a busy instance's pool running low) rarely ends one early: windows much
// shorter than a refresh make noisy readings.
func (c *Config) DemandWindow() time.Duration {
	return max(time.Millisecond, (time.Duration(c.Refresh) / 2).Truncate(time.Millisecond))
}
