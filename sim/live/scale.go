package live

import (
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
)

// scaleConfig returns a copy of c running s times faster: durations
// divided by s, rates multiplied by s, bursts unchanged.
func scaleConfig(c *config.Config, s float64) (*config.Config, error) {
	data, err := c.Marshal()
	if err != nil {
		return nil, fmt.Errorf("scale config: %w", err)
	}
	out, err := config.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("scale config: %w", err)
	}
	div := func(d config.Duration) config.Duration {
		return config.Duration(time.Duration(float64(d) / s).Round(time.Millisecond))
	}
	out.Epoch = div(out.Epoch)
	out.GrantValidity = div(out.GrantValidity)
	out.LeaseTTL = div(out.LeaseTTL)
	out.Refresh = div(out.Refresh)
	out.RegionLease = div(out.RegionLease)
	for name, tier := range out.Tiers {
		for class, l := range tier {
			l.Rate = config.Rate(float64(l.Rate) * s)
			tier[class] = l
		}
		out.Tiers[name] = tier
	}
	for name, t := range out.Tenants {
		for class, l := range t.Overrides {
			l.Rate = config.Rate(float64(l.Rate) * s)
			t.Overrides[class] = l
		}
		out.Tenants[name] = t
	}
	if err := out.Validate(); err != nil {
		return nil, fmt.Errorf("the config at scale %v is invalid (epoch at least %v): %w", s, config.MinEpoch, err)
	}
	return out, nil
}

// sessionTTL is the etcd session TTL at scale s: whole seconds, at least 1.
func sessionTTL(d time.Duration, s float64) time.Duration {
	return time.Duration(max(1, math.Round(d.Seconds()/s))) * time.Second
}
