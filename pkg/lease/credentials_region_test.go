package lease_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/internal/tlstest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// TestRefusedCredentialsAreLoggedAsSuchNotAsAnOutage: a regional service
// behind mutual TLS refuses a client whose certificate lacks the instance
// role. The client decides by on_failure meanwhile, as it must with no
// answer to decide from, but logs once, at error level, that its
// credentials were refused and which role it needs, so the operator does
// not look for an outage of a region that is up.
func TestRefusedCredentialsAreLoggedAsSuchNotAsAnOutage(t *testing.T) {
	pki := tlstest.Write(t,
		tlsconfig.Leaf{Name: "regional", URIs: []string{"spiffe://t/region/local"}, DNSNames: []string{"localhost"}, Server: true, Client: true},
		tlsconfig.Leaf{Name: "envoy", URIs: []string{"spiffe://t/envoy"}, Client: true})
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {on_failure: local}}
tiers: {free: {read: {rate: 10/s, burst: 10}}}
default_tier: free
auth:
  identities:
    - {match: spiffe://t/region/local, roles: "instance, region:local"}
    - {match: spiffe://t/envoy, roles: envoy}
`)
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: redistest.Start(t).Addr(),
		Config: regional.StaticConfig{C: cfg}, ColdStart: regional.ColdStartFull, Unleased: true, ServerTLS: pki.Server(t, "regional"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)

	dial := func(who string) *grpc.ClientConn {
		conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(pki.Creds(t, who, "localhost")))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	logs := &logtest.Buffer{}
	c, err := lease.NewClient(dial("envoy"), lease.Options{
		InstanceID: "wrong-role", BreakerTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	key := quota.Key{Tenant: "acme", Class: "read"}
	for range 3 {
		d, err := c.Allow(context.Background(), key, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Degraded {
			t.Fatalf("a refused client decided %+v from a lease", d)
		}
	}
	const refused = "the regional service refused this client's credentials"
	if n := logs.Count(refused); n != 1 {
		t.Fatalf("%q logged %d times, want once:\n%s", refused, n, logs)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, refused) {
			for _, want := range []string{"level=ERROR", "instance role", "PermissionDenied"} {
				if !strings.Contains(line, want) {
					t.Fatalf("the refusal's log line lacks %q: %s", want, line)
				}
			}
		}
	}

	// The same region answers a client whose certificate holds the role.
	ok, err := lease.NewClient(dial("regional"), lease.Options{InstanceID: "right-role", BreakerTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ok.Close(context.Background()) })
	if d, err := ok.Allow(context.Background(), key, 1); err != nil || d.Degraded || !d.Allowed {
		t.Fatalf("a client with the instance role: %+v, %v", d, err)
	}
}
