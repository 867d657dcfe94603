package regional_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// startLeadingAllocator starts an allocator daemon on loopback ports under
// prefix, serving src's config, and returns once it leads. Its session of
// 10 s keeps it leading throughout: with 1 s it stopped leading on a
// starved machine ("session lease refresh lapsed") and the regions'
// reports were refused. It campaigns at once on an empty election, so it
// leads within a few session TTLs.
func startLeadingAllocator(ctx context.Context, t *testing.T, cli *clientv3.Client, prefix string, src *configtest.Source) *allocator.Daemon {
	t.Helper()
	d, err := allocator.StartDaemon(ctx, allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Etcd: cli, Prefix: prefix, SessionTTL: 10 * time.Second,
		Config: src,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	awaitAllocatorLeader(t, d, 10*time.Second)
	return d
}

// serviceTier hands region reports to the allocator daemon's Service in
// process.
type serviceTier struct{ s *allocator.Service }

func (g serviceTier) Sync(ctx context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	return g.s.Sync(ctx, r)
}

func weightsConfig(t *testing.T, eu, us float64) *config.Config {
	t.Helper()
	c, err := config.Parse(fmt.Appendf(nil, `
regions: {eu: {weight: %g}, us: {weight: %g}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`+confirmTiming, eu, us))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestWeightRaiseWaitsForEveryRegion: eu adopts a larger weight while us,
// cut off from etcd, keeps the old one. eu's static share must not rise
// until the global tier confirms that every region runs the new revision;
// us's smaller share applies the moment it adopts it. Real Redis per
// region, the real allocator daemon, the real region leader's reports.
func TestWeightRaiseWaitsForEveryRegion(t *testing.T) {
	ctx := context.Background()
	old, grown := weightsConfig(t, 1, 1), weightsConfig(t, 3, 1) // eu 50/s → 75/s, us 50/s → 25/s
	globalSrc, regions := startLeadRegions(ctx, t, "/cc", old)
	key := quota.Key{Tenant: "acme", Class: "write"}
	static := func(name string) float64 {
		r := regions[name]
		_, c, _, err := r.srv.CommonFor(r.src.Current(), key)
		if err != nil {
			t.Fatal(err)
		}
		return c.StaticRate
	}
	sync := func(name string) {
		if err := regions[name].leader.SyncOnce(ctx, nil); err != nil {
			t.Fatalf("%s: sync: %v", name, err)
		}
	}
	check := func(step string, wantEU, wantUS float64) {
		t.Helper()
		eu, us := static("eu"), static("us")
		if eu+us > 100*(1+1e-9) {
			t.Errorf("%s: static rates eu %v + us %v exceed r = 100", step, eu, us)
		}
		if !near(eu, wantEU) || !near(us, wantUS) {
			t.Errorf("%s: static rates eu %v us %v, want %v and %v", step, eu, us, wantEU, wantUS)
		}
	}
	sync("eu")
	sync("us")
	check("both on the old weights", 50, 50)

	globalSrc.Set(grown, 20)
	regions["eu"].src.Set(grown, 20) // us is cut off from etcd
	check("eu adopted the larger weight", 50, 50)
	sync("eu")
	sync("us")
	sync("eu")
	check("global heard eu on the new revision and us on the old one", 50, 50)

	regions["us"].src.Set(grown, 20)
	check("us adopted its smaller weight", 50, 25)
	sync("us") // every region has reported revision 20 now
	sync("eu")
	check("every region reported revision 20, not confirmed yet", 50, 25)
	syncUntilConfirmed(ctx, t, grown, 20, regions["eu"], regions["us"])
	check("the global tier confirmed revision 20", 75, 25)
}

func near(a, b float64) bool { return a >= b*(1-1e-9)-1e-9 && a <= b*(1+1e-9)+1e-9 }

// TestLeaderStoresTheConfirmedRevisionForItsReplicas: the region leader
// stores in the region's Redis each config revision the global tier
// confirms to it, for the region's other replicas to apply: none before a
// confirmation, then revision 10 once every region reported it, then 20.
func TestLeaderStoresTheConfirmedRevisionForItsReplicas(t *testing.T) {
	ctx := context.Background()
	old, grown := weightsConfig(t, 1, 1), weightsConfig(t, 3, 1)
	globalSrc, regions := startLeadRegions(ctx, t, "/cs", old)
	sync := func(name string) {
		t.Helper()
		if err := regions[name].leader.SyncOnce(ctx, nil); err != nil {
			t.Fatalf("%s: sync: %v", name, err)
		}
	}
	stored := func(name string) string {
		t.Helper()
		v, err := regions[name].rdb.Get(ctx, luascripts.DefaultPrefix+"confirmed").Result()
		if errors.Is(err, redis.Nil) {
			return "none"
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	sync("eu") // us never heard: nothing is confirmed yet
	if got := stored("eu"); got != "none" {
		t.Fatalf("eu stored confirmed revision %s before us ever reported, want none", got)
	}
	sync("us")
	sync("eu")
	for _, name := range []string{"eu", "us"} {
		if got := stored(name); got != "10" {
			t.Fatalf("%s stored confirmed revision %s, want 10", name, got)
		}
	}
	globalSrc.Set(grown, 20)
	for _, name := range []string{"eu", "us"} {
		regions[name].src.Set(grown, 20)
	}
	syncUntilConfirmed(ctx, t, grown, 20, regions["eu"], regions["us"])
	for _, name := range []string{"eu", "us"} {
		if got := stored(name); got != "20" {
			t.Fatalf("%s stored confirmed revision %s, want 20", name, got)
		}
		// Kept until the next confirmation: replicas read it once an epoch.
		if ttl, err := regions[name].rdb.PTTL(ctx, luascripts.DefaultPrefix+"confirmed").Result(); err != nil || ttl != -1 {
			t.Fatalf("%s's stored confirmed revision has TTL %v (%v), want none", name, ttl, err)
		}
	}
}
