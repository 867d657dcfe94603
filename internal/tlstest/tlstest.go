// Package tlstest writes a test PKI for tests of mutual TLS: a CA and leaf
// certificates (pkg/tlsconfig's CA, as sluicectl certs issues them) in a
// temporary directory, and the TLS configurations that load them. The
// certificates are valid for an hour from the call.
package tlstest

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// PKI is a directory holding ca.crt and <Name>.crt, <Name>.key for each
// leaf written.
type PKI struct {
	// Dir is the directory, removed when the test ends.
	Dir string
	ca  *tlsconfig.CA
}

// Write issues a CA and the leaves into a new temporary directory.
func Write(t testing.TB, leaves ...tlsconfig.Leaf) *PKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	ca, err := tlsconfig.NewCA("sluice test CA", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	for _, l := range leaves {
		if err := ca.WriteLeaf(dir, l, now, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	return &PKI{Dir: dir, ca: ca}
}

// WriteLeaf issues one more leaf from the PKI's CA, valid from notBefore
// for validity (e.g. one that has expired), into the directory.
func (p *PKI) WriteLeaf(t testing.TB, l tlsconfig.Leaf, notBefore time.Time, validity time.Duration) {
	t.Helper()
	if err := p.ca.WriteLeaf(p.Dir, l, notBefore, validity); err != nil {
		t.Fatal(err)
	}
}

// Path is the path of a file in the directory (ca.crt, <Name>.crt, ...).
func (p *PKI) Path(name string) string { return filepath.Join(p.Dir, name) }

// Server is the server configuration of leaf name, requiring client
// certificates from the CA.
func (p *PKI) Server(t testing.TB, name string) *tls.Config {
	t.Helper()
	c, err := tlsconfig.Server(p.Path(name+".crt"), p.Path(name+".key"), p.Path("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Client is the client configuration presenting leaf name and verifying
// the server by serverName (the dialed host when empty).
func (p *PKI) Client(t testing.TB, name, serverName string) *tls.Config {
	t.Helper()
	c, err := tlsconfig.Client(p.Path("ca.crt"), p.Path(name+".crt"), p.Path(name+".key"), serverName)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Creds is Client as gRPC transport credentials.
func (p *PKI) Creds(t testing.TB, name, serverName string) credentials.TransportCredentials {
	t.Helper()
	return credentials.NewTLS(p.Client(t, name, serverName))
}

// Check calls the gRPC health service at addr over TLS with cfg, bounded
// by 5 s, and returns the call's error: a handshake refused either way
// is Unavailable.
func Check(t testing.TB, addr string, cfg *tls.Config) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}
