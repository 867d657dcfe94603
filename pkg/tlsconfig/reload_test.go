package tlsconfig_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// handshake dials addr with cfg and returns the serial numbers of the
// server's certificate and of the one the client presented, as the server
// saw it (seen).
func handshake(t *testing.T, addr string, cfg *tls.Config, seen <-chan *big.Int) (server, client *big.Int, err error) {
	t.Helper()
	c, dialErr := tls.Dial("tcp", addr, cfg)
	if dialErr == nil {
		defer c.Close()
		server = c.ConnectionState().PeerCertificates[0].SerialNumber
	}
	select { // the server's side of this connection
	case client = <-seen:
	case <-time.After(10 * time.Second):
		t.Fatal("the server never finished the handshake")
	}
	if dialErr != nil {
		return nil, nil, dialErr
	}
	if client == nil {
		return nil, nil, errors.New("the server refused the handshake")
	}
	return server, client, nil
}

func serialOf(t *testing.T, file string) *big.Int {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(file, file[:len(file)-len(".crt")]+".key")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.SerialNumber
}

// TestCertificatesRotateWithoutRestart: files replaced in place (a renewed
// Secret) are what the next handshakes present, on both sides, within
// ReloadInterval; a new client CA is trusted as soon.
func TestCertificatesRotateWithoutRestart(t *testing.T) {
	defer func(d time.Duration) { tlsconfig.ReloadInterval = d }(tlsconfig.ReloadInterval)
	tlsconfig.ReloadInterval = 20 * time.Millisecond
	dir := t.TempDir()
	ca := newAuthority(t, dir, "ca")
	serverCert, serverKey := ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := ca.issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	srvCfg, err := tlsconfig.Server(serverCert, serverKey, ca.file)
	if err != nil {
		t.Fatal(err)
	}
	cliCfg := mustClient(t, ca.file, clientCert, clientKey)

	lis, err := tls.Listen("tcp", "127.0.0.1:0", srvCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	seen := make(chan *big.Int, 1)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			var serial *big.Int // nil: refused
			if tc.Handshake() == nil {
				serial = tc.ConnectionState().PeerCertificates[0].SerialNumber
			}
			seen <- serial
			tc.Close()
		}
	}()
	addr := lis.Addr().String()

	s0, c0 := serialOf(t, serverCert), serialOf(t, clientCert)
	if s, c, err := handshake(t, addr, cliCfg, seen); err != nil || s.Cmp(s0) != 0 || c.Cmp(c0) != 0 {
		t.Fatalf("first handshake: server %v client %v (%v), want %v %v", s, c, err, s0, c0)
	}

	// Renew both certificates in place.
	ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	ca.issue(t, dir, "client", x509.ExtKeyUsageClientAuth)
	s1, c1 := serialOf(t, serverCert), serialOf(t, clientCert)
	waitFor(t, "the renewed certificates", func() bool {
		s, c, err := handshake(t, addr, cliCfg, seen)
		return err == nil && s.Cmp(s1) == 0 && c.Cmp(c1) == 0
	})

	// A new client CA: a client it signed is let in once the file changes.
	newCA := newAuthority(t, dir, "ca2")
	ca.issue(t, dir, "server", x509.ExtKeyUsageServerAuth)
	nc, nk := newCA.issue(t, dir, "client2", x509.ExtKeyUsageClientAuth)
	newClient := mustClient(t, ca.file, nc, nk)
	if _, _, err := handshake(t, addr, newClient, seen); err == nil {
		t.Fatal("a client of a CA the server does not trust yet was let in")
	}
	pem, err := os.ReadFile(newCA.file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca.file, pem, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new client CA", func() bool {
		_, _, err := handshake(t, addr, newClient, seen)
		return err == nil
	})
}

// waitFor polls cond until it holds, within a deadline far beyond
// ReloadInterval (a loaded machine).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10*time.Second + 10*tlsconfig.ReloadInterval); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s never took effect", what)
		}
		time.Sleep(tlsconfig.ReloadInterval)
	}
}
