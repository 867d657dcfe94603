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
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/shard"
)

// riseKey holds shard 0's rise: the Redis time the region last came back
// from its floor.
const riseKey = staticKey + ":rise"

// storedRise is the rise stored in rdb (0: none).
func storedRise(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	v, err := rdb.Get(context.Background(), riseKey).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// commonOf is what srv hands its scripts for k under cfg now.
func commonOf(t *testing.T, srv *regional.Server, cfg *config.Config, k quota.Key) luascripts.Common {
	t.Helper()
	_, c, _, err := srv.CommonFor(cfg, k)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestStaticLeaseRiseStoredWhenItComesBackOffItsEnd: the leader stores a
// rise exactly when a lease it stores comes back after the stored one
// ended: not for the first lease on an empty Redis (a fresh region was
// never counted at its floor), not on an extension. The leader's own
// view notices it at once, the scripts get it with the key's floor while
// on the static share (none on the floor, none in steady state), so a key
// first used right after admits at most the floor's burst plus r·t (50
// before); and a replica started later reads the stored one. Real Redis, embedded etcd
// and the real allocator daemon; the lease ends by cutting the link.
func TestStaticLeaseRiseStoredWhenItComesBackOffItsEnd(t *testing.T) {
	ctx := context.Background()
	r := newLeaseRig(t)
	first, _ := r.syncStored(ctx, r.leader)
	if first == 0 {
		t.Fatal("no lease stored after conferring answers")
	}
	if got := storedRise(t, r.rdb); got != 0 {
		t.Fatalf("the first lease on an empty Redis stored a rise %d", got)
	}
	if c := commonOf(t, r.srv, r.cfg, leaseKey); !near(c.StaticRate, staticRate) || c.RiseUS != 0 {
		t.Fatalf("steady state: static rate %v, rise %d; want the share %v and no rise", c.StaticRate, c.RiseUS, staticRate)
	}
	syncPast(ctx, t, r, first, "the lease was never extended")
	if got := storedRise(t, r.rdb); got != 0 {
		t.Fatalf("an extension of a running lease stored a rise %d", got)
	}
	// Answers stop until a grant validity after the stored lease ended:
	// the global tier may have counted the region at its floor from then
	// on (regionsync.CameBack; a lease back sooner is no rise).
	r.tier.cut.Store(true)
	ended := r.stored()
	validity := time.Duration(r.cfg.GrantValidity)
	for deadline := time.Now().Add(time.Duration(r.cfg.RegionLease) + validity + 10*time.Second); r.redisUS() <= ended+validity.Microseconds(); {
		if time.Now().After(deadline) {
			t.Fatalf("the lease ending at %d never ended", ended)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := regional.RefreshStaticForTest(ctx, r.srv); err != nil {
		t.Fatal(err)
	}
	if c := commonOf(t, r.srv, r.cfg, leaseKey); !near(c.StaticRate, floorRate) || c.RiseUS != 0 {
		t.Fatalf("on the floor: static rate %v, rise %d; want the floor %v and no rise", c.StaticRate, c.RiseUS, floorRate)
	}
	// The lease comes back.
	r.tier.cut.Store(false)
	before := r.redisUS()
	// A region the global tier found lapsed meanwhile (a starved machine
	// cut it off longer) is conferred a lease again a grant validity on.
	syncPast(ctx, t, r, ended, "no lease conferred again")
	after := r.redisUS()
	// A key first used now is born as one idle through the floor: at
	// most the floor's burst at the rise, refilled at the share since
	// (before: born full at 50).
	admitted := admitAll(t, r.srv, quota.Key{Tenant: "initech", Class: "write"})
	if bound := math.Floor(25 + staticRate*float64(r.redisUS()-before)/1e6); float64(admitted) > bound {
		t.Fatalf("a key first used right after the lease came back admitted %d, above the floor's burst 25 + 50/s·t = %v", admitted, bound)
	}
	rise := storedRise(t, r.rdb)
	if rise < before || rise > after {
		t.Fatalf("stored rise %d, want the Redis time the lease came back, in [%d, %d]", rise, before, after)
	}
	c := commonOf(t, r.srv, r.cfg, leaseKey)
	if !near(c.StaticRate, staticRate) || c.RiseUS < before {
		t.Fatalf("back on the lease: static rate %v, rise %d; want the share and a rise from %d on", c.StaticRate, c.RiseUS, before)
	}
	if !near(c.FloorRate, floorRate) || c.FloorBurst != 25 {
		t.Fatalf("with a rise the floor is %v/s burst %v, want %v/s burst 25", c.FloorRate, c.FloorBurst, floorRate)
	}
	// An extension leaves it.
	syncPast(ctx, t, r, r.stored(), "the lease was never extended after it came back")
	if got := storedRise(t, r.rdb); got != rise {
		t.Fatalf("an extension moved the stored rise from %d to %d", rise, got)
	}
	// A replica started now (a restarted process) reads it.
	srv2, _ := r.replica("eu-2")
	if err := regional.RefreshStaticForTest(ctx, srv2); err != nil {
		t.Fatal(err)
	}
	if c := commonOf(t, srv2, r.cfg, leaseKey); !near(c.StaticRate, staticRate) || c.RiseUS != rise {
		t.Fatalf("a replica started after the rise: static rate %v, rise %d; want the share and the stored rise %d", c.StaticRate, c.RiseUS, rise)
	}
}

// syncPast runs report rounds of r's leader, an epoch apart, until the
// stored lease ends after end, failing with msg when none does within a
// grant validity and ten seconds.
func syncPast(ctx context.Context, t *testing.T, r *leaseRig, end int64, msg string) {
	t.Helper()
	deadline := time.Now().Add(time.Duration(r.cfg.GrantValidity) + 10*time.Second)
	for r.syncOnce(ctx, r.leader); r.stored() <= end; r.syncOnce(ctx, r.leader) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (stored lease %d, want past %d)", msg, r.stored(), end)
		}
		time.Sleep(time.Duration(r.cfg.Epoch))
	}
}

// TestLeaseReadBackAfterItsEndIsNoticedByAReplica: a replica that read a
// stored lease which then ended notices, on reading the lease conferred
// again, that it came back, and raises its own rise to its estimate of
// Redis time, stored rise or not; a replica whose first reading is that
// lease notices nothing (a process started on a running lease is not
// coming back), and neither does one that read no lease at all.
func TestLeaseReadBackAfterItsEndIsNoticedByAReplica(t *testing.T) {
	ctx := context.Background()
	cfg := leaseConfig(t)
	rdb := redistest.Start(t).Client()
	defer rdb.Close()
	newSrv := func() *regional.Server {
		srv, err := regional.New(regional.Options{Region: "eu", Redis: rdb, Config: regional.StaticConfig{C: cfg}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Close)
		return srv
	}
	now := func() int64 {
		tm, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMicro()
	}
	refresh := func(srv *regional.Server) {
		if err := regional.RefreshStaticForTest(ctx, srv); err != nil {
			t.Fatal(err)
		}
	}
	// Written directly, not by the leader's script: no stored rise.
	setLease := func(us int64) {
		if err := rdb.Set(ctx, staticKey, fmt.Sprint(us), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	saw, never := newSrv(), newSrv()
	refresh(never) // no lease in Redis
	// An ended lease, a grant validity ago: the global tier may have
	// counted the region at its floor since (regionsync.CameBack).
	setLease(now() - time.Duration(cfg.GrantValidity).Microseconds() - 1)
	refresh(saw)
	before := now()
	setLease(before + time.Hour.Microseconds())
	refresh(saw)
	refresh(never)
	fresh := newSrv()
	refresh(fresh)
	if c := commonOf(t, saw, cfg, leaseKey); !near(c.StaticRate, staticRate) || c.RiseUS < before {
		t.Fatalf("a replica that saw the lease end and come back: static rate %v, rise %d; want the share and a rise from %d on", c.StaticRate, c.RiseUS, before)
	}
	for name, srv := range map[string]*regional.Server{"first reading": fresh, "no lease read before": never} {
		if c := commonOf(t, srv, cfg, leaseKey); !near(c.StaticRate, staticRate) || c.RiseUS != 0 {
			t.Errorf("%s: static rate %v, rise %d; want the share and no rise", name, c.StaticRate, c.RiseUS)
		}
	}
}

// liftConfig is two regions of equal weight, us drained when drained, and
// class hourly: 100 an hour, burst 100, partition_share 0.5, so each
// region's share is 50/h burst 50 and its floor 25/h burst 25.
func liftConfig(t *testing.T, drained bool) *config.Config {
	t.Helper()
	c, err := config.Parse(fmt.Appendf(nil, `
regions: {eu: {weight: 1}, us: {weight: 1, drained: %v}}
classes: {hourly: {mode: lease, partition_share: 0.5}}
tiers: {free: {hourly: {rate: 100/h, burst: 100}}}
default_tier: free
`+confirmTiming, drained))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var hourlyKey = quota.Key{Tenant: "acme", Class: "hourly"}

// TestDrainLiftedRaisesTheRise: when the confirmation of a restore reaches
// a drained region, its leader stores a rise at Redis time and hands it
// to the scripts with the key's floor; a replica that applies the
// confirmation after it raises its own at least as late, and a replica
// started later reads the stored one; every shard a later config may
// name holds it. The region never drained has none.
// Real Redis per region, embedded etcd, the real allocator daemon and
// region leaders.
func TestDrainLiftedRaisesTheRise(t *testing.T) {
	ctx := context.Background()
	drained, restored := liftConfig(t, true), liftConfig(t, false)
	globalSrc, regions := startLeadRegions(ctx, t, "/lift", drained)
	eu, us := regions["eu"], regions["us"]
	syncRounds(ctx, t, regions)
	follower, err := regional.New(regional.Options{Region: "us", Redis: us.rdb, Config: us.src})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(follower.Close)
	if err := regional.RefreshStaticForTest(ctx, follower); err != nil {
		t.Fatal(err)
	}
	if c := commonOf(t, us.srv, drained, hourlyKey); c.StaticBurst != 25 || c.RiseUS != 0 {
		t.Fatalf("drained us: burst %v, rise %d; want its floor 25 and no rise", c.StaticBurst, c.RiseUS)
	}

	writeConfig(globalSrc, regions, restored, 20)
	usBefore := redisNow(t, us.rdb)
	syncUntilConfirmed(ctx, t, restored, 20, eu, us)
	usAfter := redisNow(t, us.rdb)
	c := commonOf(t, us.srv, restored, hourlyKey)
	if c.StaticBurst != 50 {
		t.Fatalf("restored us's burst %v, want 50 (the restore confirmed)", c.StaticBurst)
	}
	rise := storedRise(t, us.rdb)
	if rise < usBefore || rise > usAfter {
		t.Fatalf("us's stored rise %d, want the Redis time the restore was confirmed, in [%d, %d]", rise, usBefore, usAfter)
	}
	// Every shard a later config may name holds it too, for the keys it
	// takes over then.
	for _, i := range []int{1, shard.MaxShards - 1} {
		if got, err := us.rdb.Get(ctx, fmt.Sprintf("%s:%d", riseKey, i)).Int64(); err != nil || got != rise {
			t.Fatalf("shard %d's stored rise %d (%v), want shard 0's %d", i, got, err, rise)
		}
	}
	if c.RiseUS < rise || !near(c.FloorRate, 25.0/3600) || c.FloorBurst != 25 {
		t.Fatalf("us's leader hands rise %d, floor %v/s burst %v; want at least the stored rise %d and 25/h burst 25",
			c.RiseUS, c.FloorRate, c.FloorBurst, rise)
	}
	if c := commonOf(t, eu.srv, restored, hourlyKey); c.RiseUS != 0 {
		t.Fatalf("eu, never drained, hands a rise %d", c.RiseUS)
	}
	// A replica that applies the stored confirmation notices the lift on
	// its own (its view is not read again here).
	regional.ConfirmForTest(follower, 20)
	if c := commonOf(t, follower, restored, hourlyKey); c.StaticBurst != 50 || c.RiseUS < rise {
		t.Fatalf("a replica applying the confirmation: burst %v, rise %d; want 50 and a rise from %d on", c.StaticBurst, c.RiseUS, rise)
	}
	// A replica started now runs the restored config as confirmed and
	// reads the stored rise.
	started, err := regional.New(regional.Options{Region: "us", Redis: us.rdb, Config: us.src})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(started.Close)
	if err := regional.RefreshStaticForTest(ctx, started); err != nil {
		t.Fatal(err)
	}
	if c := commonOf(t, started, restored, hourlyKey); c.StaticBurst != 50 || c.RiseUS != rise {
		t.Fatalf("a replica started after the restore: burst %v, rise %d; want 50 and the stored rise %d", c.StaticBurst, c.RiseUS, rise)
	}
}

// failRiseWrites is a fault injector on a Redis client: the script that
// raises every shard's rise (a drain lifted) fails, as on a timeout.
type failRiseWrites struct{}

func (failRiseWrites) DialHook(next redis.DialHook) redis.DialHook { return next }

func (failRiseWrites) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (failRiseWrites) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 4 && fmt.Sprint(args[3]) == riseKey {
			err := errors.New("injected: the rise write timed out")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// TestDrainLiftedWhoseRiseWriteFailsStillRises: when the leader cannot
// store the rise of a drain lifted, it still applies and stores the
// confirmation, and hands its scripts a rise of its own (its estimate of
// Redis time then).
func TestDrainLiftedWhoseRiseWriteFailsStillRises(t *testing.T) {
	ctx := context.Background()
	drained, restored := liftConfig(t, true), liftConfig(t, false)
	globalSrc, regions := startLeadRegions(ctx, t, "/fail", drained)
	us := regions["us"]
	syncRounds(ctx, t, regions)
	us.rdb.AddHook(failRiseWrites{})
	writeConfig(globalSrc, regions, restored, 20)
	usBefore := redisNow(t, us.rdb)
	syncUntilConfirmed(ctx, t, restored, 20, regions["eu"], us)
	if got, err := us.rdb.Get(ctx, "sl:confirmed").Result(); err != nil || got != "20" {
		t.Fatalf("stored confirmed revision %q (%v), want 20 despite the failed rise write", got, err)
	}
	if got := storedRise(t, us.rdb); got != 0 {
		t.Fatalf("a rise %d stored through the injected failure", got)
	}
	if c := commonOf(t, us.srv, restored, hourlyKey); c.StaticBurst != 50 || c.RiseUS < usBefore {
		t.Fatalf("us after a failed rise write: burst %v, rise %d; want 50 and its own rise from %d on", c.StaticBurst, c.RiseUS, usBefore)
	}
}

// TestKeyIdleAcrossADrainComesBackAtItsFloor: a key used in us before it
// was drained, then idle until the restore is confirmed, and a key first
// used after the restore, admit at most the floor's burst (25) plus
// 50/h·t right after it, not the 49 and 50 they held or were born with:
// the global tier counted us at its floor while drained and may have
// given the rest to eu, who may have spent it. Real Redis per region,
// embedded etcd, the real allocator daemon and region leaders, the real
// scripts.
func TestKeyIdleAcrossADrainComesBackAtItsFloor(t *testing.T) {
	ctx := context.Background()
	drained, restored := liftConfig(t, true), liftConfig(t, false)
	globalSrc, regions := startLeadRegions(ctx, t, "/idle", restored)
	us := regions["us"]
	syncRounds(ctx, t, regions)
	idle, fresh := qk("acme", "hourly"), qk("initech", "hourly")
	if g := us.acquire(ctx, t, idle, 1); g.GetGranted() != 1 {
		t.Fatalf("before the drain: granted %d of 1", g.GetGranted())
	}
	writeConfig(globalSrc, regions, drained, 20)
	syncUntilConfirmed(ctx, t, drained, 20, regions["eu"], us)
	if b := us.staticBurst(t, hourlyKey); b != 25 {
		t.Fatalf("drained us's burst %v, want its floor 25", b)
	}
	start := time.Now()
	writeConfig(globalSrc, regions, restored, 30)
	syncUntilConfirmed(ctx, t, restored, 30, regions["eu"], us)
	if b := us.staticBurst(t, hourlyKey); b != 50 {
		t.Fatalf("restored us's burst %v, want 50", b)
	}
	bound := math.Floor(25 + 50.0/3600*time.Since(start).Seconds())
	var admitted int64
	for range 3 {
		admitted += us.acquire(ctx, t, idle, 50).GetGranted()
	}
	if float64(admitted) > bound {
		t.Fatalf("the key idle across the drain admitted %d right after the restore, above the floor 25 + 50/h·t", admitted)
	}
	admitted = 0
	for range 3 {
		admitted += us.acquire(ctx, t, fresh, 50).GetGranted()
	}
	if float64(admitted) > bound {
		t.Fatalf("a key first used after the restore admitted %d, above the floor 25 + 50/h·t", admitted)
	}
}

// admitAll spends every token of k's bucket in srv through Check and
// returns how many it admitted.
func admitAll(t *testing.T, srv *regional.Server, k quota.Key) int {
	t.Helper()
	for n := 0; ; n++ {
		resp, err := srv.Check(context.Background(), &sluicev1.CheckRequest{Key: qk(k.Tenant, k.Class), Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetAllowed() {
			return n
		}
		if n > 1000 {
			t.Fatal("the bucket never ran dry")
		}
	}
}

// redisNow is rdb's Redis time (µs).
func redisNow(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	tm, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

// raiseConfig is two regions of weights eu and us and class hourly: 100 an
// hour, burst 100, partition_share 1 (the floor is the whole share: no
// floor behind any rise here).
func raiseConfig(t *testing.T, eu, us float64) *config.Config {
	t.Helper()
	c, err := config.Parse(fmt.Appendf(nil, `
regions: {eu: {weight: %g}, us: {weight: %g}}
classes: {hourly: {mode: lease, partition_share: 1}}
tiers: {free: {hourly: {rate: 100/h, burst: 100}}}
default_tier: free
`+confirmTiming, eu, us))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestWeightRaiseCreditsTheOldShareBeforeIt: eu's weight triples. us adopts
// its smaller share at once, but may have spent its old one just before;
// once the global tier confirms the change eu runs 75 an hour, burst 75,
// where it ran 50 — and a key eu left idle across the confirmation, or first
// uses after it, is credited the old share until the confirmation and the
// new one only since: it admits at most 50 + 75/h·t, not 75 (which it did
// before the confirmation's rise was passed to the scripts: above b + r·t
// by the raise). The rise is dated when eu applied the confirmation. Real
// Redis per region, embedded etcd, the real allocator daemon and region
// leaders, the real scripts.
func TestWeightRaiseCreditsTheOldShareBeforeIt(t *testing.T) {
	ctx := context.Background()
	old, grown := raiseConfig(t, 1, 1), raiseConfig(t, 3, 1)
	globalSrc, regions := startLeadRegions(ctx, t, "/raise", old)
	eu := regions["eu"]
	syncRounds(ctx, t, regions)
	idle, fresh := qk("acme", "hourly"), qk("initech", "hourly")
	if g := eu.acquire(ctx, t, idle, 1); g.GetGranted() != 1 {
		t.Fatalf("before the raise: granted %d of 1", g.GetGranted())
	}
	if c := commonOf(t, eu.srv, old, hourlyKey); c.RiseUS != 0 || c.StaticBurst != 50 {
		t.Fatalf("before the raise eu hands its scripts %+v, want burst 50 and no rise", c)
	}
	before := redisNow(t, eu.rdb)
	start := time.Now()
	writeConfig(globalSrc, regions, grown, 20)
	syncUntilConfirmed(ctx, t, grown, 20, eu, regions["us"])
	c := commonOf(t, eu.srv, grown, hourlyKey)
	if c.StaticBurst != 75 {
		t.Fatalf("eu's burst %v once the raise was confirmed, want 75", c.StaticBurst)
	}
	if after := redisNow(t, eu.rdb); c.RiseUS < before || c.RiseUS > after+time.Second.Microseconds() || c.FloorBurst != 50 || !near(c.FloorRate, 50.0/3600) {
		t.Fatalf("eu hands its scripts rise %d (Redis time %d..%d) from %v/s burst %v, want the confirmation from 50/h burst 50",
			c.RiseUS, before, after, c.FloorRate, c.FloorBurst)
	}
	bound := math.Floor(50 + 75.0/3600*time.Since(start).Seconds())
	for _, k := range []*sluicev1.QuotaKey{idle, fresh} {
		var admitted int64
		for range 3 {
			admitted += eu.acquire(ctx, t, k, 75).GetGranted()
		}
		if float64(admitted) > bound {
			t.Fatalf("%s admitted %d right after the raise, above the old share 50 + 75/h·t", k.GetTenant(), admitted)
		}
	}
}

// syncRounds runs two report rounds of eu's region leader and us's, in
// that order: the global tier hears both regions on what they run, then
// answers each with what it confirmed.
func syncRounds(ctx context.Context, t *testing.T, regions map[string]*leadRegion) {
	t.Helper()
	for range 2 {
		regions["eu"].sync(ctx, t)
		regions["us"].sync(ctx, t)
	}
}

// writeConfig makes cfg at rev the config of the global tier and of both
// regions (every one adopted it).
func writeConfig(globalSrc *configtest.Source, regions map[string]*leadRegion, cfg *config.Config, rev int64) {
	globalSrc.Set(cfg, rev)
	regions["eu"].src.Set(cfg, rev)
	regions["us"].src.Set(cfg, rev)
}
