package regiontest

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tlstest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// RolesPKI writes a test PKI for a regional daemon of region "local"
// under mutual TLS: its own certificate "regional" (spiffe://t/region/local,
// also serving localhost) and a client certificate named client
// (spiffe://t/<client>), whose roles RolesConfig sets.
func RolesPKI(t testing.TB, client string) *tlstest.PKI {
	t.Helper()
	return tlstest.Write(t,
		tlsconfig.Leaf{Name: "regional", URIs: []string{"spiffe://t/region/local"}, DNSNames: []string{"localhost"}, Server: true, Client: true},
		tlsconfig.Leaf{Name: client, URIs: []string{"spiffe://t/" + client}, Client: true})
}

// RolesConfig is a one-region config (class read, 10/s, burst 10,
// on_failure local) whose identities give the daemon of RolesPKI its
// region's roles and the client certificate the roles named
// (comma-separated, e.g. "envoy" to leave out instance).
func RolesConfig(t testing.TB, client, roles string) *config.Config {
	t.Helper()
	return MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {on_failure: local}}
tiers: {free: {read: {rate: 10/s, burst: 10}}}
default_tier: free
auth:
  identities:
    - {match: spiffe://t/region/local, roles: "instance, region:local"}
    - {match: spiffe://t/`+client+`, roles: "`+roles+`"}
`)
}

// StartMTLS starts a regional daemon of region "local" on its own
// redis-server, serving gRPC under mutual TLS with pki's "regional"
// certificate and the config src holds, stopped at test cleanup.
func StartMTLS(t testing.TB, pki *tlstest.PKI, src regional.ConfigSource) *regional.Daemon {
	t.Helper()
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: redistest.Start(t).Addr(),
		Config: src, ColdStart: regional.ColdStartFull, Unleased: true, ServerTLS: pki.Server(t, "regional"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d
}
