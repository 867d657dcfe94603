package regional_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/regionsync"
	"github.com/sluicehq/sluice/pkg/shard"
)

// leaseConfig: two regions of weight 1, acme/write 100/s burst 100, so eu's
// static share is 50/s burst 50 and, with partition_share 0.5, its floor
// 25/s burst 25. Short epochs so region_lease (8 × validity) passes in
// two seconds.
func leaseConfig(t *testing.T) *config.Config {
	t.Helper()
	return leaseConfigWith(t, 2*time.Second)
}

// leaseConfigWith is leaseConfig with the given region_lease.
func leaseConfigWith(t *testing.T, regionLease time.Duration) *config.Config {
	t.Helper()
	return regiontest.MustConfig(t, fmt.Sprintf(`
epoch: 50ms
grant_validity: 250ms
region_lease: %v
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease, partition_share: 0.5}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`, regionLease))
}

var leaseKey = quota.Key{Tenant: "acme", Class: "write"}

const (
	staticRate, floorRate = 50.0, 25.0
	staticKey             = "sl:{static}:lease"
)

// tierSwitch is a fault injector on the link to the real allocator: cut,
// every report fails as on a partition; strip, answers arrive without
// their static lease. It records the last report sent.
type tierSwitch struct {
	inner       regional.GlobalTier
	cut, strip  atomic.Bool
	lastReport  atomic.Pointer[sluicev1.RegionReport]
	conferredMs atomic.Int64
}

func (s *tierSwitch) Sync(ctx context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	s.lastReport.Store(proto.Clone(r).(*sluicev1.RegionReport))
	if s.cut.Load() {
		return nil, errors.New("partitioned from the global tier")
	}
	g, err := s.inner.Sync(ctx, r)
	if err != nil {
		return nil, err
	}
	if s.strip.Load() {
		g = proto.Clone(g).(*sluicev1.RegionGrants)
		g.StaticLeaseMs = 0
	}
	s.conferredMs.Store(g.GetStaticLeaseMs())
	return g, nil
}

// leaseRig is a real allocator daemon (embedded etcd) and region eu's
// regional server and leader on a real redis-server, the server enforcing
// the static lease.
type leaseRig struct {
	t   *testing.T
	cfg *config.Config
	// regionCfg is eu's replicas' config source.
	regionCfg regional.ConfigSource
	cli       *clientv3.Client
	alloc     *allocator.Daemon
	rs        *redistest.Server
	rdb       *redis.Client
	srv       *regional.Server
	leader    *regional.Leader
	tier      *tierSwitch
	reg       *prometheus.Registry
}

func newLeaseRig(t *testing.T) *leaseRig {
	t.Helper()
	return newLeaseRigWith(t, leaseConfig(t))
}

// newLeaseRigWith is newLeaseRig running cfg (regions eu and us).
// newLongEpochRig is a lease rig of two regions, eu's leader under test,
// whose epoch is long (2s), so that a round on a machine starved of CPU
// completes within it, and whose leases outlive a test.
func newLongEpochRig(t *testing.T) *leaseRig {
	t.Helper()
	return newLeaseRigWith(t, regiontest.MustConfig(t, `
epoch: 2s
lease_ttl: 1m
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`))
}

func newLeaseRigWith(t *testing.T, cfg *config.Config) *leaseRig {
	t.Helper()
	return newLeaseRigOf(t, cfg, regional.StaticConfig{C: cfg}, regional.StaticConfig{C: cfg})
}

// newLeaseRigOn is newLeaseRigWith with the allocator daemon and eu's
// replicas on src, which the test may change.
func newLeaseRigOn(t *testing.T, cfg *config.Config, src interface {
	allocator.ConfigSource
	regional.ConfigSource
}) *leaseRig {
	t.Helper()
	return newLeaseRigOf(t, cfg, src, src)
}

