package agent_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestAListOfReplicasSpreadsLeasesAndSurvivesOneStopping: -region-addr
// naming two replicas of one region (one Redis) sends the agent's lease
// RPCs to both, and with one of them stopped the other answers every new
// key from a lease: nothing is decided by on_failure. With one address, a
// stopped replica left the agent degraded until it came back.
//
// The replica stops while an Acquire is in flight on it, as a replica that
// dies under load does and as one stopped between two requests does when
// the agent sends the next before it read the close (a busy machine: the
// request after the first leased answer was decided by on_failure). The
// cut Acquire is sent again to the other replica (lease.ServiceConfig), so
// that key is leased too.
func TestAListOfReplicasSpreadsLeasesAndSurvivesOneStopping(t *testing.T) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	rs := redistest.Start(t)
	var regs [2]*prometheus.Registry
	for i := range regs {
		regs[i] = prometheus.NewRegistry()
	}
	// Replica 0, once armed, stops under the next Acquire it receives.
	var armed atomic.Bool
	var cut atomic.Int64
	var stopping *grpc.Server
	var addr0 string
	stopping, addr0 = startReplica(t, rs, cfg, regs[0], func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != sluicev1.LeaseService_Acquire_FullMethodName || !armed.CompareAndSwap(true, false) {
			return handler(ctx, req)
		}
		cut.Add(1)
		go stopping.Stop() // closes every connection, this call's too
		<-ctx.Done()
		return nil, ctx.Err()
	})
	other := regiontest.StartOn(t, rs, cfg, "local", func(o *regional.Options) { o.Registerer = regs[1] })
	a := startAgent(t, addr0+","+other.Addr, agent.StaticConfig{C: cfg})
	web := httpClient(t)
	acquires := func(i int) float64 {
		return metrictest.Series(t, regs[i], "sluice_regional_requests_total", map[string]string{"method": "Acquire", "code": "OK"})
	}
	n := 0
	fresh := func() agent.AllowResponse {
		n++
		return allow(t, web, a, fmt.Sprintf(`{"tenant":"t%d","class":"read"}`, n))
	}
	// round_robin alternates between the ready replicas: a few fresh keys
	// reach both once both are connected.
	const keys = 20
	for acquires(0) == 0 || acquires(1) == 0 {
		if n == keys {
			t.Fatalf("after %d fresh keys, acquires per replica %v and %v: the list is not spread", n, acquires(0), acquires(1))
		}
		if out := fresh(); !out.Allowed || out.Degraded {
			t.Fatalf("a fresh key with both replicas up: %+v", out)
		}
	}

	armed.Store(true)
	for start := n; cut.Load() == 0; {
		if n == start+keys {
			t.Fatalf("%d fresh keys after arming, none reached replica 0", keys)
		}
		if out := fresh(); !out.Allowed || out.Degraded {
			t.Fatalf("fresh key %d, its Acquire cut by its replica stopping: %+v; want it leased from the other", n, out)
		}
	}
	for range keys {
		if out := fresh(); !out.Allowed || out.Degraded {
			t.Fatalf("fresh key %d with one replica of two stopped: %+v; want it leased from the other", n, out)
		}
	}
	if got := acquires(0); got == 0 {
		t.Fatalf("replica 0 answered no Acquire")
	}
}

// startReplica runs a regional replica of region "local" on rs, as
// regiontest.StartOn does, with the interceptor ic on its gRPC server; it
// returns the server and its address.
func startReplica(t *testing.T, rs *redistest.Server, cfg *config.Config, reg *prometheus.Registry, ic grpc.UnaryServerInterceptor) (*grpc.Server, string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { rdb.Close() })
	srv, err := regional.New(regional.Options{Region: "local", Redis: rdb, Config: regional.StaticConfig{C: cfg},
		Unleased: true, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.UnaryInterceptor(ic))
	srv.Register(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return g, lis.Addr().String()
}

// TestACutSyncOrReleaseIsSentToTheOtherReplica: a Sync or a Release cut
// by its replica's stop is sent once more through the next pick
// (lease.ServiceConfig), as an Acquire is: the agent's lease client sees it
// answered, not UNAVAILABLE, and no decision meanwhile is degraded. Replica
// 0 stops under the agent's periodic Sync (every refresh while a key holds
// a lease), or under its Release of keys idle for IdleTimeout.
func TestACutSyncOrReleaseIsSentToTheOtherReplica(t *testing.T) {
	for _, method := range []string{"Sync", "Release"} {
		t.Run(method, func(t *testing.T) { cutOnceAndResent(t, method) })
	}
}

func cutOnceAndResent(t *testing.T, method string) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	refresh := time.Duration(cfg.Refresh)
	full := sluicev1.LeaseService_Sync_FullMethodName
	if method == "Release" {
		full = sluicev1.LeaseService_Release_FullMethodName
	}
	rs := redistest.Start(t)
	var armed atomic.Bool
	var cut atomic.Int64
	var stopping *grpc.Server
	var addr0 string
	stopping, addr0 = startReplica(t, rs, cfg, prometheus.NewRegistry(), func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod != full || !armed.CompareAndSwap(true, false) {
			return handler(ctx, req)
		}
		cut.Add(1)
		go stopping.Stop() // closes every connection, this call's too
		<-ctx.Done()
		return nil, ctx.Err()
	})
	reg1 := prometheus.NewRegistry()
	other := regiontest.StartOn(t, rs, cfg, "local", func(o *regional.Options) { o.Registerer = reg1 })
	a := startAgent(t, addr0+","+other.Addr, agent.StaticConfig{C: cfg}, func(o *agent.Options) { o.Lease.IdleTimeout = 2 * refresh })
	web := httpClient(t)
	calls := func(code string) uint64 {
		t.Helper()
		return metrictest.Samples(t, a.Registry(), "sluice_client_rpc_duration_seconds", func(l map[string]string) bool {
			return l["method"] == method && (code == "" || l["code"] == code)
		})
	}
	// ask keeps a key's lease in use, so the agent syncs it every refresh,
	// and leases a fresh one, which the agent releases once idle.
	n := 0
	ask := func(what string) {
		t.Helper()
		n++
		for _, body := range []string{`{"tenant":"t","class":"read"}`, fmt.Sprintf(`{"tenant":"t%d","class":"read"}`, n)} {
			if out := allow(t, web, a, body); out.Degraded {
				t.Fatalf("%s: %+v, degraded (a replica answers)", what, out)
			}
		}
	}
	poll := func(what string, done func() bool) {
		t.Helper()
		deadline := time.Now().Add(100 * refresh)
		for !done() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, 100*refresh)
			}
			ask(what)
			time.Sleep(refresh / 4)
		}
	}
	// Replica 1 answers the method before replica 0 is armed, so both
	// are connected.
	poll(method+" answered by replica 1", func() bool {
		return metrictest.Series(t, reg1, "sluice_regional_requests_total", map[string]string{"method": method, "code": "OK"}) > 0
	})
	armed.Store(true)
	poll(method+" reaching replica 0 once armed", func() bool { return cut.Load() > 0 })
	at := calls("")
	// The owner loop sends them one after another: two more observed
	// means the cut one ended.
	poll("the cut "+method+" to end", func() bool { return calls("") >= at+2 })
	if got := calls("Unavailable"); got != 0 {
		t.Fatalf("%d %s calls failed UNAVAILABLE: the one cut by its replica's stop was not sent to the other", got, method)
	}
}
