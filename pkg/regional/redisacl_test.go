package regional_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// aclPassword is the test's password for the recipe's user.
const aclPassword = "acl-test-pw-7f3a"

// aclRecipe is docs/operations.md's ACL SETUSER line for the regional
// service's Redis user, with the test's password: the test runs what the
// runbook tells operators to run.
func aclRecipe(t *testing.T) []any {
	t.Helper()
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(doc), "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "ACL SETUSER sluice ") {
			continue
		}
		line = strings.ReplaceAll(line, "<password>", aclPassword)
		var args []any
		for _, f := range strings.Fields(line) {
			args = append(args, f)
		}
		return args
	}
	t.Fatal("docs/operations.md has no `ACL SETUSER sluice ...` line")
	return nil
}

// applyACL runs the recipe on rs as the default user, then each of more
// (further ACL SETUSER sluice rules, such as "-zadd").
func applyACL(t *testing.T, admin *redis.Client, more ...string) {
	t.Helper()
	ctx := context.Background()
	if err := admin.Do(ctx, aclRecipe(t)...).Err(); err != nil {
		t.Fatalf("the recipe: %v", err)
	}
	for _, rule := range more {
		if err := admin.Do(ctx, "ACL", "SETUSER", "sluice", rule).Err(); err != nil {
			t.Fatalf("ACL SETUSER sluice %s: %v", rule, err)
		}
	}
}

// aclConfig has a lease class and a strict one, in two regions (the
// leader's report and grants need a global tier). Its epoch is the
// default (1 s): a leader round must end within one epoch, and under an
// epoch of 200ms a round on a machine starved of CPU ran out of it
// ("set_rate ...: context deadline exceeded"), which says nothing of the
// ACL (rounds under load took up to 110ms here).
const aclConfig = `
lease_ttl: 5s
regions: {eu: {weight: 1}, us: {weight: 1}}
classes:
  write:  {mode: lease}
  export: {mode: strict, on_failure: closed}
tiers: {free: {write: {rate: 100/s, burst: 100}, export: {rate: 10/s, burst: 10}}}
default_tier: free
`

// TestACLRecipeRunsEverything: the least-privilege user of
// docs/operations.md runs everything the regional service does against a
// real redis-server: the start-up checks, acquire, sync, release, a strict
// check, the restart sentinel, the static lease and readiness reads, and
// the region leader's state reads and set_rate. Redis denies it nothing
// (ACL LOG stays empty) and no Redis error is counted.
func TestACLRecipeRunsEverything(t *testing.T) {
	rs := redistest.Start(t)
	admin := rs.Client()
	ctx := context.Background()
	applyACL(t, admin)
	if err := admin.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	cfg := regiontest.MustConfig(t, aclConfig)
	cli := etcdtest.Start(t).Client(t)
	alloc := startLeadingAllocator(ctx, t, cli, "/acl", configtest.NewSource(cfg, 1))

	var logs logtest.Buffer
	d, err := regional.StartDaemon(ctx, regional.DaemonOptions{
		Region: "eu", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: rs.Addr(),
		RedisUsername: "sluice", RedisPassword: aclPassword,
		Config: regional.StaticConfig{C: cfg}, ColdStart: regional.ColdStartFull,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	conn := regiontest.Dial(t, d.GRPCAddr())
	c := sluicev1.NewLeaseServiceClient(conn)
	key := qk("acme", "write")
	if _, err := c.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i1", Incarnation: 1,
		Report: &sluicev1.KeyReport{Key: key, Seq: 1, Want: 5}}); err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if _, err := c.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "i1", Incarnation: 1,
		Reports: []*sluicev1.KeyReport{{Key: key, Seq: 2, Lease: 1, Want: 5}}}); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if _, err := c.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: "i1", Incarnation: 1,
		Reports: []*sluicev1.KeyReport{{Key: key, Seq: 3, Lease: 1}}}); err != nil {
		t.Fatalf("release: %v", err)
	}
	if _, err := c.Check(ctx, &sluicev1.CheckRequest{Key: qk("acme", "export"), Cost: 1}); err != nil {
		t.Fatalf("check: %v", err)
	}

	// The region leader: its report reads the keys' state, its grant is
	// installed by set_rate, and it stores the confirmed revision.
	var applied atomic.Int64
	tier := &grantingTier{inner: serviceTier{alloc.Service}, grants: []*sluicev1.KeyGrant{
		{Key: key, Rate: 20, Burst: 20, ValidMs: 5000}}}
	l, err := regional.NewLeader(d.Server, regional.LeaderOptions{
		Etcd: cli, ElectionPrefix: "/acl/election/", Global: tier, Identity: "eu-acl",
		OnApplied: func(k quota.Key, rate, burst float64, expiryUS int64) { applied.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := l.SyncOnce(ctx, nil); err != nil {
			t.Fatalf("leader sync: %v", err)
		}
	}
	if applied.Load() == 0 {
		t.Fatal("the leader installed no grant (set_rate)")
	}

	// The replica's own loops: readiness (PING and the access probe),
	// the eviction watch (INFO), the sentinel and the static lease reads,
	// each at least once more after the calls above.
	read := regional.EvictionReadingsForTest(d)
	deadline := time.Now().Add(50 * time.Duration(cfg.Epoch))
	for regional.EvictionReadingsForTest(d) < read+2 {
		if time.Now().After(deadline) {
			t.Fatal("the eviction watch did not read Redis twice within 50 epochs")
		}
		time.Sleep(time.Duration(cfg.Epoch) / 4) // polling the once-an-epoch watch with a deadline
	}
	resp, err := d.Health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("readiness %v, %v; want SERVING", resp, err)
	}
	denied, err := admin.Do(ctx, "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(denied) > 0 {
		t.Errorf("Redis denied the recipe's user %d times: %v", len(denied), denied)
	}
	mfs, err := d.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_regional_redis_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				t.Errorf("redis errors %v: %v", m.GetLabel(), v)
			}
		}
	}
	if strings.Contains(logs.String(), aclPassword) {
		t.Errorf("the password is in the log:\n%s", logs.String())
	}
	if t.Failed() {
		t.Logf("log:\n%s", logs.String())
	}
}

