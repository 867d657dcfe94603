package rpcguard_test

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/rpcauth"
	"github.com/sluicehq/sluice/pkg/rpcguard"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

type staticConfig struct{ c *config.Config }

func (s staticConfig) Current() *config.Config { return s.c }

// serveHealth serves a health service with opts and returns its address.
func serveHealth(t *testing.T, opts []grpc.ServerOption) string {
	t.Helper()
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	return grpctest.Serve(t, srv)
}

func healthClient(t *testing.T, addr string, creds credentials.TransportCredentials) healthpb.HealthClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

var operatorOnly = rpcauth.Policy{rpcauth.HealthService: {Role: config.RoleOperator}}

// TestServerOptionsWithoutMutualTLSServeEveryCaller: without mutual TLS
// the options authorize nobody (every call is served, bounded per
// connection) and bound the received message's size; the start-up warning
// says so.
func TestServerOptionsWithoutMutualTLSServeEveryCaller(t *testing.T) {
	var logs bytes.Buffer
	opts, err := rpcguard.ServerOptions(rpcguard.EdgeOptions{
		Config: staticConfig{&config.Config{}}, Policy: operatorOnly,
		Rules: map[string]rpcguard.Rule{"/grpc.health.v1.Health/Check": {
			Units: func(req any) int { return len(req.(*healthpb.HealthCheckRequest).GetService()) }, Max: 3, Bound: "letters"}},
		MaxMessageBytes: 64, Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Name: "probe",
	})
	if err != nil {
		t.Fatal(err)
	}
	c := healthClient(t, serveHealth(t, opts), insecure.NewCredentials())
	if _, err := c.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a call without mutual TLS: %v", err)
	}
	if _, err := c.Check(t.Context(), &healthpb.HealthCheckRequest{Service: "abcd"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a request past its rule: %v, want InvalidArgument", err)
	}
	if _, err := c.Check(t.Context(), &healthpb.HealthCheckRequest{Service: strings.Repeat("x", 100)}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a message past MaxMessageBytes: %v, want ResourceExhausted", err)
	}
	if !strings.Contains(logs.String(), "probe: no mutual TLS") {
		t.Errorf("no warning about the missing authentication:\n%s", logs.String())
	}
}

// TestServerOptionsWithMutualTLSAuthorize: with mutual TLS the options
// authorize every call by the caller's roles, warning when the config
// lists no identities; a bad Policy or bound fails naming the daemon; a
// MaxStreams (1 included) adds its option.
func TestServerOptionsWithMutualTLSAuthorize(t *testing.T) {
	now := time.Now()
	ca, err := tlsconfig.NewCA("probe CA", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := ca.Pool()
	issue := func(l tlsconfig.Leaf) tls.Certificate {
		pair, err := ca.IssueCertificate(l, now, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return pair
	}
	serverTLS := &tls.Config{Certificates: []tls.Certificate{issue(tlsconfig.Leaf{Name: "s", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})},
		ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	cfg := &config.Config{Auth: config.Auth{Identities: []config.Identity{{Match: "spiffe://probe/op", Roles: config.RoleOperator}}}}
	edge := func(c *config.Config, p rpcauth.Policy, perConn int, streams uint32, logs *bytes.Buffer) ([]grpc.ServerOption, error) {
		return rpcguard.ServerOptions(rpcguard.EdgeOptions{
			Config: staticConfig{c}, ServerTLS: serverTLS, Policy: p, PerConnection: perConn, MaxStreams: streams,
			MaxMessageBytes: 1 << 20, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(logs, nil)), Name: "probe",
		})
	}
	var logs bytes.Buffer
	opts, err := edge(cfg, operatorOnly, 0, 0, &logs)
	if err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Errorf("warned with identities configured:\n%s", logs.String())
	}
	addr := serveHealth(t, append(opts, grpc.Creds(credentials.NewTLS(serverTLS))))
	client := func(uri string) healthpb.HealthClient {
		cert := issue(tlsconfig.Leaf{Name: "c", URIs: []string{uri}, Client: true})
		return healthClient(t, addr, credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}))
	}
	if _, err := client("spiffe://probe/op").Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("the operator: %v", err)
	}
	if _, err := client("spiffe://probe/other").Check(t.Context(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a caller without the role: %v, want PermissionDenied", err)
	}

	logs.Reset()
	if _, err := edge(&config.Config{}, operatorOnly, 0, 0, &logs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "probe: mutual TLS is on but the config lists no auth.identities") {
		t.Errorf("no warning about the missing identities:\n%s", logs.String())
	}
	if _, err := edge(cfg, nil, 0, 0, &logs); err == nil {
		t.Error("mutual TLS without a Policy was accepted")
	}
	if _, err := edge(cfg, operatorOnly, -1, 0, &logs); err == nil || !strings.HasPrefix(err.Error(), "probe: ") {
		t.Errorf("a negative PerConnection: %v, want an error naming the daemon", err)
	}
	without, err := edge(cfg, operatorOnly, 0, 0, &logs)
	if err != nil {
		t.Fatal(err)
	}
	for _, streams := range []uint32{1, 8} {
		with, err := edge(cfg, operatorOnly, 0, streams, &logs)
		if err != nil {
			t.Fatal(err)
		}
		if len(with) != len(without)+1 {
			t.Errorf("%d options with MaxStreams %d, %d without: want one more", len(with), streams, len(without))
		}
	}
}
