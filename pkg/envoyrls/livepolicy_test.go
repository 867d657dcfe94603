package envoyrls_test

import (
	"context"
	"fmt"
	"math"
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

// shareConfig: a key of 4/s, burst 4 over regions local (weight 1) and
// far (weight 3): local's static share is 1/s with burst 1, far's 3/s
// with burst 3.
const shareConfig = `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}, far: {weight: 3}}
classes: {read: {mode: lease, on_failure: local}}
tiers: {free: {read: {rate: 4/s, burst: 4}}}
default_tier: free
`

// TestLoopbackRunsANeverAnsweredKeyWithinTheRegionsShare: a regional
// process's loopback lease client, given LiveStaticShare of its config and
// region, decides a key its region never answered (out of reach from the
// start) with the local policy at no more than the region's static share,
// 1 + 1/s · t, where it ran at FallbackLimit (10 at once) whatever the
// key's limit.
func TestLoopbackRunsANeverAnsweredKeyWithinTheRegionsShare(t *testing.T) {
	cfg := regiontest.MustConfig(t, shareConfig)
	src := configtest.NewSource(cfg, 1)
	r := regiontest.Start(t, cfg, "local")
	r.GRPC.Stop() // out of reach before the loopback asks it anything
	lim, err := envoyrls.DialLoopback(r.Addr, nil, lease.Options{
		InstanceID: "envoy-share", Policies: envoyrls.LivePolicies(src),
		StaticShare: envoyrls.LiveStaticShare(src, "local"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close(context.Background()) })
	k := quota.Key{Tenant: "acme", Class: "read"}
	start := time.Now()
	admitted := 0
	for range 40 {
		d, err := lim.Allow(context.Background(), k, 1)
		if err != nil || !d.Degraded {
			t.Fatalf("with the region never reached: %+v, %v; want degraded", d, err)
		}
		if d.Allowed {
			admitted++
		}
	}
	elapsed := time.Since(start)
	if bound := int(math.Floor(1 + elapsed.Seconds())); admitted < 1 || admitted > bound {
		t.Fatalf("admitted %d of 40 in %v, want 1 to %d (burst 1 + 1/s · t of local's static share)", admitted, elapsed, bound)
	}
}

// TestLiveStaticShareIsTheConfigsShareOfTheRegion: LiveStaticShare answers
// a key with its region's static share as the config computes it
// (StaticShareOf); for a region the config does not name, or none, the
// largest share of any region; false while no config is loaded and for a
// key the config does not resolve.
func TestLiveStaticShareIsTheConfigsShareOfTheRegion(t *testing.T) {
	cfg := regiontest.MustConfig(t, shareConfig)
	k := quota.Key{Tenant: "acme", Class: "read"}
	res, err := cfg.Resolve(k)
	if err != nil {
		t.Fatal(err)
	}
	share := func(region string) quota.Limit {
		rate, burst, err := cfg.StaticShareOf(region, res)
		if err != nil {
			t.Fatal(err)
		}
		return quota.Limit{Rate: rate, Burst: int64(burst)}
	}
	src := configtest.NewSource(nil, 0)
	if l, ok := envoyrls.LiveStaticShare(src, "local")(k); ok {
		t.Errorf("with no config loaded: %+v, true; want false", l)
	}
	src.Set(cfg, 1)
	for _, tc := range []struct {
		region string
		key    quota.Key
		want   quota.Limit
		ok     bool
	}{
		{"local", k, share("local"), true},
		{"far", k, share("far"), true},
		{"", k, share("far"), true},
		{"elsewhere", k, share("far"), true},
		{"local", quota.Key{Tenant: "acme", Class: "export"}, quota.Limit{}, false},
	} {
		if l, ok := envoyrls.LiveStaticShare(src, tc.region)(tc.key); ok != tc.ok || l != tc.want {
			t.Errorf("region %q, key %s: %+v, %v; want %+v, %v", tc.region, tc.key, l, ok, tc.want, tc.ok)
		}
	}
	if l := share("local"); !(l.Rate > 0.99 && l.Rate <= 1) || l.Burst != 1 {
		t.Errorf("local's share of 4/s, burst 4 at weight 1 of 4: %+v, want 1/s and burst 1", l)
	}
}

// TestLiveTierFollowsTheConfigNow: LiveTier names the tier the config the
// process holds now resolves a key to, follows a reload that moves the
// tenant, and names none without a config or for a class the config does
// not know.
func TestLiveTierFollowsTheConfigNow(t *testing.T) {
	const yaml = `
regions: {local: {weight: 1}}
classes: {write: {}}
tiers:
  free: {write: {rate: 1/s, burst: 5}}
  pro: {write: {rate: 100/s, burst: 100}}
default_tier: free
tenants: {acme: {tier: %s}}
`
	src := configtest.NewSource(nil, 0)
	tier := envoyrls.LiveTier(src)
	acme, other := quota.Key{Tenant: "acme", Class: "write"}, quota.Key{Tenant: "other", Class: "write"}
	if got := tier(acme); got != "" {
		t.Errorf("no config loaded: tier %q, want none", got)
	}
	src.Set(regiontest.MustConfig(t, fmt.Sprintf(yaml, "pro")), 1)
	for k, want := range map[quota.Key]string{acme: "pro", other: "free", {Tenant: "acme", Class: "export"}: ""} {
		if got := tier(k); got != want {
			t.Errorf("%s: tier %q, want %q", k, got, want)
		}
	}
	src.Set(regiontest.MustConfig(t, fmt.Sprintf(yaml, "free")), 2)
	if got := tier(acme); got != "free" {
		t.Errorf("acme moved to free: tier %q, want free", got)
	}
}
