package lease_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// leased runs the region as one with a global tier (not
// regional.Options.Unleased): with no leader it runs on its floor.
func leased(o *regional.Options) { o.Unleased = false }

// TestNeverOnlyAboveTheConfiguredBurst: the region answers "never" for a
// cost above its current cap, but the cap of a region with a global tier
// grows without a config change (the allocator grants it more of the
// burst), so a cost within the key's configured burst is denied with a
// wait until the client asks the region again (at most a refresh), on the
// lease and the strict path, not RetryNever. A cost above the configured
// burst is refused as invalid (no wait can cure it while the config stays
// as it is; the agent and the Envoy endpoint, which hold the config,
// answer it "never" without asking the region). (A real regional server
// and Redis.)
func TestNeverOnlyAboveTheConfiguredBurst(t *testing.T) {
	cfg := regiontest.MustConfig(t, regiontest.TwoRegionsConfig("1", 5))
	e := env{reg: regiontest.Start(t, cfg, "local", leased), cfg: cfg}
	for _, class := range []string{"read", "export"} {
		t.Run(class, func(t *testing.T) {
			c, _, _ := newClient(t, e)
			refresh := c.Table().Options().Refresh

			above := quota.Key{Tenant: "above-" + class, Class: class}
			if _, err := c.Allow(context.Background(), above, 6); !errors.Is(err, quota.ErrInvalid) {
				t.Fatalf("cost 6 against a configured burst of 5: error %v; want quota.ErrInvalid (callers holding the config answer it \"never\")", err)
			}

			within := quota.Key{Tenant: "within-" + class, Class: class}
			for range 3 { // the first answer, then the lease path's memory of it
				d := mustAllow(t, c, within, 4)
				if d.Allowed {
					t.Fatalf("cost 4 against a region cap of 2: %+v; want denied", d)
				}
				if d.RetryNever || d.RetryAfter <= 0 || d.RetryAfter > refresh {
					t.Fatalf("cost 4, within the configured burst of 5 but above the region's cap of 2: %+v; want a RetryAfter of at most the refresh %v, no RetryNever", d, refresh)
				}
			}
		})
	}
}

// TestUnleasedRegionIsNeverAboveItsCap: a region with no global tier
// (regional.Options.Unleased, -unleased) runs on its static share for
// good, and says so in its answers: its cap of 2 for a key of burst 5
// never grows without a config change. A cost within the configured burst
// but above that cap is denied with RetryNever and no RetryAfter, on the
// lease and the strict path, the first answer and the lease path's memory
// of it alike, rather than with a wait of a refresh retried in vain. A
// cost within the cap is admitted, and one the tokens out in leases keep
// from it waits (TestNeverForTokensOutInLeasesIsAWait). (A real regional
// server and Redis.)
func TestUnleasedRegionIsNeverAboveItsCap(t *testing.T) {
	cfg := regiontest.MustConfig(t, regiontest.TwoRegionsConfig("", 5))
	e := env{reg: regiontest.Start(t, cfg, "local"), cfg: cfg}
	for _, class := range []string{"read", "export"} {
		t.Run(class, func(t *testing.T) {
			c, _, _ := newClient(t, e)
			key := quota.Key{Tenant: "acme-" + class, Class: class}
			for i := range 3 { // the first answer, then the lease path's memory of it
				d := mustAllow(t, c, key, 4)
				if d.Allowed || !d.RetryNever || d.RetryAfter != 0 {
					t.Fatalf("request %d, cost 4 against an unleased region's cap of 2 (burst 5): %+v; want denied, RetryNever, no RetryAfter", i+1, d)
				}
				if !d.CapKnown || d.Cap != 2 {
					t.Fatalf("request %d: cap %d (known %v), want the region's 2", i+1, d.Cap, d.CapKnown)
				}
			}
			if d := mustAllow(t, c, key, 2); !d.Allowed || d.Degraded {
				t.Fatalf("cost 2, the whole cap: %+v, want allowed", d)
			}
		})
	}
}