// TestRedisAddrURLIsRefusedWithoutItsPassword: StartDaemon refuses an
// address with credentials in it before dialling, and neither the error
// nor the log repeats the password (it was dialled as is, failed "too
// many colons", and logged at WARN with the password).
func TestRedisAddrURLIsRefusedWithoutItsPassword(t *testing.T) {
	const secret = "url-pw-91c2"
	var logs logtest.Buffer
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off",
		RedisAddr: fmt.Sprintf("redis://sluice:%s@127.0.0.1:1", secret),
		Config:    regional.StaticConfig{C: regiontest.MustConfig(t, oneRegion)}, Unleased: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err == nil {
		d.Stop()
		t.Fatalf("started; log:\n%s", logs.String())
	}
	if !strings.Contains(err.Error(), "is not host:port") || strings.Contains(err.Error()+logs.String(), secret) {
		t.Errorf("error %q, log:\n%s", err, logs.String())
	}
}

// TestACLRecipeOnACluster: on a Redis Cluster the recipe's user, set on
// every node, also reads the slot map; a start, an acquire and a few
// epochs of the replica's own reads are denied nothing on any node.
func TestACLRecipeOnACluster(t *testing.T) {
	// A Redis cluster of its own, mostly waited for (redis-cli forms it
	// by polling): it runs beside the package's other parallel tests.
	t.Parallel()
	addrs := redistest.StartCluster(t, 3)
	ctx := context.Background()
	var admins []*redis.Client
	for _, a := range addrs {
		admin := redis.NewClient(&redis.Options{Addr: a})
		defer admin.Close()
		applyACL(t, admin)
		if err := admin.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
			t.Fatal(err)
		}
		admins = append(admins, admin)
	}
	var logs logtest.Buffer
	cfg := regiontest.MustConfig(t, quickEpochs)
	d, err := regional.StartDaemon(ctx, regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: strings.Join(addrs, ","),
		RedisUsername: "sluice", RedisPassword: aclPassword,
		Config: regional.StaticConfig{C: cfg}, ColdStart: regional.ColdStartFull, Unleased: true,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	conn := regiontest.Dial(t, d.GRPCAddr())
	c := sluicev1.NewLeaseServiceClient(conn)
	for _, tenant := range []string{"acme", "globex", "initech"} {
		if _, err := c.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i1", Incarnation: 1,
			Report: &sluicev1.KeyReport{Key: qk(tenant, "read"), Seq: 1, Want: 5}}); err != nil {
			t.Fatalf("acquire: %v", err)
		}
	}
	read := regional.EvictionReadingsForTest(d)
	deadline := time.Now().Add(50 * time.Duration(cfg.Epoch))
	for regional.EvictionReadingsForTest(d) < read+2 {
		if time.Now().After(deadline) {
			t.Fatal("the eviction watch did not read Redis twice within 50 epochs")
		}
		time.Sleep(time.Duration(cfg.Epoch) / 4) // polling the once-an-epoch watch with a deadline
	}
	for i, admin := range admins {
		denied, err := admin.Do(ctx, "ACL", "LOG").Slice()
		if err != nil {
			t.Fatal(err)
		}
		if len(denied) > 0 {
			t.Errorf("node %s denied the recipe's user %d times: %v", addrs[i], len(denied), denied)
		}
	}
	if t.Failed() {
		t.Logf("log:\n%s", logs.String())
	}
}
