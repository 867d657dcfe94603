package regional_test

import (
	"context"
	"strings"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestUnleasedRegionRunsTheConfigItAdopts: a region with no global tier
// (Options.Unleased) on a live config source runs each config it adopts
// at once, raises and new classes included. Nothing will ever confirm a
// revision to it, so a share bounded by every config not yet confirmed
// past (regionsync.Chain) would keep the smallest share it ever ran and
// hold a class added later at a burst of 0 for good.
func TestUnleasedRegionRunsTheConfigItAdopts(t *testing.T) {
	src := configtest.NewSource(regiontest.MustConfig(t, oneRegion), 1)
	reg := regiontest.Start(t, src.Current(), "local", func(o *regional.Options) { o.Config = src })
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()
	seq := uint64(0)
	acquire := func(tenant, class string) *sluicev1.Grant {
		t.Helper()
		seq++
		g, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i", Incarnation: 1,
			Report: &sluicev1.KeyReport{Key: qk(tenant, class), Seq: seq, Want: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return g.GetGrant()
	}
	if g := acquire("acme", "read"); !near(g.GetRegionRate(), 1) || g.GetRegionBurst() != 100 {
		t.Fatalf("under revision 1: region rate %v, burst %v; want 1 and 100", g.GetRegionRate(), g.GetRegionBurst())
	}
	raised := strings.Replace(oneRegion, "read: {rate: 1/s, burst: 100}", "read: {rate: 5/s, burst: 200}", 1)
	src.Set(regiontest.MustConfig(t, raised), 2)
	if g := acquire("other", "read"); !near(g.GetRegionRate(), 5) || g.GetRegionBurst() != 200 {
		t.Fatalf("under revision 2, which raised read: region rate %v, burst %v; want 5 and 200", g.GetRegionRate(), g.GetRegionBurst())
	}
	added := strings.Replace(strings.Replace(raised, "  read:     {mode: lease}", "  read:     {mode: lease}\n  write:    {mode: lease}", 1),
		"free: {", "free: {write: {rate: 2/s, burst: 10}, ", 1)
	src.Set(regiontest.MustConfig(t, added), 3)
	if g := acquire("acme", "write"); !near(g.GetRegionRate(), 2) || g.GetRegionBurst() != 10 || g.GetGranted() < 1 {
		t.Fatalf("under revision 3, which added write: region rate %v, burst %v, %v granted; want 2, 10 and a token",
			g.GetRegionRate(), g.GetRegionBurst(), g.GetGranted())
	}
}
