package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/grpctest"
)

// TestPlaintextToATLSServiceSaysTLSNotUnreachable: a service behind TLS
// closes a connection made without -tls-ca before speaking gRPC. The
// service is up and the flags are missing, so lease, check and status say
// to give -tls-ca and exit exitRefused, not "unreachable" or "a global
// failover may be in progress". With the flags the same service answers.
func TestPlaintextToATLSServiceSaysTLSNotUnreachable(t *testing.T) {
	addr, dir := tlsRegion(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"lease", []string{"lease", "-addr", addr, "-tenant", "acme", "-class", "read"}},
		{"check", []string{"check", "-addr", addr, "-tenant", "acme", "-class", "export"}},
		{"status", []string{"-global-addr", addr, "status"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := sluicectl(t, "", tc.args...)
			wantCode(t, r, exitRefused)
			wantContains(t, "stderr", r.stderr, "TLS listener", "give -tls-ca")
			for _, never := range []string{"is the regional service running", "failover", "cannot be reached"} {
				if strings.Contains(r.stderr, never) {
					t.Fatalf("stderr says %q of a service that is up:\n%s", never, r)
				}
			}
		})
	}
	r := sluicectl(t, "", append(tlsFlags(dir, "instance"), "lease", "-addr", addr, "-tenant", "acme", "-class", "read")...)
	wantCode(t, r, exitOK)
}

// TestNoClientCertToAnMTLSServiceSaysGiveTheCert: a service requiring
// client certificates asks for one in the TLS handshake, then drops a
// connection that presented none; the call fails with a broken pipe, a
// reset or a TLS alert, whichever comes first. Given -tls-ca alone, lease,
// check and status say that the service asked for a client certificate
// and to give -tls-cert/-tls-key, and exit exitRefused, not
// "unreachable". Each runs several times, since which failure the call
// meets varies. The same flags against an address nothing listens on
// still say unreachable.
func TestNoClientCertToAnMTLSServiceSaysGiveTheCert(t *testing.T) {
	addr, dir := tlsRegion(t)
	ca := []string{"-tls-ca", filepath.Join(dir, "ca.crt")}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"lease", append(ca, "lease", "-addr", addr, "-tenant", "acme", "-class", "read")},
		{"check", append(ca, "check", "-addr", addr, "-tenant", "acme", "-class", "export")},
		{"status", append(ca, "-global-addr", addr, "status")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 5 {
				r := sluicectl(t, "", tc.args...)
				wantCode(t, r, exitRefused)
				wantContains(t, "stderr", r.stderr, "asked for a client certificate", "give -tls-cert and -tls-key")
				for _, never := range []string{"is the regional service running", "failover", "cannot be reached"} {
					if strings.Contains(r.stderr, never) {
						t.Fatalf("stderr says %q of a service that is up:\n%s", never, r)
					}
				}
			}
		})
	}
	r := sluicectl(t, "", append(ca, "lease", "-addr", grpctest.RefusedAddr(t), "-tenant", "acme", "-class", "read")...)
	wantCode(t, r, exitUnreachable)
	if strings.Contains(r.stderr, "client certificate") {
		t.Fatalf("stderr blames a client certificate for an address nothing listens on:\n%s", r)
	}
}
