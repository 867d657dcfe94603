package regional_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// wroteConn is a connection that reports each write it completed: a
// command written to a paused Redis waits in the kernel for it.
type wroteConn struct {
	net.Conn
	wrote chan<- struct{}
}

func (c *wroteConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	select {
	case c.wrote <- struct{}{}:
	default:
	}
	return n, err
}

// TestSyncQueuedInAPausedRedisAdmitsNothingOnceTheRegionIsOnItsFloor: a
// Sync sent on the static share to a Redis that then stays paused
// (SIGSTOP) until the region lapsed to its floor (0 for the class) and its
// static lease ended runs on resume past its deadline (the lease's end): it grants nothing and creates nothing in
// Redis, the caller is answered Unavailable and a Redis error is counted.
// The instance's retry of the same Sync is then a new report decided on
// the floor (granted 0), not a duplicate answered with a grant made on
// the old share. Before script deadlines the queued script granted its
// 30 tokens on resume, and the retry was answered them again.
func TestSyncQueuedInAPausedRedisAdmitsNothingOnceTheRegionIsOnItsFloor(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
epoch: 1s
grant_validity: 5s
region_lease: 60s
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease, partition_share: 0}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`)
	ctx := context.Background()
	rs := redistest.Start(t)
	rdb := rs.Client()
	// The server's Redis: one connection, made before the pause, whose
	// writes the test sees; it waits for answers as long as Redis takes.
	wrote := make(chan struct{}, 1)
	srvRdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), PoolSize: 1, MaxRetries: -1, ReadTimeout: -1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &wroteConn{Conn: conn, wrote: wrote}, nil
		}})
	t.Cleanup(func() { _ = srvRdb.Close() })
	const redisTimeout = 200 * time.Millisecond
	reg := prometheus.NewRegistry()
	srv, err := regional.New(regional.Options{Region: "eu", Redis: srvRdb, Config: regional.StaticConfig{C: cfg},
		RedisTimeout: redisTimeout, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if err := srvRdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	// A static lease two seconds past the margin (an epoch).
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	until := now.Add(time.Duration(cfg.Epoch) + 2*time.Second)
	if err := rdb.Set(ctx, staticKey, until.UnixMicro(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := regional.RefreshStaticForTest(ctx, srv); err != nil {
		t.Fatal(err)
	}
	staticNow := func() float64 {
		_, c, _, err := srv.CommonFor(cfg, leaseKey)
		if err != nil {
			t.Fatal(err)
		}
		return c.StaticRate
	}
	if got := staticNow(); !near(got, staticRate) {
		t.Fatalf("static rate %v under the lease, want %v", got, staticRate)
	}

	req := &sluicev1.SyncRequest{InstanceId: "i-a", Incarnation: 1, Reports: []*sluicev1.KeyReport{{
		Key: &sluicev1.QuotaKey{Tenant: leaseKey.Tenant, Class: leaseKey.Class}, Lease: 1, Seq: 1, Want: 30, Min: 1}}}
	select {
	case <-wrote:
	default:
	}
	rs.Pause()
	resumed := false
	defer func() {
		if !resumed {
			rs.Resume()
		}
	}()
	type answer struct {
		resp *sluicev1.SyncResponse
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := srv.Sync(ctx, req)
		done <- answer{resp, err}
	}()
	<-wrote // the script waits in the paused server's socket
	// The script's deadline is the static lease's end, in Redis time,
	// which is this machine's wall clock: it has passed once the clock
	// passed that instant.
	past := until.Add(time.Millisecond)
	// The region lapses to its floor while Redis is paused (polled with a
	// deadline of many times the lease left).
	for deadline := time.Now().Add(30 * time.Second); staticNow() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("still on static rate %v long after the lease ended", staticNow())
		}
		time.Sleep(10 * time.Millisecond) // polling the replica's choice with a deadline
	}
	if d := time.Until(past); d > 0 {
		<-time.After(d) // the instant the deadline has surely passed
	}
	rs.Resume()
	resumed = true

	a := <-done
	if status.Code(a.err) != codes.Unavailable {
		t.Fatalf("the Sync that ran past its deadline was answered %v, %v; want Unavailable", a.resp, a.err)
	}
	if n := metrictest.Series(t, reg, "sluice_regional_redis_errors_total", map[string]string{"script": "sync"}); n != 1 {
		t.Errorf("%v Redis errors of script sync counted for a script answered too late, want 1", n)
	}
	keys := luascripts.KeysFor(luascripts.DefaultPrefix, quota.Key{Tenant: leaseKey.Tenant, Class: leaseKey.Class})
	if n, err := rdb.Exists(ctx, keys.Bucket, keys.Leases).Result(); err != nil || n != 0 {
		t.Fatalf("the script past its deadline left %d of the key's bucket and lease hash of older scripts (%v)", n, err)
	}

	// The instance retries the same Sync: decided now, on the floor.
	resp, err := srv.Sync(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if g := resp.GetGrants()[0]; g.GetGranted() != 0 || g.GetRegionRate() != 0 {
		t.Fatalf("the retried Sync on the floor was answered %v", g)
	}
	if n := metrictest.Series(t, reg, "sluice_regional_granted_tokens_total", map[string]string{"class": "write"}); n != 0 {
		t.Fatalf("%v tokens granted on a floor of 0", n)
	}
	// A bucket leaves out a field that is 0 and was never written.
	out, err := rdb.HGet(ctx, keys.Bucket, "out").Int64()
	if errors.Is(err, redis.Nil) {
		out, err = 0, nil
	}
	if err != nil || out != 0 {
		t.Fatalf("bucket out %d (%v) after the floor's Sync, want 0", out, err)
	}
}

// slowTier answers every report with a grant for leaseKey, once the
// local clock passed delay after the report arrived.
type slowTier struct{ delay time.Duration }

func (s slowTier) Sync(ctx context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	select {
	case <-time.After(s.delay): // the instant the answer is due
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return leaseKeyGrant(), nil
}

// leaseKeyGrant is an answer granting leaseKey 10/s, burst 10, for a
// minute.
func leaseKeyGrant() *sluicev1.RegionGrants {
	return &sluicev1.RegionGrants{Grants: []*sluicev1.KeyGrant{{
		Key: &sluicev1.QuotaKey{Tenant: leaseKey.Tenant, Class: leaseKey.Class}, Rate: 10, Burst: 10, ValidMs: 60_000}}}
}

// TestGrantInstalledAfterASlowAnswerIsPlannedAfresh: the leader installs a
// grant that arrives later than the server's bound on Redis after the
// round read the key's state: its install is planned when it runs (static
// share and deadline), so it is applied, where with the plan of the state
// read it ran past its deadline and the grant was lost.
func TestGrantInstalledAfterASlowAnswerIsPlannedAfresh(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
epoch: 3s
grant_validity: 12s
region_lease: 60s
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease, partition_share: 0}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`)
	// The answer comes twice the bound after the state reads, well
	// within the round's epoch; an install has the whole bound.
	const redisTimeout = 500 * time.Millisecond
	rs := redistest.Start(t)
	srv, err := regional.New(regional.Options{Region: "eu", Redis: rs.Client(), Config: regional.StaticConfig{C: cfg},
		RedisTimeout: redisTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	var applied []quota.Key
	l, err := regional.NewLeader(srv, regional.LeaderOptions{
		Etcd: etcdtest.Start(t).Client(t), ElectionPrefix: "/sl/election/", Identity: "eu-1",
		Global:    slowTier{delay: 2 * redisTimeout},
		OnApplied: func(k quota.Key, rate, burst float64, expiryUS int64) { applied = append(applied, k) },
	})
	if err != nil {
		t.Fatal(err)
	}
	// The first round's grant marks the key a candidate: the second
	// round reads its state before the slow answer comes.
	for round := 1; round <= 2; round++ {
		if err := l.SyncOnce(context.Background(), nil); err != nil {
			t.Fatalf("round %d, answered %v after its state reads: %v", round, 2*redisTimeout, err)
		}
		if len(applied) != round || applied[round-1] != leaseKey {
			t.Fatalf("after round %d grants applied to %v, want %v each round", round, applied, leaseKey)
		}
	}
}
