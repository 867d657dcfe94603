package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// TestRedisOverMutualTLS: -redis-tls-ca, -redis-tls-cert and -redis-tls-key
// reach a real redis-server that serves TLS only (--port 0) and requires
// client certificates; a lease is granted from a bucket in that Redis.
// The certificates come from the CA sluicectl certs uses.
func TestRedisOverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	f := func(n string) string { return filepath.Join(dir, n) }
	now := time.Now()
	ca, err := tlsconfig.NewCA("test CA", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	for _, l := range []tlsconfig.Leaf{
		{Name: "redis", DNSNames: []string{"redis.sluice-local.svc"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true},
		{Name: "regional", URIs: []string{"spiffe://t/region/local"}, Client: true},
	} {
		if err := ca.WriteLeaf(dir, l, now, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	admin, err := tlsconfig.Client(f("ca.crt"), f("regional.crt"), f("regional.key"), "")
	if err != nil {
		t.Fatal(err)
	}
	rs := redistest.StartTLS(t, admin, f("redis.crt"), f("redis.key"), f("ca.crt"), true)
	cfg := "regions: {local: {weight: 1}}\nclasses: {read: {}}\ntiers: {free: {read: {rate: 100/s, burst: 100}}}\ndefault_tier: free\n"
	if err := os.WriteFile(f("sluice.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	served := make(chan string, 1)
	go func() {
		done <- runNotifying(ctx, []string{"-region", "local", "-listen", "127.0.0.1:0", "-metrics-listen", "off",
			"-redis-addr", rs.Addr(), "-config", f("sluice.yaml"), "-unleased", "-cold-start", "full",
			"-redis-tls-ca", f("ca.crt"), "-redis-tls-cert", f("regional.crt"), "-redis-tls-key", f("regional.key")},
			os.Stdout, func(addr string) { served <- addr })
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
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	g, err := sluicev1.NewLeaseServiceClient(conn).Acquire(rctx, &sluicev1.AcquireRequest{InstanceId: "i1",
		Report: &sluicev1.KeyReport{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "read"}, Seq: 1, Want: 10}})
	if err != nil || g.GetGrant().GetGranted() != 10 {
		t.Fatalf("acquire over a Redis reached by TLS: %v %v", g, err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), TLSConfig: admin})
	defer rdb.Close()
	if keys, err := rdb.Keys(ctx, "*acme*").Result(); err != nil || len(keys) == 0 {
		t.Fatalf("acme's keys in the TLS Redis: %v %v", keys, err)
	}
}

// TestRedisTLSFlags: the -redis-tls* flags build the client configuration
// towards Redis; a certificate without its key is refused naming the
// flags; no flag is plaintext.
func TestRedisTLSFlags(t *testing.T) {
	parse := func(args ...string) *flags {
		t.Helper()
		f, err := parseFlags(args)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	if c, err := redisTLSConfig(parse()); c != nil || err != nil {
		t.Errorf("no flag: %v %v, want plaintext", c, err)
	}
	if c, err := redisTLSConfig(parse("-redis-tls")); c == nil || c.RootCAs != nil || err != nil {
		t.Errorf("-redis-tls: %v %v, want TLS with the system roots", c, err)
	}
	if c, err := redisTLSConfig(parse("-redis-tls-name", "redis.internal")); c == nil || c.ServerName != "redis.internal" || err != nil {
		t.Errorf("-redis-tls-name: %v %v", c, err)
	}
	_, err := redisTLSConfig(parse("-redis-tls-cert", "/x.crt"))
	if err == nil || !strings.Contains(err.Error(), "-redis-tls-key") {
		t.Errorf("a certificate without its key: %v", err)
	}
}
