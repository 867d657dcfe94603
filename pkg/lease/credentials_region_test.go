package lease_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
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
	pki := regiontest.RolesPKI(t, "envoy")
	cfg := regiontest.RolesConfig(t, "envoy", "envoy")
	d := regiontest.StartMTLS(t, pki, regional.StaticConfig{C: cfg})

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

// liveConfig is a regional.ConfigSource a test switches, as a config
// applied to etcd switches the daemon's.
type liveConfig struct{ p atomic.Pointer[config.Config] }

func (l *liveConfig) Current() *config.Config { return l.p.Load() }

// TestRefusedCredentialsAreADistinctStateUntilTheRoleIsGiven: a client
// whose certificate lacks the instance role decides by on_failure (it has
// no lease to decide from), but is told apart from a client that cannot
// reach its region: sluice_client_credentials_refused is 1 beside
// sluice_client_degraded, the degraded-mode line says the region refuses
// its credentials, not that it is unreachable, and the error line naming
// the missing role is repeated once per RefusedLogInterval while the
// refusals go on. Once the config gives the certificate the role, the
// gauge returns to 0 and the client leases again.
func TestRefusedCredentialsAreADistinctStateUntilTheRoleIsGiven(t *testing.T) {
	pki := regiontest.RolesPKI(t, "app")
	cfgWith := func(appRoles string) *config.Config { return regiontest.RolesConfig(t, "app", appRoles) }
	live := &liveConfig{}
	live.p.Store(cfgWith("envoy"))
	d := regiontest.StartMTLS(t, pki, live)
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(pki.Creds(t, "app", "localhost")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	const (
		cooldown = 20 * time.Millisecond
		every    = 100 * time.Millisecond
	)
	logs := &logtest.Buffer{}
	reg := prometheus.NewRegistry()
	c, err := lease.NewClient(conn, lease.Options{
		InstanceID: "app", BreakerTimeout: 2 * time.Second, BreakerCooldown: cooldown, RefusedLogInterval: every,
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	key := quota.Key{Tenant: "acme", Class: "read"}
	allow := func() quota.Decision {
		t.Helper()
		dec, err := c.Allow(context.Background(), key, 1)
		if err != nil {
			t.Fatal(err)
		}
		return dec
	}
	start := time.Now() // before the first refusal is logged
	if dec := allow(); !dec.Degraded {
		t.Fatalf("a refused client decided %+v from a lease", dec)
	}
	if v := metrictest.Gauge(t, reg, "sluice_client_credentials_refused"); v != 1 {
		t.Errorf("sluice_client_credentials_refused = %v while the region refuses the client, want 1", v)
	}
	if v := metrictest.Gauge(t, reg, "sluice_client_degraded"); v != 1 {
		t.Errorf("sluice_client_degraded = %v while the client decides by on_failure, want 1", v)
	}
	if n := logs.Count("refuses this client's credentials, deciding with on_failure policies (degraded mode)"); n != 1 {
		t.Errorf("the degraded-mode line naming the refusal was logged %d times, want once:\n%s", n, logs)
	}
	if strings.Contains(logs.String(), "unreachable") {
		t.Errorf("a region that answers is logged as unreachable:\n%s", logs)
	}
	const refused = "the regional service refused this client's credentials"
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, refused) {
			for _, want := range []string{"level=ERROR", "needs=instance", "code=PermissionDenied", `needs role \"instance\"`} {
				if !strings.Contains(line, want) {
					t.Errorf("the refusal's log line lacks %s: %s", want, line)
				}
			}
		}
	}

	// The refusals go on (the breaker lets a probe through every
	// cooldown): the error line comes again after RefusedLogInterval.
	deadline := time.Now().Add(100 * (every + cooldown))
	for logs.Count(refused) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the refusal was not logged again within %v:\n%s", 100*(every+cooldown), logs)
		}
		allow()
		<-time.After(cooldown)
	}
	if elapsed := time.Since(start); elapsed < every {
		t.Errorf("the refusal was logged again after %v, before RefusedLogInterval %v", elapsed, every)
	}

	// The config gives the certificate the role: the client leases again.
	live.p.Store(cfgWith("envoy, instance"))
	for dec := allow(); dec.Degraded; dec = allow() {
		if time.Now().After(deadline) {
			t.Fatalf("the client still decides by on_failure after its role was given:\n%s", logs)
		}
		<-time.After(cooldown)
	}
	if v := metrictest.Gauge(t, reg, "sluice_client_credentials_refused"); v != 0 {
		t.Errorf("sluice_client_credentials_refused = %v once the region accepts the client, want 0", v)
	}
	if n := logs.Count("accepts this client's credentials again"); n != 1 {
		t.Errorf("the end of the refusals was logged %d times, want once:\n%s", n, logs)
	}
}

// TestExpiredCertificateIsARefusalNotAnOutage: a client whose certificate
// has expired would be refused by the regional service's TLS handshake,
// which under TLS 1.3 reaches the client after its first write, often as
// a broken pipe, as an unreachable region's would. Its TLS configuration
// does not present the certificate, so the handshake's error names it, and
// the client tells it apart: sluice_client_credentials_refused is 1, an
// error line names the certificate's validity and the fix, and the
// degraded-mode line says its credentials are refused, not that the region
// is unreachable.
func TestExpiredCertificateIsARefusalNotAnOutage(t *testing.T) {
	pki := regiontest.RolesPKI(t, "app")
	pki.WriteLeaf(t, tlsconfig.Leaf{Name: "app", URIs: []string{"spiffe://t/app"}, Client: true},
		time.Now().Add(-2*time.Hour), time.Hour)
	d := regiontest.StartMTLS(t, pki, regional.StaticConfig{C: regiontest.RolesConfig(t, "app", "instance")})
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(pki.Creds(t, "app", "localhost")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	logs := &logtest.Buffer{}
	reg := prometheus.NewRegistry()
	c, err := lease.NewClient(conn, lease.Options{
		InstanceID: "app", BreakerTimeout: 2 * time.Second, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	dec, err := c.Allow(context.Background(), quota.Key{Tenant: "acme", Class: "read"}, 1)
	if err != nil || !dec.Degraded {
		t.Fatalf("a client with an expired certificate: %+v, %v; want a decision by on_failure", dec, err)
	}
	if v := metrictest.Gauge(t, reg, "sluice_client_credentials_refused"); v != 1 {
		t.Errorf("sluice_client_credentials_refused = %v with an expired certificate, want 1", v)
	}
	const refused = "this client's TLS certificate is outside its validity period"
	if n := logs.Count(refused); n != 1 {
		t.Errorf("%q logged %d times, want once:\n%s", refused, n, logs)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, refused) && (!strings.Contains(line, "level=ERROR") || !strings.Contains(line, "app.crt is valid from")) {
			t.Errorf("the refusal's line lacks its level or the certificate's validity: %s", line)
		}
	}
	if n := logs.Count("refuses this client's credentials, deciding with on_failure policies (degraded mode)"); n != 1 {
		t.Errorf("the degraded-mode line naming the refusal was logged %d times, want once:\n%s", n, logs)
	}
	if strings.Contains(logs.String(), "unreachable") {
		t.Errorf("a region refusing an expired certificate is logged as unreachable:\n%s", logs)
	}
}
