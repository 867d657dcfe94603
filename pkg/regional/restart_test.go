package regional_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/regional"
)

// lease_ttl (1s) well below grant_validity (5s).
const shortLeases = `
epoch: 1s
grant_validity: 5s
lease_ttl: 1s
refresh: 200ms
regions: {local: {weight: 1}}
classes:
  export: {mode: strict, on_failure: closed}
tiers:
  free: {export: {rate: 50/s, burst: 20}}
default_tier: free
`

// TestRestartWaitsOutGrantValidity: Redis lost its data 2 s ago (longer
// than one lease TTL, shorter than one grant validity). The lost bucket may
// have held a grant below the region's static share whose capacity another
// region still uses, so a bucket created now must not start with tokens
// refilled since born + lease TTL: it waits max(lease TTL, grant validity
// + one epoch) from born.
func TestRestartWaitsOutGrantValidity(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, shortLeases)
	ctx := context.Background()
	bornAt := func(ago time.Duration) *regional.RestartGuard {
		reg := regiontest.StartOn(t, rs, cfg, "local")
		now := reg.RedisNow(t)
		if err := reg.RDB.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		born := now.Add(-ago).UnixMicro()
		if err := reg.RDB.Set(ctx, luascripts.DefaultPrefix+"born", strconv.FormatInt(born, 10), 0).Err(); err != nil {
			t.Fatal(err)
		}
		g := regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartConservative, nil)
		if err := g.Check(ctx, reg.RDB); err != nil {
			t.Fatal(err)
		}
		return g
	}
	check := func(g *regional.RestartGuard) bool {
		reg := regiontest.StartOn(t, rs, cfg, "local", func(o *regional.Options) { o.Guard = g })
		resp, err := sluicev1.NewLeaseServiceClient(reg.Dial(t)).Check(ctx, &sluicev1.CheckRequest{Key: qk("acme", "export"), Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAllowed()
	}
	if check(bornAt(2 * time.Second)) {
		t.Fatalf("2s after a data loss (lease TTL 1s, grant validity 5s) a new bucket admitted: it was credited refill since born + lease TTL")
	}
	if !check(bornAt(7 * time.Second)) {
		t.Fatalf("7s after a data loss (past grant validity + one epoch) a new bucket admitted nothing")
	}
}
