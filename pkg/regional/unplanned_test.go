package regional_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestGrantOfAKeyTheConfigCannotPlanIsNotInstalled: a grant the global
// tier sends for a key the region's config cannot plan (a class it does
// not have) is not installed: OnApplied is not called for it and nothing
// is written to Redis for it. A grant for a key of the config in the same
// answer is applied.
func TestGrantOfAKeyTheConfigCannotPlanIsNotInstalled(t *testing.T) {
	ctx := context.Background()
	r := newLongEpochRig(t)
	unknown := quota.Key{Tenant: "acme", Class: "nosuch"}
	fresh := quota.Key{Tenant: "fresh", Class: "write"}
	validity := time.Duration(r.cfg.GrantValidity)
	before, err := r.rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	l, _, applied := leaderGrantedAt(t, r, validity, map[quota.Key]float64{unknown: 10, fresh: 20})
	if err := l.SyncOnce(ctx, nil); err != nil {
		t.Fatal(err)
	}
	got := applied()
	_, unknownApplied := got[unknown]
	freshRate, freshApplied := got[fresh]
	if unknownApplied {
		t.Error("OnApplied was called for the grant of a key the config cannot plan")
	}
	if !freshApplied || freshRate != 20 {
		t.Errorf("OnApplied for the fresh key: called %v at %v/s, want the grant of 20/s applied", freshApplied, freshRate)
	}
	// The round wrote only the fresh key's keys (and the static lease).
	after, err := r.rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	fk := luascripts.KeysFor(luascripts.DefaultPrefix, fresh)
	known := map[string]bool{fk.Bucket: true, fk.Leases: true, fk.Expiry: true, fk.Born: true, fk.Cand: true, staticKey: true}
	for _, k := range before {
		known[k] = true
	}
	for _, k := range after {
		if !known[k] {
			t.Errorf("the round wrote key %q, not the fresh key's", k)
		}
	}
}
