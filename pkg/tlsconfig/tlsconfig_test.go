package tlsconfig_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/tlstest"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// authority is a CA made for one test.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // PEM certificate
}

func newSerial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newAuthority(t *testing.T, dir, name string) *authority {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &authority{cert: cert, key: key, file: writePEM(t, dir, name+".pem", "CERTIFICATE", der)}
}

// issue signs a leaf certificate and returns its certificate and key files.
func (a *authority) issue(t *testing.T, dir, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, dir, name+".crt", "CERTIFICATE", der), writePEM(t, dir, name+".key", "PRIVATE KEY", keyDER)
}

// serve runs a gRPC health server with cfg on a loopback port.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	healthpb.RegisterHealthServer(s, health.NewServer())
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func mustClient(t *testing.T, ca, cert, key string) *tls.Config {
	t.Helper()
	cfg, err := tlsconfig.Client(ca, cert, key, "")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestMutualTLS serves gRPC with a client CA: a client with a certificate
// from that CA gets through; one without a certificate, with one from
// another CA, or trusting another CA is refused.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newAuthority(t, dir, "ca")
	rogue := newAuthority(t, dir, "rogue-ca")
	serverCert, serverKey := ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := ca.issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	rogueCert, rogueKey := rogue.issue(t, dir, "intruder", x509.ExtKeyUsageClientAuth)

	srvCfg, err := tlsconfig.Server(serverCert, serverKey, ca.file)
	if err != nil {
		t.Fatal(err)
	}
	if srvCfg.ClientAuth != tls.RequireAndVerifyClientCert || srvCfg.MinVersion != tls.VersionTLS12 {
		t.Fatalf("server config: client auth %v, min version %x", srvCfg.ClientAuth, srvCfg.MinVersion)
	}
	addr := serve(t, srvCfg)

	if err := tlstest.Check(t, addr, mustClient(t, ca.file, clientCert, clientKey)); err != nil {
		t.Fatalf("client with a valid certificate refused: %v", err)
	}
	// A client does not even offer a certificate that the server's
	// CertificateRequest does not accept; force it, so that the server
	// has to verify and refuse it.
	intruder := mustClient(t, ca.file, rogueCert, rogueKey)
	forced := intruder.Certificates[0]
	intruder.Certificates = nil
	intruder.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &forced, nil }
	for name, cfg := range map[string]*tls.Config{
		"no client certificate":            mustClient(t, ca.file, "", ""),
		"certificate from another CA":      intruder,
		"server not trusted by the client": mustClient(t, rogue.file, clientCert, clientKey),
	} {
		err := tlstest.Check(t, addr, cfg)
		t.Logf("%s: %v", name, err)
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: got %v, want the handshake to fail (Unavailable)", name, err)
		}
	}

	// Without a client CA the server is plain TLS: no client certificate
	// needed, the server certificate still verified.
	plainCfg, err := tlsconfig.Server(serverCert, serverKey, "")
	if err != nil {
		t.Fatal(err)
	}
	plain := serve(t, plainCfg)
	if err := tlstest.Check(t, plain, mustClient(t, ca.file, "", "")); err != nil {
		t.Fatalf("TLS without client certificates: %v", err)
	}
	if err := tlstest.Check(t, plain, mustClient(t, rogue.file, "", "")); status.Code(err) != codes.Unavailable {
		t.Fatalf("client trusting another CA: %v, want Unavailable", err)
	}
}

func TestNilWithoutFiles(t *testing.T) {
	if cfg, err := tlsconfig.Server("", "", ""); cfg != nil || err != nil {
		t.Fatalf("Server with no files: %v %v, want nil nil", cfg, err)
	}
	if cfg, err := tlsconfig.Client("", "", "", ""); cfg != nil || err != nil {
		t.Fatalf("Client with no files: %v %v, want nil nil", cfg, err)
	}
	cfg, err := tlsconfig.Client("", "", "", "global.example")
	if err != nil || cfg == nil || cfg.ServerName != "global.example" || cfg.RootCAs != nil || cfg.MinVersion != tls.VersionTLS12 {
		t.Fatalf("Client with only a server name: %+v %v, want TLS with system roots", cfg, err)
	}
}

