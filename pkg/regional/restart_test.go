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

// TestRestartNewBucketEarnsNothingDuringTheWait: a bucket created inside
// the wait after a Redis data loss starts empty and earns nothing until
// the wait ends (born + max(lease TTL, grant validity + one epoch)), then
// refills at the static rate: over [restart, restart + wait + t] it admits
// at most static rate × t, every instant measured on Redis time. (The
// scripts once refilled such a bucket from its creation.)
func TestRestartNewBucketEarnsNothingDuringTheWait(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, shortLeases)
	ctx := context.Background()
	wait := max(time.Duration(cfg.LeaseTTL), time.Duration(cfg.GrantValidity)+time.Duration(cfg.Epoch))
	const rate = 50.0 // the only region's static rate
	// margin is how long the wait still runs when the bucket is created;
	// doubled when the test was starved past all of it before its first
	// check.
	for margin := time.Second; ; margin *= 2 {
		setup := regiontest.StartOn(t, rs, cfg, "local")
		now := setup.RedisNow(t)
		if err := setup.RDB.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		born := now.Add(margin - wait)
		if err := setup.RDB.Set(ctx, luascripts.DefaultPrefix+"born", strconv.FormatInt(born.UnixMicro(), 10), 0).Err(); err != nil {
			t.Fatal(err)
		}
		g := regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartConservative, nil)
		if err := g.Check(ctx, setup.RDB); err != nil {
			t.Fatal(err)
		}
		reg := regiontest.StartOn(t, rs, cfg, "local", func(o *regional.Options) { o.Guard = g })
		lc := sluicev1.NewLeaseServiceClient(reg.Dial(t))
		warmEnd := born.Add(wait)
		end := warmEnd.Add(500 * time.Millisecond)
		var during, admitted int
		var last time.Time
		for last.Before(end) {
			resp, err := lc.Check(ctx, &sluicev1.CheckRequest{Key: qk("acme", "export"), Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			last = reg.RedisNow(t) // the check ran before this instant
			if last.Before(warmEnd) {
				during++
				if resp.GetAllowed() {
					t.Fatalf("a bucket created %v before the end of the restart wait admitted %v before it ended",
						margin, warmEnd.Sub(last))
				}
				if ra := time.Duration(resp.GetRetryAfterMs()) * time.Millisecond; ra < warmEnd.Sub(last) {
					t.Fatalf("denied %v before the end of the restart wait with Retry-After %v", warmEnd.Sub(last), ra)
				}
			}
			if resp.GetAllowed() {
				admitted++
			}
		}
		if during == 0 {
			if margin >= 16*time.Second {
				t.Fatalf("starved past a %v margin: no check ran inside the restart wait", margin)
			}
			continue
		}
		after := last.Sub(warmEnd)
		if bound := int(rate * after.Seconds()); admitted > bound {
			t.Fatalf("admitted %d over [restart, restart + wait + %v], more than the static rate allows after the wait: %d",
				admitted, after, bound)
		}
		if admitted == 0 {
			t.Fatalf("nothing admitted in the %v after the restart wait", after)
		}
		return
	}
}
