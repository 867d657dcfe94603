package envoyrls_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestLoopbackFollowsTheLiveConfigsOnFailure: a regional process's
// loopback lease client, given LivePolicies of the process's config,
// decides its degraded requests with the class's on_failure as the config
// now says it, once the region stops answering: a key the region answered
// under open, and one it never answered, both switched to closed and back.
func TestLoopbackFollowsTheLiveConfigsOnFailure(t *testing.T) {
	const yaml = `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}}
classes: {write: {mode: strict, on_failure: %s}}
tiers: {free: {write: {rate: 1/s, burst: 5}}}
default_tier: free
`
	open := regiontest.MustConfig(t, fmt.Sprintf(yaml, "open"))
	closed := regiontest.MustConfig(t, fmt.Sprintf(yaml, "closed"))
	src := configtest.NewSource(open, 1)
	r := regiontest.Start(t, open, "local")
	lim, err := envoyrls.DialLoopback(r.Addr, nil, lease.Options{
		InstanceID: "envoy-live", Policies: envoyrls.LivePolicies(src),
		// No decision before the cut is meant to degrade, however starved.
		BreakerTimeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close(context.Background()) })
	ctx := context.Background()
	answered, fresh := quota.Key{Tenant: "acme", Class: "write"}, quota.Key{Tenant: "newco", Class: "write"}
	if d, err := lim.Allow(ctx, answered, 1); err != nil || !d.Allowed || d.Degraded {
		t.Fatalf("with the region up: %+v, %v; want its admission", d, err)
	}
	r.GRPC.Stop()
	for i, cfg := range []*config.Config{closed, open, closed} {
		src.Set(cfg, int64(i+2))
		for _, k := range []quota.Key{answered, fresh} {
			d, err := lim.Allow(ctx, k, 1)
			want := cfg == open
			if err != nil || !d.Degraded || d.Allowed != want {
				t.Errorf("%s under on_failure %s: %+v, %v; want degraded, allowed %v", k, cfg.Classes["write"].OnFailure, d, err, want)
			}
		}
	}
}

// TestLivePoliciesNamesWhatTheConfigSays: LivePolicies answers a class the
// live config names with its mode, on_failure and shadow as written, and
// false for a class the config does not name and while no config is
// loaded (the region's answer decides then), without reading a class it
// was not asked about.
func TestLivePoliciesNamesWhatTheConfigSays(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}}
classes:
  write:  {mode: strict, on_failure: closed, shadow: true}
  read:   {mode: lease, on_failure: open}
  upload: {mode: lease, on_failure: local}
tiers: {free: {write: {rate: 1/s, burst: 5}, read: {rate: 1/s, burst: 5}, upload: {rate: 1/s, burst: 5}}}
default_tier: free
`)
	src := configtest.NewSource(nil, 0)
	policies := envoyrls.LivePolicies(src)
	if p, ok := policies("write"); ok {
		t.Errorf("with no config loaded: %+v, true; want false", p)
	}
	src.Set(cfg, 1)
	for _, tc := range []struct {
		class string
		want  lease.ClassPolicy
		ok    bool
	}{
		{"write", lease.ClassPolicy{Mode: lease.ModeStrict, OnFailure: lease.PolicyClosed, Shadow: true}, true},
		{"read", lease.ClassPolicy{Mode: lease.ModeLease, OnFailure: lease.PolicyOpen}, true},
		{"upload", lease.ClassPolicy{Mode: lease.ModeLease, OnFailure: lease.PolicyLocal}, true},
		{"export", lease.ClassPolicy{}, false}, // a class the config does not name
		{"", lease.ClassPolicy{}, false},
	} {
		if p, ok := policies(tc.class); ok != tc.ok || p != tc.want {
			t.Errorf("class %q: %+v, %v; want %+v, %v", tc.class, p, ok, tc.want, tc.ok)
		}
	}
}
