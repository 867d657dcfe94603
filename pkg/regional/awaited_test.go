package regional_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// hourlyConfig is two regions of equal weight with class write and, when
// hourly, class hourly: 100 an hour, burst 100 (50 and 50/h in each
// region), partition_share 0. us is drained when drained.
func hourlyConfig(t *testing.T, hourly, drained bool) *config.Config {
	t.Helper()
	classes, limits := "write: {mode: lease}", "write: {rate: 100/s, burst: 100}"
	if hourly {
		classes += ", hourly: {mode: lease, partition_share: 0}"
		limits += ", hourly: {rate: 100/h, burst: 100}"
	}
	c, err := config.Parse(fmt.Appendf(nil, `
regions: {eu: {weight: 1}, us: {weight: 1, drained: %v}}
classes: {%s}
tiers: {free: {%s}}
default_tier: free
`+confirmTiming, drained, classes, limits))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// confirmTiming is the epoch and grant validity of the configs of the
// tests that go through confirmations: the global tier confirms a revision
// one validity and epoch after every region reported it, 1.5 s here
// instead of the default 6 s. The epoch stays long enough for one sync
// (the region leader gives a report an epoch) on a busy machine.
const confirmTiming = "epoch: 300ms\ngrant_validity: 1200ms\n"

// storedConfirmed is the revision r's leader stored as confirmed to the
// region (-1: none).
func storedConfirmed(ctx context.Context, t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	v, err := rdb.Get(ctx, luascripts.DefaultPrefix+"confirmed").Int64()
	if errors.Is(err, redis.Nil) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// untilConfirmed calls round, one epoch of cfg apart, until each of rdbs
// holds rev as the revision confirmed to its region: the global tier
// confirms a revision one grant validity and one epoch after every region
// reported it (docs/architecture.md, "Static shares that change: make
// before break"). A round that fails (a sync cut short by its epoch on a
// busy machine) is tried again an epoch later, as a region leader does.
// It fails after 50 such waits.
func untilConfirmed(ctx context.Context, t *testing.T, cfg *config.Config, rev int64, round func() error, rdbs ...*redis.Client) {
	t.Helper()
	wait := time.Duration(cfg.Epoch + cfg.GrantValidity)
	deadline := time.Now().Add(50 * wait)
	for {
		if err := round(); err != nil {
			t.Logf("a sync failed; trying again an epoch later: %v", err)
		}
		done := true
		for _, rdb := range rdbs {
			done = done && storedConfirmed(ctx, t, rdb) == rev
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("revision %d not confirmed to every region within %v (50 times the validity and epoch)", rev, 50*wait)
		}
		time.Sleep(time.Duration(cfg.Epoch))
	}
}

// syncUntilConfirmed has regions report in turn, round after round, until
// each stored rev as confirmed to it (untilConfirmed).
func syncUntilConfirmed(ctx context.Context, t *testing.T, cfg *config.Config, rev int64, regions ...*leadRegion) {
	t.Helper()
	rdbs := make([]*redis.Client, len(regions))
	for i, r := range regions {
		rdbs[i] = r.rdb
	}
	untilConfirmed(ctx, t, cfg, rev, func() error {
		for _, r := range regions {
			if err := r.leader.SyncOnce(ctx, nil); err != nil {
				return err
			}
		}
		return nil
	}, rdbs...)
}

// leadRegion is one region of the test: its config source, its
// service, its Redis and its leader.
type leadRegion struct {
	src    *configtest.Source
	srv    *regional.Server
	rdb    *redis.Client
	leader *regional.Leader
	seq    uint64
}

// startLeadRegions starts eu and us on cfg (revision 10), each with its
// own real redis-server and region leader reporting to the allocator
// daemon's service.
func startLeadRegions(ctx context.Context, t *testing.T, prefix string, cfg *config.Config) (*configtest.Source, map[string]*leadRegion) {
	t.Helper()
	cli := etcdtest.Start(t).Client(t)
	globalSrc := configtest.NewSource(cfg, 10)
	d := startLeadingAllocator(ctx, t, cli, prefix, globalSrc)
	regions := map[string]*leadRegion{}
	for _, name := range []string{"eu", "us"} {
		src := configtest.NewSource(cfg, 10)
		rdb := redistest.Start(t).Client()
		srv, err := regional.New(regional.Options{Region: name, Redis: rdb, Config: src})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		l, err := regional.NewLeader(srv, regional.LeaderOptions{
			Etcd: cli, ElectionPrefix: prefix + "/election/", Global: serviceTier{d.Service}, Identity: name,
		})
		if err != nil {
			t.Fatal(err)
		}
		regions[name] = &leadRegion{src: src, srv: srv, rdb: rdb, leader: l}
	}
	return globalSrc, regions
}

func (r *leadRegion) sync(ctx context.Context, t *testing.T) {
	t.Helper()
	syncRetrying(ctx, t, "", r.leader)
}

// syncRetrying runs one report round of l, again (up to 20 times) while
// a round runs out of its deadline (one epoch), as it may on a machine
// starved of CPU: the leader's loop tries again the next epoch too.
// Any other failure fails the test, named by who.
func syncRetrying(ctx context.Context, t *testing.T, who string, l *regional.Leader) {
	t.Helper()
	for i := 0; ; i++ {
		err := l.SyncOnce(ctx, nil)
		if err == nil {
			return
		}
		if i >= 20 || !timedOut(err) {
			t.Fatalf("%ssync: %v", who, err)
		}
		t.Logf("%sa sync ran out of its epoch; trying again: %v", who, err)
	}
}

// acquire asks for a new lease of want tokens of key (min 1), as a lease
// client with nothing does, and returns what was granted.
func (r *leadRegion) acquire(ctx context.Context, t *testing.T, key *sluicev1.QuotaKey, want int64) *sluicev1.Grant {
	t.Helper()
	r.seq++
	resp, err := r.srv.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "poller", Incarnation: 1,
		Report: &sluicev1.KeyReport{Key: key, Seq: r.seq, Lease: r.seq, Want: want, Min: 1}})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	return resp.GetGrant()
}

