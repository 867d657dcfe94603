package rpcguard_test

import (
	"context"
	"net"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/pkg/rpcguard"
)

// blockingHealth holds every Check until release is closed.
type blockingHealth struct {
	healthpb.UnimplementedHealthServer
	entered chan struct{}
	release chan struct{}
}

func (b *blockingHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	b.entered <- struct{}{}
	<-b.release
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// TestConnectionsAreBoundedApart serves calls through the guard over real
// gRPC: a connection with its cap in flight and its queue full is refused
// ResourceExhausted naming the bounds, while another connection is served
// at once; a request naming more units than its rule allows is refused
// InvalidArgument before its handler.
func TestConnectionsAreBoundedApart(t *testing.T) {
	reg := prometheus.NewRegistry()
	g, err := rpcguard.New(rpcguard.Options{PerConnection: 2, QueueFactor: 1, Registerer: reg, Rules: map[string]rpcguard.Rule{
		"/grpc.health.v1.Health/Check": {Units: func(req any) int { return len(req.(*healthpb.HealthCheckRequest).GetService()) }, Max: 2, Bound: "letters_per_service"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(g.Unary()))
	h := &blockingHealth{entered: make(chan struct{}, 16), release: make(chan struct{})}
	healthpb.RegisterHealthServer(srv, h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	dial := func() healthpb.HealthClient {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return healthpb.NewHealthClient(conn)
	}
	ctx := t.Context()
	flood, other := dial(), dial()

	if _, err := flood.Check(ctx, &healthpb.HealthCheckRequest{Service: "abc"}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "letters_per_service=2") {
		t.Fatalf("3 units against a bound of 2: %v", err)
	}
	// Two calls of one unit fill the connection's cap; two more fill its
	// queue (both wait); the fifth is refused.
	errs := make(chan error, 4)
	for range 4 {
		go func() { _, err := flood.Check(ctx, &healthpb.HealthCheckRequest{Service: "a"}); errs <- err }()
	}
	<-h.entered
	<-h.entered
	for waiting(t, reg) < 2 {
		runtime.Gosched() // the two waiters reach the server's queue
	}
	_, refused := flood.Check(ctx, &healthpb.HealthCheckRequest{Service: "a"})
	if status.Code(refused) != codes.ResourceExhausted {
		t.Fatalf("past the queue: %v, want ResourceExhausted", refused)
	}
	if !strings.Contains(refused.Error(), "inflight_per_connection") {
		t.Errorf("refusal does not name the bound: %v", refused)
	}
	// Another connection is not held up by the first one's queue.
	go func() { _, err := other.Check(ctx, &healthpb.HealthCheckRequest{Service: "a"}); errs <- err }()
	<-h.entered
	close(h.release)
	for range 5 { // the four of the first connection and the other's
		if err := <-errs; err != nil {
			t.Errorf("a queued call failed: %v", err)
		}
	}
}

// waiting is how many calls have waited for a turn on a connection.
func waiting(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "sluice_rpc_waits_total" {
			for _, m := range mf.GetMetric() {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestStreamsAreBoundedForTheirWholeLife serves health Watch streams
// through the guard: an open stream holds its unit until it ends, the next
// waits its turn, the one past the queue is refused ResourceExhausted
// before its handler, and the waiting one starts when the first ends.
func TestStreamsAreBoundedForTheirWholeLife(t *testing.T) {
	reg := prometheus.NewRegistry()
	g, err := rpcguard.New(rpcguard.Options{PerConnection: 1, QueueFactor: 1, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(g.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := healthpb.NewHealthClient(conn)

	firstCtx, endFirst := context.WithCancel(t.Context())
	first, err := c.Watch(firstCtx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Recv(); err != nil {
		t.Fatalf("the first stream: %v", err)
	}
	second, err := c.Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for waiting(t, reg) < 1 {
		runtime.Gosched() // the second stream reaches the server's queue
	}
	third, err := c.Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := third.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a stream past the queue: %v, want ResourceExhausted", err)
	}
	endFirst()
	if _, err := second.Recv(); err != nil {
		t.Fatalf("the waiting stream after the first ended: %v", err)
	}
}
