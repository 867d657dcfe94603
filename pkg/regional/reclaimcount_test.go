package regional_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestLeaderReadCountsReclaimedTokens: the region leader's state read of a
// key reaps a lease its instance stopped renewing, and the tokens it gives
// back are counted in sluice_regional_reclaimed_tokens_total, as a Sync's
// or a Check's reaping is (operations.md's instance-crash runbook checks
// this counter). Only the leader's reads touch this key after the lease
// expired.
func TestLeaderReadCountsReclaimedTokens(t *testing.T) {
	cfg := regiontest.MustConfig(t, "lease_ttl: 1s\nrefresh: 200ms\n"+watchedKeyConfig)
	r := newLeaseRigWith(t, cfg)
	r.reported() // the first answer confers the static lease
	d := newDemandDriver(r)
	d.open(leaseKey)
	d.demand(40, leaseKey) // a candidate: the leader reads it each round
	if got := r.reported(); !slices.Equal(got, []quota.Key{leaseKey}) {
		t.Fatalf("report names %v, want only %v", got, leaseKey)
	}
	if got := r.counter("sluice_regional_reclaimed_tokens_total"); got != 0 {
		t.Fatalf("reclaimed %v tokens with the lease live, want 0", got)
	}
	// The instance is gone: its lease (one token, unspent) expires one
	// lease TTL after its last report, on Redis's clock.
	r.waitRedisPast(t, r.redisUS()+time.Second.Microseconds())
	r.reported()
	if got := r.counter("sluice_regional_reclaimed_tokens_total"); got < 1 {
		t.Fatalf("reclaimed %v tokens after the leader read the key past its lease's expiry, want the lease's unspent tokens", got)
	}
}

// TestGrantInstallCountsTheTokensItsScriptReclaims: a grant installed for
// a key the leader did not read (not a candidate: an idle key a donor
// holds) reaps the lease its instance stopped renewing, and the tokens
// set_rate gives back are counted in sluice_regional_reclaimed_tokens_total
// as a read's are.
func TestGrantInstallCountsTheTokensItsScriptReclaims(t *testing.T) {
	ctx := context.Background()
	cfg := regiontest.MustConfig(t, "lease_ttl: 1s\nrefresh: 200ms\n"+watchedKeyConfig)
	r := newLeaseRigWith(t, cfg)
	r.reported() // the first answer confers the static lease
	d := newDemandDriver(r)
	d.open(leaseKey) // one token leased, no demand: not a candidate
	// The instance is gone: its lease expires one lease TTL after its
	// report, on Redis's clock.
	r.waitRedisPast(t, r.redisUS()+time.Second.Microseconds())
	if got := r.counter("sluice_regional_reclaimed_tokens_total"); got != 0 {
		t.Fatalf("reclaimed %v tokens before the grant, want 0", got)
	}
	l, tier, applied := leaderGrantedAt(t, r, time.Duration(cfg.GrantValidity), map[quota.Key]float64{leaseKey: 10})
	if err := l.SyncOnce(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// The grant (10/s, under the static share) is acknowledged at once, so
	// a second report names the key; the first, before the grant, must not.
	for _, k := range tier.first.Load().GetKeys() {
		if k.GetKey().GetTenant() == leaseKey.Tenant && k.GetKey().GetClass() == leaseKey.Class {
			t.Fatal("the leader read the key before the grant: its read, not the install, reaped the lease")
		}
	}
	if _, ok := applied()[leaseKey]; !ok {
		t.Fatal("the grant was not installed")
	}
	if got := r.counter("sluice_regional_reclaimed_tokens_total"); got < 1 {
		t.Fatalf("reclaimed %v tokens after installing a grant past the lease's expiry, want the lease's unspent tokens", got)
	}
}

// waitRedisPast waits until Redis's clock is past us (µs), within a minute.
func (r *leaseRig) waitRedisPast(t *testing.T, us int64) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); r.redisUS() <= us; {
		if time.Now().After(deadline) {
			t.Fatalf("Redis's clock did not pass %d within a minute", us)
		}
		time.Sleep(10 * time.Millisecond) // polling Redis's clock with a deadline
	}
}
