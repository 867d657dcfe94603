package envoyrls_test

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// The benchmarks compare Envoy's per-request decision served from leases
// (one regional process, a key whose limit is never reached, so every
// decision is an allow from held tokens) with the baseline of going to
// Redis per request: check.lua, the token-bucket script of strict mode,
// run with EVALSHA through go-redis. Both run with the same number of
// concurrent callers. Sub-benchmarks separate the transport:
//
//	ShouldRateLimit/grpc       Envoy's view: loopback gRPC + lease decision
//	ShouldRateLimit/inprocess  the handler alone, no transport
//	PerRequestEvalSha/direct   one EVALSHA per call from the caller
//	PerRequestEvalSha/grpc     loopback gRPC + one EVALSHA per call
//
// Besides ns/op each reports the p50 and p99 latency of one call.

const benchConfig = `
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {std: {read: {rate: 1000000000/s, burst: 1000000000}}}
default_tier: std
envoy: {descriptors: [{domain: sluice, tenant_key: tenant, class_key: class}]}
`

// benchParallelism × GOMAXPROCS callers.
const benchParallelism = 8

var benchKey = quota.Key{Tenant: "acme", Class: "read"}

func benchRequest() *rlsv3.RateLimitRequest {
	return request("sluice", 0, desc("tenant", benchKey.Tenant, "class", benchKey.Class))
}

// latencies collects per-call latencies from parallel callers.
type latencies struct {
	mu  sync.Mutex
	all []time.Duration // guarded by mu
}

func (l *latencies) add(own []time.Duration) {
	l.mu.Lock()
	l.all = append(l.all, own...)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.all) == 0 {
		return
	}
	slices.Sort(l.all)
	at := func(q float64) float64 { return float64(l.all[int(q*float64(len(l.all)-1))].Nanoseconds()) }
	b.ReportMetric(at(0.50), "p50-ns")
	b.ReportMetric(at(0.99), "p99-ns")
}

// runParallel calls call from benchParallelism × GOMAXPROCS goroutines
// and reports the latency percentiles. call returns false on a wrong
// answer (it reports the error itself).
func runParallel(b *testing.B, call func(ctx context.Context) bool) {
	var lat latencies
	ctx := context.Background()
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		own := make([]time.Duration, 0, 4096)
		defer func() { lat.add(own) }()
		for pb.Next() {
			start := time.Now()
			ok := call(ctx)
			own = append(own, time.Since(start))
			if !ok {
				return
			}
		}
	})
	b.StopTimer()
	lat.report(b)
}

func expectOK(b *testing.B, resp *rlsv3.RateLimitResponse, err error) bool {
	if err != nil {
		b.Error(err)
		return false
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		b.Errorf("answer %v; the key's limit is never reached", resp)
		return false
	}
	return true
}

// startBenchService starts one regional daemon on a real redis-server
// serving svc, with svc deciding from the daemon's loopback lease client,
// and returns the daemon's gRPC address.
func startBenchService(b *testing.B) (*envoyrls.Service, string) {
	rs := redistest.Start(b)
	cfg := regiontest.MustConfig(b, benchConfig)
	svc, err := envoyrls.New(envoyrls.Options{Config: regional.StaticConfig{C: cfg}})
	if err != nil {
		b.Fatal(err)
	}
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: rs.Addr(),
		Config: regional.StaticConfig{C: cfg}, ColdStart: regional.ColdStartFull,
		Unleased: true, // one region, no global tier: static shares unconditional
		Logger:   slog.New(slog.DiscardHandler),
		Envoy:    svc,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.Stop)
	lim, err := envoyrls.DialLoopback(d.GRPCAddr(), nil, lease.Options{InstanceID: "envoy-bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lim.Close(context.Background()) })
	svc.SetLimiter(lim)
	return svc, d.GRPCAddr()
}

func BenchmarkShouldRateLimit(b *testing.B) {
	svc, addr := startBenchService(b)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := benchRequest()
	// The first call takes the key's first lease.
	if resp, err := client.ShouldRateLimit(context.Background(), req); !expectOK(b, resp, err) {
		b.FailNow()
	}

	b.Run("grpc", func(b *testing.B) {
		runParallel(b, func(ctx context.Context) bool {
			resp, err := client.ShouldRateLimit(ctx, req)
			return expectOK(b, resp, err)
		})
	})
	b.Run("inprocess", func(b *testing.B) {
		runParallel(b, func(ctx context.Context) bool {
			resp, err := svc.ShouldRateLimit(ctx, req)
			return expectOK(b, resp, err)
		})
	})
}

// BenchmarkShouldRateLimitHandler is the handler alone, called from one
// goroutine, no transport: a request resolved, decided from a held lease
// (the real lease client), counted and answered with its headers. Its
// allocs/op is what every answer costs the garbage collector.
//
//	go test -run '^$' -bench ShouldRateLimitHandler -benchmem ./pkg/envoyrls/
func BenchmarkShouldRateLimitHandler(b *testing.B) {
	svc, _ := startBenchService(b)
	req := benchRequest()
	ctx := context.Background()
	if resp, err := svc.ShouldRateLimit(ctx, req); !expectOK(b, resp, err) {
		b.FailNow()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		resp, err := svc.ShouldRateLimit(ctx, req)
		if !expectOK(b, resp, err) {
			b.FailNow()
		}
	}
}

// evalShaService is the baseline rate-limit service: one check.lua
// EVALSHA per descriptor per request, no leases.
type evalShaService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	rdb     *redis.Client
	scripts *luascripts.Scripts
	common  luascripts.Common
}

func (s *evalShaService) check(ctx context.Context, k quota.Key) (bool, error) {
	r, err := s.scripts.Check(ctx, s.rdb, luascripts.KeysFor(luascripts.DefaultPrefix, k), s.common, 1)
	return r.Allowed, err
}

func (s *evalShaService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for _, d := range req.GetDescriptors() {
		var k quota.Key
		for _, e := range d.GetEntries() {
			switch e.GetKey() {
			case "tenant":
				k.Tenant = e.GetValue()
			case "class":
				k.Class = e.GetValue()
			}
		}
		allowed, err := s.check(ctx, k)
		if err != nil {
			return nil, err
		}
		code := rlsv3.RateLimitResponse_OK
		if !allowed {
			code, resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: code})
	}
	return resp, nil
}

func BenchmarkPerRequestEvalSha(b *testing.B) {
	rs := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), PoolSize: 4 * benchParallelism})
	b.Cleanup(func() { rdb.Close() })
	svc := &evalShaService{rdb: rdb, scripts: luascripts.New(), common: luascripts.Common{
		StaticRate: 1e9, StaticBurst: 1e9, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8, DemandWindow: 500 * time.Millisecond,
	}}
	if err := svc.scripts.Load(context.Background(), rdb); err != nil {
		b.Fatal(err)
	}
	if ok, err := svc.check(context.Background(), benchKey); err != nil || !ok {
		b.Fatalf("first check: allowed %v, %v", ok, err)
	}

	b.Run("direct", func(b *testing.B) {
		runParallel(b, func(ctx context.Context) bool {
			ok, err := svc.check(ctx, benchKey)
			if err != nil || !ok {
				b.Errorf("check: allowed %v, %v", ok, err)
				return false
			}
			return true
		})
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, svc)
	go g.Serve(lis)
	b.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := benchRequest()
	b.Run("grpc", func(b *testing.B) {
		runParallel(b, func(ctx context.Context) bool {
			resp, err := client.ShouldRateLimit(ctx, req)
			return expectOK(b, resp, err)
		})
	})
}