// staticBurst is the static burst the region hands its scripts for key.
func (r *leadRegion) staticBurst(t *testing.T, key quota.Key) float64 {
	t.Helper()
	_, c, _, err := r.srv.CommonFor(r.src.Current(), key)
	if err != nil {
		t.Fatal(err)
	}
	return c.StaticBurst
}

// hasBucket says whether the key's bucket exists in the region's Redis.
func (r *leadRegion) hasBucket(ctx context.Context, t *testing.T, key quota.Key) bool {
	t.Helper()
	ok, err := r.rdb.HExists(ctx, luascripts.KeysFor(luascripts.DefaultPrefix, key).Bucket, "ts").Result()
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestNewClassUsedBeforeItsConfirmationStartsFull: a class added to the
// config runs a static share of 0 in a region until the global tier
// confirms the config (a raise waits for every region). A poller using it
// in that window is refused; once the confirmation reaches the region, the
// class admits its full burst there, as it does for a key first used then.
// Real Redis per region, the real allocator daemon, the real region
// leaders' reports. Before the fix the window's first request created the
// bucket empty, and after the confirmation it granted nothing: 50/h refills
// a token in 72 s.
//
// The held requests show demand, so the global tier may grant eu the key
// before the confirmation reaches it (it did on a loaded machine, where
// the confirmation took more rounds). A grant creates the bucket empty,
// as every grant does (lib.lua, "Awaited share"): then the bucket exists
// before the first request after the confirmation, which must admit no
// more than the class's rate since the class was added.
func TestNewClassUsedBeforeItsConfirmationStartsFull(t *testing.T) {
	ctx := context.Background()
	old, added := hourlyConfig(t, false, false), hourlyConfig(t, true, false)
	globalSrc, regions := startLeadRegions(ctx, t, "/aw", old)
	eu, us := regions["eu"], regions["us"]
	eu.sync(ctx, t)
	us.sync(ctx, t)
	eu.sync(ctx, t) // revision 10 confirmed, static leases conferred
	write := quota.Key{Tenant: "acme", Class: "write"}
	if b := eu.staticBurst(t, write); b != 50 {
		t.Fatalf("eu's static burst of write %v, want 50 (on its static lease)", b)
	}

	addedAt := time.Now()
	globalSrc.Set(added, 20)
	eu.src.Set(added, 20)
	us.src.Set(added, 20)
	hourly := quota.Key{Tenant: "acme", Class: "hourly"}
	key := qk(hourly.Tenant, hourly.Class)
	if b := eu.staticBurst(t, hourly); b != 0 {
		t.Fatalf("eu's static burst of the new class before confirmation %v, want 0", b)
	}
	// The window: the poller asks between every report.
	for _, step := range []func(){func() { eu.sync(ctx, t) }, func() { us.sync(ctx, t) }, func() {}} {
		if g := eu.acquire(ctx, t, key, 50); g.GetGranted() != 0 || g.GetRegionBurst() != 0 {
			t.Fatalf("before confirmation: granted %d at a cap of %v, want nothing at 0", g.GetGranted(), g.GetRegionBurst())
		}
		if eu.hasBucket(ctx, t, hourly) {
			t.Error("a request before confirmation created the new class's bucket")
		}
		step()
	}
	if b := eu.staticBurst(t, hourly); b != 0 {
		t.Fatalf("eu's static burst of the new class once every region reported it %v, want 0 until it is confirmed", b)
	}
	syncUntilConfirmed(ctx, t, added, 20, eu, us)
	if b := eu.staticBurst(t, hourly); b != 50 {
		t.Fatalf("eu's static burst of the new class after confirmation %v, want 50", b)
	}
	if eu.hasBucket(ctx, t, hourly) {
		// A grant came first (the syncs are this test's own: nothing
		// installs anything between this check and the request).
		g := eu.acquire(ctx, t, key, 50)
		if bound := math.Floor(100.0 / 3600 * time.Since(addedAt).Seconds()); float64(g.GetGranted()) > bound {
			t.Fatalf("after a grant created the held key's bucket: granted %d, above r·t = %v", g.GetGranted(), bound)
		}
		t.Logf("a grant reached eu before its first request after the confirmation: the bucket started empty, granted %d", g.GetGranted())
		return
	}
	if g := eu.acquire(ctx, t, key, 50); g.GetGranted() != 50 {
		t.Fatalf("after confirmation: granted %d of eu's burst 50 (cap %v)", g.GetGranted(), g.GetRegionBurst())
	}
}

// TestDrainedRegionComesBackWithoutABurst: a region drained at a
// partition_share of 0 runs the key at a cap of 0; a key used there
// meanwhile keeps an empty bucket, so when the region is restored (a
// raise, applied once the global tier confirms it) it climbs from nothing
// at its rate: it admits no more than r_r·t after it comes back. The
// global tier may have given its share to the other region while it was
// drained, so a full burst there would exceed b + r·t.
func TestDrainedRegionComesBackWithoutABurst(t *testing.T) {
	ctx := context.Background()
	drained, restored := hourlyConfig(t, true, true), hourlyConfig(t, true, false)
	globalSrc, regions := startLeadRegions(ctx, t, "/dr", drained)
	eu, us := regions["eu"], regions["us"]
	eu.sync(ctx, t)
	us.sync(ctx, t)
	eu.sync(ctx, t)
	us.sync(ctx, t)
	hourly := quota.Key{Tenant: "acme", Class: "hourly"}
	key := qk(hourly.Tenant, hourly.Class)
	if b := us.staticBurst(t, hourly); b != 0 {
		t.Fatalf("drained us's static burst %v, want its floor 0", b)
	}
	if g := us.acquire(ctx, t, key, 50); g.GetGranted() != 0 {
		t.Fatalf("drained us granted %d", g.GetGranted())
	}
	if !us.hasBucket(ctx, t, hourly) {
		t.Fatal("a key used in a drained region at a floor of 0 was held, not created empty")
	}
	// It does not stay for good: its keys live until the share, should it
	// come back, would have refilled the bucket twice (100 an hour, burst
	// 100: two hours), plus a second; not the largest TTL a division by
	// the rate of 0 gave (docs/architecture.md, invariant 7).
	rk := luascripts.KeysFor(luascripts.DefaultPrefix, hourly)
	for _, name := range []string{rk.Bucket} {
		want := 2*time.Hour + time.Second
		if ttl, err := us.rdb.PTTL(ctx, name).Result(); err != nil || ttl > want || ttl < want-time.Minute {
			t.Fatalf("%s in the drained region: PTTL %v (%v), want %v", name, ttl, err, want)
		}
	}

	start := time.Now()
	globalSrc.Set(restored, 20)
	eu.src.Set(restored, 20)
	us.src.Set(restored, 20)
	eu.sync(ctx, t)
	us.sync(ctx, t)
	if b := us.staticBurst(t, hourly); b != 0 {
		t.Fatalf("us's static burst once every region reported the restore %v, want its floor 0 until it is confirmed", b)
	}
	syncUntilConfirmed(ctx, t, restored, 20, eu, us)
	if b := us.staticBurst(t, hourly); b != 50 {
		t.Fatalf("restored us's static burst %v, want 50", b)
	}
	var admitted int64
	for range 5 {
		admitted += us.acquire(ctx, t, key, 50).GetGranted()
	}
	// us's rate since the restore began is at most its share, 50 an hour.
	if bound := math.Floor(50.0 / 3600 * time.Since(start).Seconds()); float64(admitted) > bound {
		t.Fatalf("restored us admitted %d within %v of the restore, above r_us·t = %v", admitted, time.Since(start), bound)
	}
}

// TestNoShareIsAwaitedOffTheStaticLease: a region off its static lease
// (here: no global tier has answered it yet) runs its floor, whatever its
// chain says. A class added by an unconfirmed config, at a partition_share
// of 0, is a floor of 0 there, not a share awaited: a key used meanwhile is
// created empty, to climb from nothing once the region's share arrives,
// since the global tier may count the region at that floor.
func TestNoShareIsAwaitedOffTheStaticLease(t *testing.T) {
	ctx := context.Background()
	old, added := hourlyConfig(t, false, false), hourlyConfig(t, true, false)
	src := configtest.NewSource(old, 10)
	rdb := redistest.Start(t).Client()
	srv, err := regional.New(regional.Options{Region: "us", Redis: rdb, Config: src})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	us := &leadRegion{src: src, srv: srv, rdb: rdb}
	src.Set(added, 20)
	hourly := quota.Key{Tenant: "acme", Class: "hourly"}
	_, c, _, err := srv.CommonFor(added, hourly)
	if err != nil {
		t.Fatal(err)
	}
	if c.StaticBurst != 0 || c.AwaitingShare {
		t.Fatalf("off its static lease, a class added at partition_share 0: burst %v, awaiting %v; want its floor 0, not awaited",
			c.StaticBurst, c.AwaitingShare)
	}
	if g := us.acquire(ctx, t, qk(hourly.Tenant, hourly.Class), 50); g.GetGranted() != 0 {
		t.Fatalf("on a floor of 0: granted %d", g.GetGranted())
	}
	if !us.hasBucket(ctx, t, hourly) {
		t.Fatal("a key used on a floor of 0 off the static lease was held, not created empty")
	}
}
