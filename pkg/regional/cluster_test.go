package regional_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestRedisCluster runs the regional daemon on a real three-node Redis
// Cluster: every script touches keys of one hash tag (one slot), and a
// Sync pipelines keys that live on different nodes.
func TestRedisCluster(t *testing.T) {
	// A Redis cluster of its own, mostly waited for (redis-cli forms it
	// by polling): it runs beside the package's other parallel tests.
	t.Parallel()
	addrs := redistest.StartCluster(t, 3)
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: strings.Join(addrs, ","),
		Config: regional.StaticConfig{C: regiontest.MustConfig(t, oneRegion)}, ColdStart: regional.ColdStartFull,
		Unleased: true, // no global tier: static shares unconditional
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	awaitFirstLook(t, d)
	reg := &regiontest.Region{Addr: d.GRPCAddr()}
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()

	var reports []*sluicev1.KeyReport
	for i := range 30 { // 30 tenants spread over the 16384 slots, so over all three nodes
		reports = append(reports, &sluicev1.KeyReport{Key: qk(fmt.Sprintf("tenant-%d", i), "read"), Seq: 1, Want: 7})
	}
	resp, err := client.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "i1", Reports: reports})
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range resp.Grants {
		if g.Granted != 7 {
			t.Fatalf("key %d: granted %d, want 7", i, g.Granted)
		}
	}
	for i := range 30 {
		c, err := client.Check(ctx, &sluicev1.CheckRequest{Key: qk(fmt.Sprintf("tenant-%d", i), "export"), Cost: 1})
		if err != nil || !c.Allowed {
			t.Fatalf("check %d: %v %v", i, c, err)
		}
	}
	// The keys really are spread: every node holds some.
	for _, a := range addrs {
		n := redistest.KeyCount(t, a)
		if n == 0 {
			t.Errorf("node %s holds no key: the test did not exercise the cluster", a)
		}
	}
}

// TestRedisClusterNodeLossStartsItsBucketsEmpty: on a three-node Redis
// Cluster, one node loses its data while an instance holds the whole burst
// of a key on it. Each hash slot has its own born sentinel, lost with the
// node's buckets, and the scripts read it in the call that recreates a
// bucket: the key on that node comes back empty (no second burst), while a
// key on a node that kept its data is untouched. (The sentinel once lived
// on one node and was read by the process once per epoch: a bucket
// recreated on another node started full.)
func TestRedisClusterNodeLossStartsItsBucketsEmpty(t *testing.T) {
	// A Redis cluster of its own, mostly waited for (redis-cli forms it
	// by polling): it runs beside the package's other parallel tests.
	t.Parallel()
	addrs := redistest.StartCluster(t, 3)
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: strings.Join(addrs, ","),
		Config: regional.StaticConfig{C: regiontest.MustConfig(t, oneRegion)}, ColdStart: regional.ColdStartFull,
		Unleased: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	awaitFirstLook(t, d)
	client := sluicev1.NewLeaseServiceClient((&regiontest.Region{Addr: d.GRPCAddr()}).Dial(t))
	ctx := context.Background()
	nodes := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: a})
		defer nodes[i].Close()
	}
	// nodeOf is the node serving a key (the others answer MOVED).
	nodeOf := func(name string) int {
		for i, n := range nodes {
			if v, err := n.Exists(ctx, name).Result(); err == nil && v == 1 {
				return i
			}
		}
		t.Fatalf("no node holds %s", name)
		return -1
	}
	acquire := func(inst, tenant string) int64 {
		resp, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: inst,
			Report: &sluicev1.KeyReport{Key: qk(tenant, "read"), Seq: 1, Lease: 1, Want: 100}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetGrant().GetGranted()
	}
	// refilled is what a bucket emptied at since can have earned back by
	// now at the keys' rate: a starved machine may take seconds between
	// two calls, and a second burst is far above it.
	rate := d.Server.ConfigForTest().Tiers["free"]["read"].Rate
	refilled := func(since time.Time) int64 { return int64(float64(rate) * time.Since(since).Seconds()) }
	// Two keys on different nodes, each handed out whole (burst 100).
	lost := "tenant-0"
	if g := acquire("i-1", lost); g != 100 {
		t.Fatalf("first lease on %s granted %d, want the burst 100", lost, g)
	}
	lostNode := nodeOf(luascripts.KeysFor(luascripts.DefaultPrefix, quota.Key{Tenant: lost, Class: "read"}).Bucket)
	kept := ""
	var keptDrained time.Time
	for i := 1; kept == ""; i++ {
		name := fmt.Sprintf("tenant-%d", i)
		drained := time.Now()
		if g := acquire("i-1", name); g != 100 {
			t.Fatalf("first lease on %s granted %d, want the burst 100", name, g)
		}
		if nodeOf(luascripts.KeysFor(luascripts.DefaultPrefix, quota.Key{Tenant: name, Class: "read"}).Bucket) != lostNode {
			kept, keptDrained = name, drained
		}
	}
	// The node loses its data (a restart without persistence).
	flushed := time.Now()
	if err := nodes[lostNode].FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Another instance asks at once: the recreated bucket must be empty,
	// since i-1 may still spend the 100 it holds (born at the loss, it
	// earns nothing for a restart wait, and then at the key's rate).
	if g := acquire("i-2", lost); g > refilled(flushed) {
		t.Fatalf("after its node lost its data, %s granted %d more: the recreated bucket was handed a burst", lost, g)
	}
	// The other node's key kept its state: its burst is out, not renewed.
	if g := acquire("i-2", kept); g > refilled(keptDrained) {
		t.Fatalf("%s on a node that kept its data granted %d: its bucket was not kept", kept, g)
	}
}