// TestErrorsNameTheFile checks that every refusal says which file (or
// which missing half of a pair) is at fault.
func TestErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	ca := newAuthority(t, dir, "ca")
	cert, key := ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	_, otherKey := ca.issue(t, dir, "other", x509.ExtKeyUsageServerAuth)
	missing := filepath.Join(dir, "missing.pem")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		call func() (*tls.Config, error)
		want string
	}{
		{"server cert missing", func() (*tls.Config, error) { return tlsconfig.Server(missing, key, "") }, missing},
		{"server key missing", func() (*tls.Config, error) { return tlsconfig.Server(cert, missing, "") }, missing},
		{"server key of another cert", func() (*tls.Config, error) { return tlsconfig.Server(cert, otherKey, "") }, otherKey},
		{"server without key", func() (*tls.Config, error) { return tlsconfig.Server(cert, "", "") }, cert},
		{"client CA without server cert", func() (*tls.Config, error) { return tlsconfig.Server("", "", ca.file) }, "certificate file and a key file are both required"},
		{"client CA missing", func() (*tls.Config, error) { return tlsconfig.Server(cert, key, missing) }, missing},
		{"client CA not PEM", func() (*tls.Config, error) { return tlsconfig.Server(cert, key, garbage) }, garbage},
		{"CA missing", func() (*tls.Config, error) { return tlsconfig.Client(missing, "", "", "") }, missing},
		{"CA not PEM", func() (*tls.Config, error) { return tlsconfig.Client(garbage, "", "", "") }, garbage},
		{"client cert without key", func() (*tls.Config, error) { return tlsconfig.Client(ca.file, cert, "", "") }, cert},
		{"client key missing", func() (*tls.Config, error) { return tlsconfig.Client(ca.file, cert, missing, "") }, missing},
	} {
		cfg, err := c.call()
		if err == nil || cfg != nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, %v; want an error naming %q", c.name, cfg, err, c.want)
		}
	}
}

// TestIssueCertificate: the certificate Issue signs, as a tls.Certificate:
// its leaf names l, carries its usages and verifies against the CA's Pool; a leaf
// with no usage is refused.
func TestIssueCertificate(t *testing.T) {
	now := time.Now()
	ca, err := tlsconfig.NewCA("test-ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.IssueCertificate(tlsconfig.Leaf{Name: "svc", URIs: []string{"spiffe://test/svc"}, Client: true}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := ca.Pool()
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the leaf does not verify as a client of the CA: %v", err)
	}
	if leaf.Subject.CommonName != "svc" || len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://test/svc" {
		t.Errorf("leaf names %q, URIs %v", leaf.Subject.CommonName, leaf.URIs)
	}
	if _, err := ca.IssueCertificate(tlsconfig.Leaf{Name: "nothing"}, now, time.Hour); err == nil {
		t.Error("a leaf with neither server nor client usage was issued")
	}
}

// TestClientDoesNotPresentACertificateOutsideItsValidity: a client whose
// certificate has expired, or is not yet valid, fails its own handshake
// with an error wrapping ErrCertificateNotValid that names the file and
// its validity, instead of presenting it and learning of the refusal from
// a broken connection; a valid one from the same files is presented.
func TestClientDoesNotPresentACertificateOutsideItsValidity(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsconfig.NewCA("test CA", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(dir); err != nil {
		t.Fatal(err)
	}
	server := tlsconfig.Leaf{Name: "server", DNSNames: []string{"localhost"}, Server: true}
	client := tlsconfig.Leaf{Name: "client", URIs: []string{"spiffe://t/app"}, Client: true}
	if err := ca.WriteLeaf(dir, server, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	srvCfg, err := tlsconfig.Server(filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"), filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, srvCfg)
	for name, from := range map[string]time.Time{
		"expired":       time.Now().Add(-2 * time.Hour),
		"not yet valid": time.Now().Add(time.Hour),
	} {
		if err := ca.WriteLeaf(dir, client, from, time.Hour); err != nil {
			t.Fatal(err)
		}
		cfg, err := tlsconfig.Client(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"), "localhost")
		if err != nil {
			t.Fatal(err)
		}
		err = tlstest.Check(t, addr, cfg)
		msg := status.Convert(err).Message()
		if status.Code(err) != codes.Unavailable || !strings.Contains(msg, tlsconfig.ErrCertificateNotValid.Error()) ||
			!strings.Contains(msg, "client.crt is valid from") {
			t.Errorf("%s client certificate: %v; want the handshake to fail naming the certificate's validity", name, err)
		}
	}
	if err := ca.WriteLeaf(dir, client, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	cfg, err := tlsconfig.Client(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"), "localhost")
	if err != nil {
		t.Fatal(err)
	}
	if err := tlstest.Check(t, addr, cfg); err != nil {
		t.Fatalf("valid client certificate: %v", err)
	}
}
