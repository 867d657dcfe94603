package main

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestLeaseAndCheckAgainstARegionRemovedFromTheConfig: a replica whose
// region was removed from the config answers; lease and check say what it
// answered and exit 4 (no such region), not 5 with a hint that it may not
// be running.
func TestLeaseAndCheckAgainstARegionRemovedFromTheConfig(t *testing.T) {
	const withRegion = `
regions: {us-east: {weight: 1}, eu-west: {weight: 1}}
classes: {read: {mode: lease}, export: {mode: strict, on_failure: closed}}
tiers: {free: {read: {rate: 10/s, burst: 10}, export: {rate: 1/s, burst: 1}}}
default_tier: free
`
	with := regiontest.MustConfig(t, withRegion)
	var src regiontest.SwappedConfig
	src.Store(with)
	reg := regiontest.Start(t, with, "eu-west", func(o *regional.Options) { o.Config = &src })
	src.Store(regiontest.MustConfig(t, strings.Replace(withRegion, ", eu-west: {weight: 1}", "", 1)))

	for _, args := range [][]string{
		{"lease", "-addr", reg.Addr, "-tenant", "t1", "-class", "read"},
		{"check", "-addr", reg.Addr, "-tenant", "t1", "-class", "export"},
	} {
		r := sluicectl(t, "", args...)
		wantCode(t, r, exitNotFound)
		wantContains(t, "stderr", r.stderr, `region "eu-west" is not in the live config`)
		if strings.Contains(r.stderr, "is the regional service running there") {
			t.Errorf("%s: %s", args[0], r.stderr)
		}
	}
}
