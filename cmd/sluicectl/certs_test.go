package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// TestCertsServeARegionWithRoles writes a deployment's certificates with
// sluicectl certs, adds the auth section it wrote to a config and serves a
// regional service with them over mutual TLS: the instance certificate
// takes a lease, the Envoy and operator certificates are refused the
// LeaseService with PermissionDenied, and the regional certificate (its
// own Envoy endpoint's lease client) takes one too.
func TestCertsServeARegionWithRoles(t *testing.T) {
	addr, dir := tlsRegion(t)
	f := func(name string) string { return filepath.Join(dir, name) }
	acquire := func(who string) error {
		tc, err := tlsconfig.Client(f("ca.crt"), f(who+".crt"), f(who+".key"), "")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
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