// newLeaseRigOf is newLeaseRigWith with the allocator daemon on global and
// eu's replicas on region.
func newLeaseRigOf(t *testing.T, cfg *config.Config, global allocator.ConfigSource, region regional.ConfigSource) *leaseRig {
	t.Helper()
	ctx := context.Background()
	r := &leaseRig{t: t, cfg: cfg, regionCfg: region, tier: &tierSwitch{}, reg: prometheus.NewRegistry()}
	etcd := etcdtest.Start(t)
	r.cli = etcd.Client(t)
	// The allocator leads for the whole test: its tests stop it (it
	// resigns) when they want no global leader. With a session of 1 s it
	// stopped granting after half a second without a confirmed refresh,
	// which a starved machine reached, and a test then saw no global
	// leader elected ("not leader; leader=") where it had put one.
	d, err := allocator.StartDaemon(ctx, allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Etcd: r.cli, Prefix: "/sl", SessionTTL: 10 * time.Second,
		Config: global,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	r.alloc = d
	awaitAllocatorLeader(t, d, 10*time.Second)
	r.tier.inner = serviceTier{d.Service}
	r.rs = redistest.Start(t)
	r.rdb = r.rs.Client()
	r.srv, r.leader = r.replica("eu-1")
	return r
}

// replica starts one more enforcing replica of eu (server and leader) on
// the rig's Redis.
func (r *leaseRig) replica(identity string) (*regional.Server, *regional.Leader) {
	r.t.Helper()
	var reg prometheus.Registerer
	if identity == "eu-1" {
		reg = r.reg
	}
	srv, err := regional.New(regional.Options{Region: "eu", Redis: r.rdb, Config: r.regionCfg, Registerer: reg})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(srv.Close)
	l, err := regional.NewLeader(srv, regional.LeaderOptions{
		Etcd: r.cli, ElectionPrefix: "/sl/election/", Global: r.tier, Identity: identity,
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return srv, l
}

// syncOnce runs one report round of l that must succeed. The round is
// bounded by an epoch (50ms here): one that outlived it on a machine
// starved of CPU before its report left (reading Redis) is run again, a
// bounded number of times. A round that failed after its report reached
// the tier, or for any other reason, fails the test: what the tier
// answered is what the test judges.
func (r *leaseRig) syncOnce(ctx context.Context, l *regional.Leader) {
	r.t.Helper()
	for i := 0; ; i++ {
		sent := r.tier.lastReport.Load()
		err := l.SyncOnce(ctx, nil)
		if err == nil {
			return
		}
		if i >= 20 || !timedOut(err) || r.tier.lastReport.Load() != sent {
			r.t.Fatal(err)
		}
	}
}

// timedOut reports whether err is a round's deadline (one epoch) running
// out, as it does on a machine starved of CPU, or a script's (its bound,
// at most an epoch, after the round chose its settings).
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, luascripts.ErrTooLate)
}

// syncStored runs report rounds of l until the answer's static lease is
// stored in Redis, and returns the stored end and the report it answered.
// Storing the lease is bounded by the round's deadline: on a machine
// starved of CPU it may outlive it (logged; the leader keeps the lease and
// the next answer stores it), so the test reports again a bounded number
// of times instead of reading no lease.
func (r *leaseRig) syncStored(ctx context.Context, l *regional.Leader) (int64, *sluicev1.RegionReport) {
	r.t.Helper()
	for i := 0; ; i++ {
		r.syncOnce(ctx, l)
		if until := r.stored(); until != 0 || i >= 20 {
			return until, r.tier.lastReport.Load()
		}
	}
}

// static is the static rate srv hands its scripts for the key now.
func (r *leaseRig) static(srv *regional.Server) float64 {
	r.t.Helper()
	_, c, _, err := srv.CommonFor(r.cfg, leaseKey)
	if err != nil {
		r.t.Fatal(err)
	}
	return c.StaticRate
}

func (r *leaseRig) redisUS() int64 {
	r.t.Helper()
	now, err := r.rdb.Time(context.Background()).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	return now.UnixMicro()
}

// stored is the lease end in Redis (0: none).
func (r *leaseRig) stored() int64 {
	r.t.Helper()
	v, err := r.rdb.Get(context.Background(), staticKey).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return v
}

// metric is the first series of the rig's metric name.
func (r *leaseRig) metric(name string) *dto.Metric {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0]
		}
	}
	r.t.Fatalf("metric %s not registered", name)
	return nil
}

func (r *leaseRig) gauge(name string) float64 { return r.metric(name).GetGauge().GetValue() }

