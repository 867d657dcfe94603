// Package regiontest runs a real regional service for tests: a real
// redis-server (internal/redistest), a regional.Server and a gRPC server on
// a free loopback port, all stopped at test cleanup.
package regiontest

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/sluicehq/sluice/internal/endpoint"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regional"
)

// Region is one running regional service.
type Region struct {
	Redis  *redistest.Server
	RDB    *redis.Client
	Server *regional.Server
	GRPC   *grpc.Server
	Addr   string // gRPC address
}

// Option adjusts the regional.Options before the server starts.
type Option func(*regional.Options)

// Start runs a regional service for region with cfg on its own redis-server.
func Start(t testing.TB, cfg *config.Config, region string, opts ...Option) *Region {
	t.Helper()
	return StartOn(t, redistest.Start(t), cfg, region, opts...)
}

// StartOn runs a regional service on an existing redis-server (several
// replicas of one region share one).
func StartOn(t testing.TB, rs *redistest.Server, cfg *config.Config, region string, opts ...Option) *Region {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{
		Addr: rs.Addr(), DialTimeout: 200 * time.Millisecond,
		ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: 1,
	})
	t.Cleanup(func() { rdb.Close() })
	// No global tier runs here: the static shares are unconditional
	// (regional.Options.Unleased), as the regional tier alone behaves. A
	// test of the static lease sets it back to false with an Option.
	o := regional.Options{Region: region, Redis: rdb, Config: regional.StaticConfig{C: cfg}, Unleased: true}
	for _, f := range opts {
		f(&o)
	}
	srv, err := regional.New(o)
	if err != nil {
		t.Fatalf("regional.New: %v", err)
	}
	t.Cleanup(srv.Close) // after g.Stop (cleanups run last first): no RPC is left
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	// As the daemon's endpoint: lease clients' keepalive pings permitted.
	g := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
		MinTime: endpoint.MinPingInterval, PermitWithoutStream: true}))
	srv.Register(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return &Region{Redis: rs, RDB: rdb, Server: srv, GRPC: g, Addr: lis.Addr().String()}
}

// Dial returns a client connection to the region, closed at cleanup.
func (r *Region) Dial(t testing.TB) *grpc.ClientConn {
	t.Helper()
	return Dial(t, r.Addr)
}

// Dial returns a plaintext client connection to a regional service at
// addr (a daemon's GRPCAddr), closed at cleanup.
func Dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// RedisNow is the region's Redis time.
func (r *Region) RedisNow(t testing.TB) time.Time {
	t.Helper()
	now, err := r.RDB.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("redis TIME: %v", err)
	}
	return now
}

// MustConfig parses a YAML config or fails the test.
func MustConfig(t testing.TB, yaml string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// SwappedConfig is a regional.ConfigSource a test replaces with Store, as
// a configstore.Watcher replaces its config when etcd holds a new one.
// Safe for concurrent use.
type SwappedConfig struct{ p atomic.Pointer[config.Config] }

// Store makes cfg the live config.
func (s *SwappedConfig) Store(cfg *config.Config) { s.p.Store(cfg) }

// Current is the live config.
func (s *SwappedConfig) Current() *config.Config { return s.p.Load() }

// TwoRegionsConfig is the YAML of a config whose every key runs at 5/s
// with the given burst over two regions of equal weight, "local" and
// "far" (a test starts only "local"): the region's static share is half
// the rate and half the burst, so its cap is below the key's configured
// burst. partitionShare is every class's partition_share ("" leaves it
// to the default); "read" is a lease class, "export" a strict one that
// fails closed, and Envoy descriptors map tenant and class.
func TwoRegionsConfig(partitionShare string, burst int) string {
	share := ""
	if partitionShare != "" {
		share = ", partition_share: " + partitionShare
	}
	return fmt.Sprintf(`
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}, far: {weight: 1}}
classes:
  read:   {mode: lease%[1]s}
  export: {mode: strict, on_failure: closed%[1]s}
tiers: {std: {read: {rate: 5/s, burst: %[2]d}, export: {rate: 5/s, burst: %[2]d}}}
default_tier: std
envoy: {descriptors: [{domain: sluice, tenant_key: tenant, class_key: class}]}
`, share, burst)
}
