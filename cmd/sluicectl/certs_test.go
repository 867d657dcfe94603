package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// TestCertsServeARegionWithRoles writes a deployment's certificates with
// sluicectl certs, adds the auth section it wrote to a config and serves a
// regional service with them over mutual TLS: the instance certificate
// takes a lease, the Envoy and operator certificates are refused the
// LeaseService with PermissionDenied, and the regional certificate (its
// own Envoy endpoint's lease client) takes one too.
func TestCertsServeARegionWithRoles(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"certs", "-dir", dir, "-regions", "local", "-domain", "sluice.test"}, nil, &out, &errb); code != exitOK {
		t.Fatalf("certs: exit %d: %s", code, errb.String())
	}
	auth, err := os.ReadFile(filepath.Join(dir, "auth.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(`
regions: {local: {weight: 1}}
classes: {read: {}}
tiers: {free: {read: {rate: 100/s, burst: 100}}}
default_tier: free
` + string(auth)))
	if err != nil {
		t.Fatalf("the written auth section: %v", err)
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	serverTLS, err := tlsconfig.Server(f("regional-local.crt"), f("regional-local.key"), f("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	rs := redistest.Start(t)
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: rs.Addr(),
		Config: regional.StaticConfig{C: cfg}, ColdStart: regional.ColdStartFull, Unleased: true, ServerTLS: serverTLS,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	acquire := func(who string) error {
		tc, err := tlsconfig.Client(f("ca.crt"), f(who+".crt"), f(who+".key"), "")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = sluicev1.NewLeaseServiceClient(conn).Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: who,
			Report: &sluicev1.KeyReport{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "read"}, Seq: 1, Want: 1}})
		return err
	}
	for _, who := range []string{"instance", "regional-local"} {
		if err := acquire(who); err != nil {
			t.Errorf("%s certificate: %v", who, err)
		}
	}
	for _, who := range []string{"envoy", "operator"} {
		if err := acquire(who); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `needs role "instance"`) {
			t.Errorf("%s certificate: %v, want PermissionDenied", who, err)
		}
	}
}