// runUntilFloor polls srv until it hands its scripts the floor, checking
// at every sample that it never runs on its static share within the
// margin of the lease's end (Redis time read before the decision: the
// replica's estimate is at least that). each runs first in every round.
// It returns the Redis time of the first sample on the floor.
func (r *leaseRig) runUntilFloor(srv *regional.Server, each func()) int64 {
	r.t.Helper()
	margin := regionsync.StaticMargin(time.Duration(r.cfg.Epoch)).Microseconds()
	until := r.stored()
	wait := time.Duration(r.cfg.RegionLease) + 10*time.Second
	for deadline := time.Now().Add(wait); ; {
		if each != nil {
			each()
		}
		before := r.redisUS()
		rate := r.static(srv)
		if near(rate, floorRate) {
			return before
		}
		if !near(rate, staticRate) {
			r.t.Fatalf("static rate %v, want the static share %v or the floor %v", rate, staticRate, floorRate)
		}
		if stored := r.stored(); stored > until {
			until = stored
		}
		if before+margin >= until {
			r.t.Fatalf("on the static share at Redis time %d, within the margin %d µs of the lease's end %d", before, margin, until)
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("still on the static share %v after the lease's end", wait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRegionRunsOnItsFloorOnceAnswersStop: a region whose Redis holds no
// static lease starts on its floor; the global tier's answer confers a
// lease of region_lease from the report's send time; once answers stop
// (the global leader is elected but unreachable, so the etcd rule does not
// apply) the region runs on its static share until the lease ends, then
// on its floor, and its bucket refills at the floor's rate on Redis time.
func TestRegionRunsOnItsFloorOnceAnswersStop(t *testing.T) {
	ctx := context.Background()
	r := newLeaseRig(t)
	if got := r.static(r.srv); !near(got, floorRate) {
		t.Fatalf("empty Redis: static rate %v, want the floor %v", got, floorRate)
	}
	if r.gauge("sluice_regional_on_floor") != 1 {
		t.Fatal("sluice_regional_on_floor is not 1 on an empty Redis")
	}
	r.syncOnce(ctx, r.leader)
	rep := r.tier.lastReport.Load()
	if rep.GetStaticValidMs() != 0 {
		t.Fatalf("first report carries static_valid_ms %d with no lease", rep.GetStaticValidMs())
	}
	lease := time.Duration(r.cfg.RegionLease)
	if got := r.tier.conferredMs.Load(); got != lease.Milliseconds() {
		t.Fatalf("the allocator conferred static_lease_ms %d, want region_lease %v", got, lease)
	}
	until := r.stored()
	if until == 0 {
		until, rep = r.syncStored(ctx, r.leader)
	}
	if want := int64(rep.GetSeq()) + lease.Microseconds(); until != want {
		t.Fatalf("stored lease end %d, want send time %d + region_lease = %d", until, rep.GetSeq(), want)
	}
	if got := r.static(r.srv); !near(got, staticRate) {
		t.Fatalf("with a lease: static rate %v, want %v", got, staticRate)
	}
	if r.gauge("sluice_regional_on_floor") != 0 || r.gauge("sluice_regional_static_lease_seconds") <= 0 {
		t.Fatal("metrics do not show the lease")
	}
	// Use the bucket on the static share, then cut the link.
	drain(t, r.srv)
	r.tier.cut.Store(true)
	floorAt := r.runUntilFloor(r.srv, func() {
		if err := r.leader.SyncOnce(ctx, nil); err == nil {
			t.Fatal("a sync succeeded through the cut link")
		}
		if grew, err := r.leader.NoGlobalLeader(ctx); grew || err != nil {
			t.Fatalf("NoGlobalLeader with a global leader elected: grew %v, err %v", grew, err)
		}
	})
	if got := r.stored(); got != until {
		t.Fatalf("lease end moved from %d to %d without an answer", until, got)
	}
	// Liveness, not safety: the replica's estimate of Redis time is its
	// last reading plus the local time since it sent that read, so it runs
	// ahead of Redis by the read's round trip — tens of milliseconds on a
	// starved machine. Going to the floor that much early is the safe side;
	// more than one epoch beyond the margin would be a wrong estimate.
	if early := until - regionsync.StaticMargin(time.Duration(r.cfg.Epoch)).Microseconds() - time.Duration(r.cfg.Epoch).Microseconds(); floorAt < early {
		t.Fatalf("on the floor at %d, more than an epoch before the lease's end %d minus the margin", floorAt, until)
	}
	if r.gauge("sluice_regional_on_floor") != 1 || r.gauge("sluice_regional_static_lease_seconds") > regionsync.StaticMargin(time.Duration(r.cfg.Epoch)).Seconds() {
		t.Fatalf("metrics do not show the floor: on_floor %v, static lease %v s",
			r.gauge("sluice_regional_on_floor"), r.gauge("sluice_regional_static_lease_seconds"))
	}
	// The bucket now refills at the floor's rate on Redis time.
	drain(t, r.srv)
	keys, common, _, err := r.srv.CommonFor(r.cfg, leaseKey)
	if err != nil {
		t.Fatal(err)
	}
	st1, err := r.srv.Scripts().State(ctx, r.rdb, keys, common)
	if err != nil {
		t.Fatal(err)
	}
	for r.redisUS() < st1.NowUS+(4*time.Duration(r.cfg.Epoch)).Microseconds() {
		time.Sleep(10 * time.Millisecond)
	}
	// Settings are chosen for a call, not kept: past their deadline the
	// scripts would not act on them.
	if keys, common, _, err = r.srv.CommonFor(r.cfg, leaseKey); err != nil {
		t.Fatal(err)
	}
	st2, err := r.srv.Scripts().State(ctx, r.rdb, keys, common)
	if err != nil {
		t.Fatal(err)
	}
	if !near(st2.Rate, floorRate) || st2.Cap != floorRate {
		t.Fatalf("bucket rate %v cap %v, want the floor 25/s burst 25", st2.Rate, st2.Cap)
	}
	want := floorRate * float64(st2.NowUS-st1.NowUS) / 1e6
	if got := st2.Tokens - st1.Tokens; math.Abs(got-want) > 0.01 {
		t.Fatalf("refilled %v tokens over %d µs of Redis time, want %v at the floor's rate", got, st2.NowUS-st1.NowUS, want)
	}
}

// drain spends every token of the key's bucket through Check.
func drain(t *testing.T, srv *regional.Server) {
	t.Helper()
	for i := 0; ; i++ {
		resp, err := srv.Check(context.Background(), &sluicev1.CheckRequest{Key: &sluicev1.QuotaKey{Tenant: leaseKey.Tenant, Class: leaseKey.Class}, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetAllowed() {
			return
		}
		if i > 1000 {
			t.Fatal("the bucket never ran dry")
		}
	}
}

// TestAnswersWithoutStaticLeaseNeverExtendIt: answers that confer no
// static lease (static_lease_ms 0) neither give an empty region one nor
// extend the one it holds: it reaches its floor while answers still come.
func TestAnswersWithoutStaticLeaseNeverExtendIt(t *testing.T) {
	ctx := context.Background()
	r := newLeaseRig(t)
	r.tier.strip.Store(true)
	for range 3 {
		r.syncOnce(ctx, r.leader)
	}
	if r.stored() != 0 || !near(r.static(r.srv), floorRate) {
		t.Fatalf("answers without a static lease gave one: stored %d, static rate %v", r.stored(), r.static(r.srv))
	}
	r.tier.strip.Store(false)
	until, _ := r.syncStored(ctx, r.leader)
	if until == 0 {
		t.Fatal("no lease stored after a conferring answer")
	}
	r.tier.strip.Store(true)
	r.runUntilFloor(r.srv, func() {
		r.syncOnce(ctx, r.leader)
	})
	if got := r.stored(); got != until {
		t.Fatalf("answers without a static lease moved its end from %d to %d", until, got)
	}
}

// TestNewLeaderTakesOverTheStoredLease: a new region leader (another
// replica, a fresh process) reads the lease its predecessor stored before
// its first report, and reports what remains of it; a replica reads it on
// its own.
func TestNewLeaderTakesOverTheStoredLease(t *testing.T) {
	ctx := context.Background()
	r := newLeaseRig(t)
	until, _ := r.syncStored(ctx, r.leader)
	if until == 0 {
		t.Fatal("no lease stored after conferring answers")
	}
	srv2, leader2 := r.replica("eu-2")
	if got := r.static(srv2); !near(got, floorRate) {
		t.Fatalf("a replica that never read the lease runs on %v, want the floor", got)
	}
	r.tier.cut.Store(true) // the new leader gets no answer: only what Redis holds counts
	if err := leader2.SyncOnce(ctx, nil); err == nil {
		t.Fatal("sync through a cut link succeeded")
	}
	rep := r.tier.lastReport.Load()
	if want := (until - int64(rep.GetSeq())) / 1000; rep.GetStaticValidMs() != want || want <= 0 {
		t.Fatalf("new leader reports static_valid_ms %d, want %d (the stored lease's end %d minus its send time %d)",
			rep.GetStaticValidMs(), want, until, rep.GetSeq())
	}
	if got := r.static(srv2); !near(got, staticRate) {
		t.Fatalf("new leader's replica runs on %v after reading the lease, want the static share", got)
	}
	srv3, _ := r.replica("eu-3")
	if err := regional.RefreshStaticForTest(ctx, srv3); err != nil {
		t.Fatal(err)
	}
	if got := r.static(srv3); !near(got, staticRate) {
		t.Fatalf("a replica that read the stored lease runs on %v, want the static share", got)
	}
}

// TestNoGlobalLeaderKeepsTheStaticShare: when the global tier is down (no
// allocator replica holds an election key in etcd) the region leader
// extends its running lease and keeps its static share past the end of
// the lease last conferred; once a global leader is elected again but
// does not answer, the extensions stop.
func TestNoGlobalLeaderKeepsTheStaticShare(t *testing.T) {
	ctx := context.Background()
	r := newLeaseRig(t)
	conferred, _ := r.syncStored(ctx, r.leader)
	if conferred == 0 {
		t.Fatal("no lease stored after conferring answers")
	}
	r.alloc.Stop() // resigns: the election is empty
	lease := time.Duration(r.cfg.RegionLease).Microseconds()
	// Past the end of the conferred lease, the region still runs on its
	// static share, every lease it holds extended by the etcd rule.
	extended := 0
	for r.redisUS() < conferred+lease/2 {
		if err := r.leader.SyncOnce(ctx, nil); err == nil {
			t.Fatal("a sync succeeded with the allocator stopped")
		}
		before := r.redisUS()
		grew, err := r.leader.NoGlobalLeader(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			// Its reads are bounded by an epoch; a starved machine can
			// miss that, and the loop tries again next epoch, as the
			// leader's does.
			t.Logf("extension attempt timed out: %v", err)
			time.Sleep(time.Duration(r.cfg.Epoch))
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		extended++
		if !grew {
			resp, _ := r.cli.Get(ctx, "/sl/election/", clientv3.WithPrefix())
			t.Fatalf("no global leader elected, yet the lease was not extended (stored %d, now %d, keys %v)", r.stored(), r.redisUS(), resp.Kvs)
		}
		if got := r.stored(); got < before+lease || got > r.redisUS()+lease {
			t.Fatalf("extended lease ends at %d, want about Redis time %d + region_lease", got, before)
		}
		if got := r.static(r.srv); !near(got, staticRate) {
			t.Fatalf("static rate %v with no global leader elected, want the static share", got)
		}
		time.Sleep(time.Duration(r.cfg.Epoch))
	}
	if extended == 0 {
		t.Fatal("no extension attempt finished within half a region lease")
	}
	// A global leader is elected again (a candidate's key in the
	// allocator's election) but never answers: no more extensions.
	sess, err := concurrency.NewSession(r.cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := concurrency.NewElection(sess, "/sl/election/global").Campaign(ctx, "unreachable"); err != nil {
		t.Fatal(err)
	}
	last := r.stored()
	r.runUntilFloor(r.srv, func() {
		// (An attempt that timed out on a starved machine extended nothing.)
		if grew, err := r.leader.NoGlobalLeader(ctx); grew || (err != nil && !errors.Is(err, context.DeadlineExceeded)) {
			t.Fatalf("extended with a global leader elected: %v %v", grew, err)
		}
	})
	if got := r.stored(); got != last {
		t.Fatalf("lease end moved from %d to %d with a global leader elected", last, got)
	}
}

// TestNoGlobalLeaderNeverRevivesALapsedLease: an empty Redis, or a lease
// that already ended, is not extended by the etcd rule: a dead global
// leader may have given the region's share away.
func TestNoGlobalLeaderNeverRevivesALapsedLease(t *testing.T) {
	ctx := context.Background()
	r := newLeaseRig(t)
	r.alloc.Stop()
	if grew, err := r.leader.NoGlobalLeader(ctx); grew || err != nil || r.stored() != 0 {
		t.Fatalf("empty Redis: grew %v, err %v, stored %d; want no lease", grew, err, r.stored())
	}
	// A lease that ended: stored by an earlier leader, expired now.
	past := r.redisUS() - 1
	if err := r.rdb.Set(ctx, staticKey, fmt.Sprint(past), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if grew, err := r.leader.NoGlobalLeader(ctx); grew || err != nil || r.stored() != past {
		t.Fatalf("lapsed lease: grew %v, err %v, stored %d; want it left at %d", grew, err, r.stored(), past)
	}
	if got := r.static(r.srv); !near(got, floorRate) {
		t.Fatalf("static rate %v, want the floor", got)
	}
}

// TestUnleasedServerKeepsItsStaticShare: a server explicitly run with no
// global tier (Options.Unleased) runs on its static share on an empty
// Redis, as before static leases, and has its scripts mark no candidates
// (an enforcing server marks every quarter epoch).
func TestUnleasedServerKeepsItsStaticShare(t *testing.T) {
	cfg := leaseConfig(t)
	srv, err := regional.New(regional.Options{Region: "eu", Redis: redistest.Start(t).Client(), Config: regional.StaticConfig{C: cfg}, Unleased: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	_, c, _, err := srv.CommonFor(cfg, leaseKey)
	if err != nil || !near(c.StaticRate, staticRate) {
		t.Fatalf("unleased: static rate %v (%v), want %v", c.StaticRate, err, staticRate)
	}
	// No region leader reads its candidate marks: the scripts make none.
	if c.MarkEvery != 0 {
		t.Fatalf("unleased: candidate mark interval %v, want none", c.MarkEvery)
	}
	leased, err := regional.New(regional.Options{Region: "eu", Redis: redistest.Start(t).Client(), Config: regional.StaticConfig{C: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	defer leased.Close()
	if _, c, _, err := leased.CommonFor(cfg, leaseKey); err != nil || c.MarkEvery != regionsync.MarkEvery(time.Duration(cfg.Epoch)) {
		t.Fatalf("leased: candidate mark interval %v (%v), want a quarter epoch", c.MarkEvery, err)
	}
	if _, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "eu", RedisAddr: "127.0.0.1:1", Config: regional.StaticConfig{C: cfg}, Unleased: true,
		Leader: &regional.LeaderOptions{},
	}); err == nil {
		t.Fatal("StartDaemon accepted Unleased with a Leader")
	}
}

// TestReplicaReadsEveryShardsStoredLease: a replica of a config of two
// global-tier shards reads each shard's stored lease: a key runs on its
// static share while its owner's lease is stored and running, on its
// floor while only the other shard's is.
func TestReplicaReadsEveryShardsStoredLease(t *testing.T) {
	ctx := context.Background()
	cfg := shardedConfig(t, 2)
	rdb := redistest.Start(t).Client()
	defer rdb.Close()
	srv, err := regional.New(regional.Options{Region: "eu", Redis: rdb, Config: regional.StaticConfig{C: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	m, err := shard.New(2)
	if err != nil {
		t.Fatal(err)
	}
	var owned [2]quota.Key // a key of each shard
	for i := 0; owned[0].Tenant == "" || owned[1].Tenant == ""; i++ {
		k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
		owned[m.Of(k)] = k
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	until := fmt.Sprint(now.Add(time.Hour).UnixMicro())
	static := func(k quota.Key) float64 {
		t.Helper()
		if err := regional.RefreshStaticForTest(ctx, srv); err != nil {
			t.Fatal(err)
		}
		_, c, _, err := srv.CommonFor(cfg, k)
		if err != nil {
			t.Fatal(err)
		}
		return c.StaticRate
	}
	if err := rdb.Set(ctx, staticKey, until, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got0, got1 := static(owned[0]), static(owned[1]); !near(got0, staticRate) || !near(got1, floorRate) {
		t.Fatalf("shard 0's lease alone: shard 0's key on %v, shard 1's on %v; want %v and the floor %v", got0, got1, staticRate, floorRate)
	}
	if err := rdb.Set(ctx, staticKey+":1", until, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got0, got1 := static(owned[0]), static(owned[1]); !near(got0, staticRate) || !near(got1, staticRate) {
		t.Fatalf("both leases: shard 0's key on %v, shard 1's on %v; want %v for both", got0, got1, staticRate)
	}
}

// awaitAllocatorLeader polls until d leads its shard's election, failing
// tb when it does not within the given time (a session TTL or more: a
// starved machine campaigns late).
func awaitAllocatorLeader(tb testing.TB, d *allocator.Daemon, within time.Duration) {
	tb.Helper()
	for deadline := time.Now().Add(within); !d.IsLeader(); {
		if time.Now().After(deadline) {
			tb.Fatalf("the allocator daemon never became leader within %v", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
