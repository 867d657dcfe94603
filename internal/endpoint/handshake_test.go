package endpoint_test

import (
	"crypto/tls"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/endpoint"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/tlstest"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// TestRefusedHandshakesAreCountedAndLogged: a client refused in the TLS
// handshake (no certificate, an expired one, one of another CA) never
// reaches the interceptors and sees only Unavailable; the server counts
// each refusal by reason and logs it, naming the certificate's identity,
// once per peer and reason per minute. A client whose certificate is
// good is served.
func TestRefusedHandshakesAreCountedAndLogged(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := tlsconfig.NewCA("ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := tlsconfig.NewCA("rogue", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	leaf := func(ca *tlsconfig.CA, l tlsconfig.Leaf, at time.Time) {
		if err := ca.WriteLeaf(dir, l, at, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	leaf(ca, tlsconfig.Leaf{Name: "server", DNSNames: []string{"localhost"}, Server: true}, now)
	leaf(ca, tlsconfig.Leaf{Name: "good", URIs: []string{"spiffe://test/good"}, Client: true}, now)
	leaf(ca, tlsconfig.Leaf{Name: "expired", URIs: []string{"spiffe://test/expired"}, Client: true}, now.Add(-3*time.Hour))
	leaf(rogue, tlsconfig.Leaf{Name: "rogue", URIs: []string{"spiffe://test/rogue"}, Client: true}, now)
	path := func(n string) string { return filepath.Join(dir, n) }

	srvTLS, err := tlsconfig.Server(path("server.crt"), path("server.key"), path("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	e, err := endpoint.Listen(endpoint.Options{Name: "test", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off",
		ServerTLS: srvTLS, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.Serve()
	t.Cleanup(func() { e.Drain(); e.Wait() })

	call := func(cert string) error {
		c, key := "", ""
		if cert != "" {
			c, key = path(cert+".crt"), path(cert+".key")
		}
		cfg, err := tlsconfig.Client(path("ca.crt"), c, key, "localhost")
		if err != nil {
			t.Fatal(err)
		}
		if cert == "expired" {
			// tlsconfig's client does not present a certificate outside its
			// validity; other clients do, and the server must refuse it.
			forced := cfg.Certificates[0]
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &forced, nil }
		}
		return tlstest.Check(t, e.GRPCAddr(), cfg)
	}
	if err := call("good"); err != nil {
		t.Fatalf("a client with a good certificate: %v", err)
	}
	counted := func(reason string) float64 {
		return metrictest.Series(t, e.Registry, "sluice_rpc_handshake_refused_total", map[string]string{"reason": reason})
	}
	for _, c := range []struct{ cert, reason, names string }{
		{"", endpoint.RefusedNoCertificate, ""},
		{"expired", endpoint.RefusedExpired, "identity=spiffe://test/expired"},
		{"rogue", endpoint.RefusedUnknownAuthority, "identity=spiffe://test/rogue"},
	} {
		for i := 1; i <= 3; i++ {
			if err := call(c.cert); err == nil {
				t.Fatalf("%s: a refused certificate was served", c.reason)
			}
			// The server notes the refusal after the client sees it.
			for deadline := time.Now().Add(5 * time.Second); counted(c.reason) < float64(i); {
				if time.Now().After(deadline) {
					t.Fatalf("%s: sluice_rpc_handshake_refused_total %v after %d refusals", c.reason, counted(c.reason), i)
				}
				time.Sleep(time.Millisecond)
			}
		}
		if n := logs.Count("reason=" + c.reason); n != 1 {
			t.Errorf("%s: logged %d times for 3 refusals of one peer, want once:\n%s", c.reason, n, logs.String())
		}
		if c.names != "" && logs.Count(c.names) != 1 {
			t.Errorf("%s: the log does not name the certificate (%s):\n%s", c.reason, c.names, logs.String())
		}
	}
	if counted(endpoint.RefusedOther) != 0 {
		t.Errorf("refusals counted as other: %v", counted(endpoint.RefusedOther))
	}
}
