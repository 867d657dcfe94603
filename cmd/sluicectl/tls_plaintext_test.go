package main

import (
	"strings"
	"testing"
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
