package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// TestMutualTLSServesEnvoyThroughItsOwnLeases runs the command with mutual
// TLS on a wildcard listen address: the Envoy endpoint's loopback lease
// client presents the service's own certificate (role instance) and
// verifies it by its DNS name, so an Envoy certificate's request is
// decided from a lease; an instance certificate is refused the Envoy
// endpoint.
func TestMutualTLSServesEnvoyThroughItsOwnLeases(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := tlsconfig.NewCA("test CA", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	for _, l := range []tlsconfig.Leaf{
		{Name: "regional", URIs: []string{"spiffe://t/region/local"}, DNSNames: []string{"sluice-regional.sluice-local.svc", "localhost"}, Server: true, Client: true},
		{Name: "envoy", URIs: []string{"spiffe://t/envoy"}, Client: true},
		{Name: "instance", URIs: []string{"spiffe://t/instance"}, Client: true},
	} {
		if err := ca.WriteLeaf(dir, l, now, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	f := func(n string) string { return filepath.Join(dir, n) }
	cfg := `
regions: {local: {weight: 1}}
classes: {read: {}}
tiers: {free: {read: {rate: 100/s, burst: 100}}}
default_tier: free
envoy: {descriptors: [{domain: sluice, tenant_key: tenant, class: read}]}
auth:
  identities:
    - {match: spiffe://t/region/local, roles: "instance, region:local"}
    - {match: spiffe://t/envoy, roles: envoy}
    - {match: spiffe://t/instance, roles: instance}
`
	if err := os.WriteFile(f("sluice.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	rs := redistest.Start(t)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	served := make(chan string, 1)
	go func() {
		done <- runNotifying(ctx, []string{"-region", "local", "-listen", "127.0.0.1:0", "-metrics-listen", "off",
			"-redis-addr", rs.Addr(), "-config", f("sluice.yaml"), "-unleased", "-cold-start", "full",
			"-tls-cert", f("regional.crt"), "-tls-key", f("regional.key"), "-tls-client-ca", f("ca.crt"), "-tls-ca", f("ca.crt")}, os.Stdout, func(addr string) { served <- addr })
	}()
	var addr string
	select {
	case addr = <-served:
	case err := <-done:
		stop()
		t.Fatalf("the service ended before it served: %v", err)
	}
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	ask := func(who string) (*rlsv3.RateLimitResponse, error) {
		tc, err := tlsconfig.Client(f("ca.crt"), f(who+".crt"), f(who+".key"), "localhost")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(rctx, &rlsv3.RateLimitRequest{Domain: "sluice",
			Descriptors: []*corev3.RateLimitDescriptor{{Entries: []*corev3.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}}}})
	}
	// The service starts in the background: poll until it decides from a
	// lease, which puts the key's bucket in Redis (a loopback that cannot
	// reach the service decides by on_failure alone, and never does).
	rdb := rs.Client()
	defer rdb.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := ask("envoy")
		keys, kerr := rdb.Keys(context.Background(), "*acme*").Result()
		if err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OK && kerr == nil && len(keys) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Envoy certificate's request was never decided from a lease: %v %v, acme's Redis keys %v %v", resp, err, keys, kerr)
		}
		time.Sleep(50 * time.Millisecond) // polling start-up with a deadline
	}
	if _, err := ask("instance"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("instance certificate on the Envoy endpoint: %v, want PermissionDenied", err)
	}
}
