package regional_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestLeaderReportIsolatedPerClusterMaster: region eu on a real
// three-master Redis Cluster, us on a redis-server, the real allocator on
// embedded etcd, both region leaders real; eu's demand far above its
// static share on four keys, two of them on the master that is paused
// (SIGSTOP) for region_lease and two grant validities. The healthy
// masters' keys keep grants above eu's static share throughout (the
// report goes on for them), the paused master's keys lapse to the static
// share (their grants end, never the floor: the region's static lease
// goes on), Σ usable rates and caps never exceed the key's limit
// (checkpoints), and once the master runs again its keys are granted
// again. Run with the paused master holding the static lease
// (sl:{static}:lease: Redis TIME from another master, the leader's own
// lease) and with another one. Before, every epoch report failed while
// the master was paused: the healthy keys' grants ended after a validity
// and the whole region fell to its floor after region_lease.
func TestLeaderReportIsolatedPerClusterMaster(t *testing.T) {
	t.Run("static lease's master", func(t *testing.T) { leaderClusterMasterPaused(t, true) })
	t.Run("another master", func(t *testing.T) { leaderClusterMasterPaused(t, false) })
}

func leaderClusterMasterPaused(t *testing.T, staticMaster bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	procs := redistest.StartClusterProcs(t, 3, "--cluster-require-full-coverage", "no")
	var addrs []string
	for _, p := range procs {
		addrs = append(addrs, p.Addr())
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ReadTimeout: time.Second, WriteTimeout: time.Second, DialTimeout: time.Second})
	t.Cleanup(func() { cc.Close() })
	masterOf := func(key string) string {
		c, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return c.Options().Addr
	}
	paused := masterOf(staticKey)
	if !staticMaster {
		for _, a := range addrs {
			if a != paused {
				paused = a
				break
			}
		}
	}
	var clock *redis.Client
	for _, a := range addrs {
		if a != paused && clock == nil {
			clock = redis.NewClient(&redis.Options{Addr: a})
			t.Cleanup(func() { clock.Close() })
		}
	}
	var hung, healthy []quota.Key
	for i := 0; len(hung) < 2 || len(healthy) < 2; i++ {
		k := quota.Key{Tenant: fmt.Sprintf("tenant-%d", i), Class: "write"}
		if masterOf(luascripts.ClusterKeysFor(luascripts.DefaultPrefix, k).Bucket) == paused {
			if len(hung) < 2 {
				hung = append(hung, k)
			}
		} else if len(healthy) < 2 {
			healthy = append(healthy, k)
		}
	}

	r := newShardRig(t, etcdtest.Start(t), 1)
	// Epochs long enough for a cluster's 16,384 candidate sets on a
	// loaded machine.
	r.src.Next(regiontest.MustConfig(t, `
epoch: 400ms
grant_validity: 2s
region_lease: 5s
lease_ttl: 1s
refresh: 100ms
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease, partition_share: 0.5}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`))
	cfg := r.src.Current()
	epoch, validity, regionLease := time.Duration(cfg.Epoch), time.Duration(cfg.GrantValidity), time.Duration(cfg.RegionLease)
	r.keys = append(append([]quota.Key{}, healthy...), hung...)
	r.startShard(ctx, 0)
	r.startRegionOn(ctx, "eu", cc, clock)
	r.startRegion(ctx, "us")
	r.demand(ctx, "eu", 40) // 400/s per key: far above eu's static 50/s
	r.demand(ctx, "us", 1)  // 10/s per key
	checking := make(chan struct{})
	cctx, stopChecks := context.WithCancel(ctx)
	go func() {
		defer close(checking)
		for cctx.Err() == nil {
			r.checkpoint(cctx)
			time.Sleep(5 * time.Millisecond) // the checkpoints' pace
		}
	}()
	defer func() { stopChecks(); <-checking }()

	// granted: eu holds a grant of k above its static share at Redis
	// time nowUS (held: any grant).
	granted := func(k quota.Key, nowUS int64) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		g := r.applied["eu"][k]
		return g.rate > 60 && g.expiryUS > nowUS
	}
	held := func(k quota.Key, nowUS int64) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.applied["eu"][k].expiryUS > nowUS
	}
	nowUS := func() int64 {
		now, err := clock.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now.UnixMicro()
	}
	static := func(k quota.Key) float64 {
		_, c, _, err := r.regions["eu"].srv.CommonFor(r.src.Current(), k)
		if err != nil {
			t.Fatal(err)
		}
		return c.StaticRate
	}
	r.phase.Store("before the pause")
	r.waitFor("eu holds more than its static share of every key", 40*validity, func() bool {
		at := nowUS()
		for _, k := range r.keys {
			if !granted(k, at) {
				return false
			}
		}
		return true
	})

	r.phase.Store("master paused")
	var proc interface{ Resume() error }
	for _, p := range procs {
		if p.Addr() == paused {
			if err := p.Pause(); err != nil {
				t.Fatal(err)
			}
			proc = p
		}
	}
	resumed := false
	defer func() {
		if !resumed {
			proc.Resume()
		}
	}()
	pausedAt := time.Now()
	answersAtPause := r.answersTo("eu")
	// Paused for region_lease and two validities: past every grant eu held
	// then, and past the static lease the last answer before the pause
	// conferred. Polled throughout.
	hold := regionLease + 2*validity
	// A healthy key's grant is renewed every report; one may end a few
	// milliseconds before the next install (a short grant, a round that
	// waited on the paused master once), but never for longer than
	// gapMax. (Before, they all ended a validity into the pause.)
	gapMax := 3 * epoch
	lapsed := map[quota.Key]bool{}
	lastHeld := map[quota.Key]time.Time{}
	for _, k := range healthy {
		lastHeld[k] = pausedAt
	}
	for time.Since(pausedAt) < hold {
		r.check()
		at := nowUS()
		for _, k := range healthy {
			if held(k, at) {
				lastHeld[k] = time.Now()
			}
			if time.Since(lastHeld[k]) > gapMax {
				t.Fatalf("%v into the pause: healthy key %v held no grant for %v (last applied %+v, Redis time %d; eu answered %d times since the pause began, %v failed syncs)",
					time.Since(pausedAt).Round(time.Millisecond), k, gapMax, r.appliedOf("eu", k), at, r.answersTo("eu")-answersAtPause, r.regions["eu"].failedSyncs(t))
			}
		}
		for _, k := range hung {
			if !granted(k, at) {
				lapsed[k] = true
			}
		}
		time.Sleep(10 * time.Millisecond) // polling until the pause's end
	}
	if len(lapsed) != len(hung) {
		t.Fatalf("the paused master's keys kept their grants: lapsed %v of %v", lapsed, hung)
	}
	// region_lease after the pause began the region still runs on its
	// static share (the report goes on, and its static lease with it).
	for _, k := range r.keys {
		if got := static(k); !near(got, staticRate) {
			t.Fatalf("%v into the pause: key %v on %v/s, want its static share %v (not the floor %v)",
				time.Since(pausedAt).Round(time.Millisecond), k, got, staticRate, floorRate)
		}
	}

	r.phase.Store("master resumed")
	if err := proc.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	r.waitFor("the resumed master's keys granted again", 40*validity+10*epoch, func() bool {
		at := nowUS()
		for _, k := range r.keys {
			if !granted(k, at) {
				return false
			}
		}
		return true
	})
	r.check()
}

func (r *shardRig) appliedOf(region string, k quota.Key) appliedGrant {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applied[region][k]
}
