package regional_test

import (
	"context"
	"sync"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
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
	tier := &grantingTier{inner: r.tier, grants: []*sluicev1.KeyGrant{
		{Key: &sluicev1.QuotaKey{Tenant: unknown.Tenant, Class: unknown.Class}, Rate: 10, Burst: 10, ValidMs: validity.Milliseconds()},
		{Key: &sluicev1.QuotaKey{Tenant: fresh.Tenant, Class: fresh.Class}, Rate: 20, Burst: 20, ValidMs: validity.Milliseconds()},
	}}
	var mu sync.Mutex
	applied := map[quota.Key]float64{}
	l, err := regional.NewLeader(r.srv, regional.LeaderOptions{
		Etcd: r.cli, ElectionPrefix: "/sl/election/", Global: tier, Identity: "eu-2",
		OnApplied: func(k quota.Key, rate, burst float64, expiryUS int64) {
			mu.Lock()
			applied[k] = rate
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SyncOnce(ctx, nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	_, unknownApplied := applied[unknown]
	freshRate, freshApplied := applied[fresh]
	mu.Unlock()
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
