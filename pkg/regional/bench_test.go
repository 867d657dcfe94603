package regional_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// The benchmarks of this file are read as ratios from one run (the machine
// is shared and noisy):
//
//	go test -run '^$' -bench 'RPC|Raw' -benchtime 3s ./pkg/regional/
//
// BenchmarkRawEvalSha is the floor of any per-request Redis design: the
// seed's minimal token bucket script via EVALSHA from the same process.
// BenchmarkRawCheckScript runs Sluice's check.lua the same way (no gRPC).
// BenchmarkCheckRPC and BenchmarkAcquireRPC go through gRPC, validation and
// config resolution. All use 32 concurrent callers over 1,000 keys.

const benchParallelism = 16 // × GOMAXPROCS(2) = 32 callers

const benchConfig = `
regions: {local: {weight: 1}}
classes:
  read:   {mode: lease}
  export: {mode: strict}
tiers:
  free: {read: {rate: 1000000/s, burst: 1000000}, export: {rate: 1000000/s, burst: 1000000}}
default_tier: free
`

// seedBucket is the seed's token bucket (rate, burst, cost, ttl), the
// baseline a per-request Redis limiter pays.
const seedBucket = `
local rate, burst, cost, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local d = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(d[1]), tonumber(d[2])
if tokens == nil then tokens = burst; ts = now end
local delta = now - ts
if delta < 0 then delta = 0 end
tokens = math.min(burst, tokens + delta * rate)
local allowed = 0
if tokens >= cost then tokens = tokens - cost; allowed = 1 end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'ts', string.format('%.6f', now))
redis.call('EXPIRE', KEYS[1], ttl)
return { allowed, math.floor(tokens) }
`

func benchKeys() []string {
	ks := make([]string, 1000)
	for i := range ks {
		ks[i] = "t" + strconv.Itoa(i)
	}
	return ks
}

func BenchmarkRawEvalSha(b *testing.B) {
	reg := regiontest.Start(b, regiontest.MustConfig(b, benchConfig), "local")
	rdb := redis.NewClient(&redis.Options{Addr: reg.Redis.Addr(), PoolSize: 64})
	defer rdb.Close()
	script := redis.NewScript(seedBucket)
	ctx := context.Background()
	if err := script.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	keys := benchKeys()
	var n atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := "bench:" + keys[n.Add(1)%int64(len(keys))]
			if err := script.EvalSha(ctx, rdb, []string{k}, 1000000, 1000000, 1, 60).Err(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkRawCheckScript(b *testing.B) {
	reg := regiontest.Start(b, regiontest.MustConfig(b, benchConfig), "local")
	rdb := redis.NewClient(&redis.Options{Addr: reg.Redis.Addr(), PoolSize: 64})
	defer rdb.Close()
	ctx := context.Background()
	sc := luascripts.New()
	if err := sc.Load(ctx, rdb); err != nil {
		b.Fatal(err)
	}
	common := luascripts.Common{StaticRate: 1e6, StaticBurst: 1e6, LeaseTTL: 5e9, Reclaim: true, ReapBudget: 8, DemandWindow: 5e8}
	keys := benchKeys()
	var n atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := luascripts.KeysFor("sl:", quota.Key{Tenant: keys[n.Add(1)%int64(len(keys))], Class: "export"})
			if _, err := sc.Check(ctx, rdb, k, common, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkCheckRPC(b *testing.B) {
	benchRPC(b, func(ctx context.Context, c sluicev1.LeaseServiceClient, tenant string, seq uint64) error {
		_, err := c.Check(ctx, &sluicev1.CheckRequest{Key: qk(tenant, "export"), Cost: 1})
		return err
	})
}

func BenchmarkAcquireRPC(b *testing.B) {
	benchRPC(b, func(ctx context.Context, c sluicev1.LeaseServiceClient, tenant string, seq uint64) error {
		_, err := c.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "bench",
			Report: &sluicev1.KeyReport{Key: qk(tenant, "read"), Seq: seq, Want: 100, Min: 1}})
		return err
	})
}

func benchRPC(b *testing.B, call func(context.Context, sluicev1.LeaseServiceClient, string, uint64) error) {
	reg := regiontest.Start(b, regiontest.MustConfig(b, benchConfig), "local")
	client := sluicev1.NewLeaseServiceClient(reg.Dial(b))
	ctx := context.Background()
	keys := benchKeys()
	var n atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if err := call(ctx, client, keys[i%int64(len(keys))], uint64(i)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
