package regional_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// exchangeLog is a link to the global tier that keeps the last report sent
// and the answer it got.
type exchangeLog struct {
	inner  regional.GlobalTier
	mu     sync.Mutex
	report *sluicev1.RegionReport
	answer *sluicev1.RegionGrants
}

func (l *exchangeLog) Sync(ctx context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	g, err := l.inner.Sync(ctx, r)
	l.mu.Lock()
	l.report, l.answer = r, g
	l.mu.Unlock()
	return g, err
}

// last is eu's held grant for leaseKey in the last report (rate, valid ms)
// and the grant the answer gave it (nil if none).
func (l *exchangeLog) last() (heldRate float64, heldValidMs int64, g *sluicev1.KeyGrant) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, kd := range l.report.GetKeys() {
		if kd.GetKey().GetTenant() == leaseKey.Tenant && kd.GetKey().GetClass() == leaseKey.Class {
			heldRate, heldValidMs = kd.GetHeldRate(), kd.GetHeldValidMs()
		}
	}
	for _, kg := range l.answer.GetGrants() {
		if kg.GetKey().GetTenant() == leaseKey.Tenant && kg.GetKey().GetClass() == leaseKey.Class {
			g = kg
		}
	}
	return heldRate, heldValidMs, g
}

// TestConfigRebuildReissuesHeldGrantsWithTheirExpiry: region eu (real
// Redis, the real region leader's reports) holds a grant above its static
// share of 50/s, with more than a second left, when the global tier's
// config changes its epoch and grant validity (300ms / 5s to 200ms / 1s)
// and the allocator daemon rebuilds its allocator in learning mode. eu's
// next report echoes the grant, and the answer re-issues it with the
// validity it has left, not cut to the new 1s; the report after that still
// holds it.
func TestConfigRebuildReissuesHeldGrantsWithTheirExpiry(t *testing.T) {
	ctx := context.Background()
	const yaml = `
epoch: 300ms
grant_validity: 5s
lease_ttl: 1m
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`
	cfg := regiontest.MustConfig(t, yaml)
	src := configtest.NewSource(cfg, 1)
	r := newLeaseRigOn(t, cfg, src)
	log := &exchangeLog{inner: r.tier.inner}
	r.tier.inner = log
	r.reported() // the first answer confers the static lease
	d := newDemandDriver(r)
	d.open(leaseKey)
	d.demand(200, leaseKey) // four times eu's static share
	// us reports no demand for the key, echoing the grant it holds, so eu
	// may have most of it.
	var useq uint64
	var usHeld *sluicev1.KeyGrant
	var usUntil time.Time
	us := func() {
		t.Helper()
		useq++
		sent := time.Now()
		kd := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: leaseKey.Tenant, Class: leaseKey.Class}, WindowMs: 300}
		if usHeld != nil && sent.Before(usUntil) {
			kd.HeldRate, kd.HeldBurst, kd.HeldValidMs = usHeld.GetRate(), usHeld.GetBurst(), usUntil.Sub(sent).Milliseconds()
		}
		rep := &sluicev1.RegionReport{Region: "us", Seq: useq, ConfigRevisions: []int64{src.Revision()}, Keys: []*sluicev1.KeyDemand{kd}}
		g, err := r.alloc.Service.Sync(ctx, rep)
		if err != nil {
			t.Fatal(err)
		}
		for _, kg := range g.GetGrants() {
			usHeld, usUntil = kg, sent.Add(time.Duration(kg.GetValidMs())*time.Millisecond)
		}
	}
	epoch, validity := time.Duration(cfg.Epoch), time.Duration(cfg.GrantValidity)
	// Budget: the allocator's learning (one validity) and the first
	// grants, with room for a busy machine.
	deadline := time.Now().Add(40*validity + 40*epoch)
	for {
		if time.Now().After(deadline) {
			t.Fatal("eu never held a grant above its static share")
		}
		us()
		r.syncOnce(ctx, r.leader)
		if _, _, g := log.last(); g != nil && g.GetRate() > 50 && g.GetValidMs() > 3000 {
			break
		}
	}

	src.Set(regiontest.MustConfig(t, strings.Replace(strings.Replace(yaml, "epoch: 300ms", "epoch: 200ms", 1),
		"grant_validity: 5s", "grant_validity: 1s", 1)), 2)
	r.syncOnce(ctx, r.leader)
	held, validMs, g := log.last()
	if validMs <= 1000 {
		// The answer just before was valid for more than 3s from its
		// report, which this one follows at once.
		t.Fatalf("eu reported its grant with %dms left after the change, want more than the new validity of 1s (a round took that long)", validMs)
	}
	if !r.alloc.Service.View(time.Now()).Learning {
		t.Fatal("the allocator is not learning after the change")
	}
	if g == nil || g.GetValidMs() != validMs || g.GetRate() > held || g.GetRate() < held*(1-1e-12) {
		t.Fatalf("eu held %v for %dms more at the change; the answer re-issued %v, want the same grant for the same %dms", held, validMs, g, validMs)
	}
	r.syncOnce(ctx, r.leader)
	if held2, validMs2, _ := log.last(); held2 != g.GetRate() || validMs2 <= 0 || validMs2 > validMs {
		t.Fatalf("after the re-issue eu reported holding %v for %dms more, want the re-issued %v with up to %dms left", held2, validMs2, g.GetRate(), validMs)
	}
}