// awaitFirstLook waits until d's restart guard has made its first look
// at Redis. Under -cold-start full that look stamps a fresh Redis's
// sentinels trusted (0), so new buckets start full; a look that timed out
// at start (a starved machine: a cluster's look stamps every slot) and
// again before the first call leaves the calls' scripts to date the data
// sets now, and the first keys are rightly held empty for a restart wait.
// The guard looks again every epoch until it answers.
func awaitFirstLook(t *testing.T, d *regional.Daemon) {
	t.Helper()
	epoch := time.Duration(d.Server.ConfigForTest().Epoch)
	for deadline := time.Now().Add(30 * epoch); !regional.GuardLookedForTest(d); {
		if time.Now().After(deadline) {
			t.Fatalf("the restart guard made no first look within %v (epoch %v)", 30*epoch, epoch)
		}
		time.Sleep(epoch / 20) // polling the guard's epoch check with a deadline
	}
}

// TestClusterCandidateSetsTrimmedEveryFewEpochs: on a Redis Cluster the
// region leader reads the candidate set of each of the 16,384 hash slots
// every report, and trims their marks past the horizon only at its first
// epoch report and then every regional.ClusterTrimEvery-th (a trim of each
// every epoch doubled the commands of the read); a mark past the horizon
// is never read into a report, trimmed or not, and reports between epochs
// neither trim nor count.
func TestClusterCandidateSetsTrimmedEveryFewEpochs(t *testing.T) {
	// A Redis cluster of its own, mostly waited for (redis-cli forms it
	// by polling): it runs beside the package's other parallel tests.
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { rdb.Close() })
	cfg := regiontest.MustConfig(t, oneRegion)
	srv, err := regional.New(regional.Options{Region: "local", Redis: rdb, Config: regional.StaticConfig{C: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	// The leader's global tier is never called here: the read is Redis's.
	global, err := allocator.NewClient([]string{grpctest.ClosingAddr(t).Addr}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { global.Close() })
	l, err := regional.NewLeader(srv, regional.LeaderOptions{
		Etcd: etcdtest.Start(t).Client(t), ElectionPrefix: "/sl/election/", Global: global, Identity: "local-1"})
	if err != nil {
		t.Fatal(err)
	}

	epoch := time.Second
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	sendUS := now.UnixMicro()
	stale, fresh := luascripts.CandKey(luascripts.DefaultPrefix, 100), luascripts.CandKey(luascripts.DefaultPrefix, 9000)
	mark := func() {
		t.Helper()
		if err := rdb.ZAdd(ctx, stale, redis.Z{Score: 1, Member: "stale|read"}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZAdd(ctx, fresh, redis.Z{Score: float64(sendUS), Member: "fresh|read"}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	read := func(epochReport bool) (trimmed bool) {
		t.Helper()
		keys, err := regional.CandidatesForTest(ctx, l, sendUS, epoch, epochReport)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(keys, []quota.Key{{Tenant: "fresh", Class: "read"}}) {
			t.Fatalf("candidates %v, want the fresh mark alone", keys)
		}
		err = rdb.ZScore(ctx, stale, "stale|read").Err()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return errors.Is(err, redis.Nil)
	}
	mark()
	if !read(true) {
		t.Fatal("a leader's first epoch report left a mark past the horizon")
	}
	mark()
	if read(false) {
		t.Fatal("a report between epochs trimmed")
	}
	for i := 1; i < regional.ClusterTrimEvery; i++ {
		if read(true) {
			t.Fatalf("epoch report %d after a trim trimmed again", i)
		}
	}
	if !read(true) {
		t.Fatalf("epoch report %d after a trim left a mark past the horizon", regional.ClusterTrimEvery)
	}
}

// BenchmarkClusterCandidateRead: an epoch report's read of the candidate
// sets of a three-node Redis Cluster on loopback (16,384 sets, all
// empty), with the trim of every set (the first epoch report of a
// leadership, then every regional.ClusterTrimEvery-th) and without it.
//
//	go test -run '^$' -bench ClusterCandidateRead -benchtime 40x ./pkg/regional/
func BenchmarkClusterCandidateRead(b *testing.B) {
	ctx := context.Background()
	addrs := redistest.StartCluster(b, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	b.Cleanup(func() { rdb.Close() })
	srv, err := regional.New(regional.Options{Region: "local", Redis: rdb, Config: regional.StaticConfig{C: regiontest.MustConfig(b, oneRegion)}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Close)
	global, err := allocator.NewClient([]string{grpctest.ClosingAddr(b).Addr}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { global.Close() })
	etcd := etcdtest.Start(b).Client(b)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, trimmed := range []bool{true, false} {
		name := "untrimmed"
		if trimmed {
			name = "trimmed"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				// A new leader's first epoch report trims; its second does not.
				b.StopTimer()
				l, err := regional.NewLeader(srv, regional.LeaderOptions{Etcd: etcd, ElectionPrefix: "/e/", Global: global, Identity: "x"})
				if err != nil {
					b.Fatal(err)
				}
				if !trimmed {
					if _, err := regional.CandidatesForTest(ctx, l, now.UnixMicro(), time.Second, true); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				if _, err := regional.CandidatesForTest(ctx, l, now.UnixMicro(), time.Second, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
