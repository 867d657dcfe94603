package agent_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestAgentAnswersFromTheRegionSoonAfterALongOutage: after a regional
// service was gone for many connection attempts, the agent answers from
// the region again within a few of its capped reconnect delays
// (lease.MaxReconnectDelay) of the region coming back on the same address.
// With gRPC's default backoff (growing to 120 s) the next attempt after
// the eighth failed one comes at least 0.8 × 1.6^6 s ≈ 13 s later: the
// agent stayed degraded 20-28 s after a 45 s outage ended.
//
// The outage is counted in attempts, not waited out: until the region
// comes back its address accepts each connection and closes it at once,
// as a region whose pods are being replaced does.
func TestAgentAnswersFromTheRegionSoonAfterALongOutage(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease, on_failure: open}}
tiers: {std: {read: {rate: 1000/s, burst: 1000}}}
default_tier: std
`)
	gone := grpctest.ClosingAddr(t)
	addr := gone.Addr

	a := startAgent(t, addr, agent.StaticConfig{C: cfg})
	web := httpClient(t)
	const body = `{"tenant":"acme","class":"read"}`
	if out := allow(t, web, a, body); !out.Allowed || !out.Degraded {
		t.Fatalf("with the region gone: %+v, want allowed, degraded (on_failure: open)", out)
	}
	// Eight failed attempts: ~15 s with the capped backoff; gRPC's
	// default would take ~43 s. The deadline only guards a hang.
	const n = 8
	for i := range n {
		select {
		case <-gone.Attempts:
		case <-time.After(5 * time.Minute):
			t.Fatalf("only %d connection attempts to the gone region within 5m", i)
		}
	}

	// The region comes back on the same address.
	gone.Stop()
	rs := redistest.Start(t)
	srv, err := regional.New(regional.Options{Region: "local", Redis: rs.Client(), Config: regional.StaticConfig{C: cfg}, Unleased: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	relis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	served := make(chan error, 1)
	go func() { served <- g.Serve(relis) }()
	defer func() {
		g.Stop()
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Error(err)
		}
	}()
	start := time.Now()

	// The next attempt comes within MaxReconnectDelay (plus its 20%
	// jitter), the breaker lets a request through within its cooldown
	// (1 s); the rest is headroom for a loaded machine.
	bound := 5 * lease.MaxReconnectDelay
	for {
		out := allow(t, web, a, body)
		if !out.Degraded {
			break
		}
		if time.Since(start) > bound {
			t.Fatalf("still degraded %v after the region came back, want an answer from it within %v", time.Since(start), bound)
		}
		time.Sleep(lease.MaxReconnectDelay / 40) // polling the agent with a deadline
	}
	t.Logf("answered by the region %v after it came back", time.Since(start))
}
