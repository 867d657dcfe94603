package flagenv

import (
	"testing"

	// gRPC's own resolvers (dns, passthrough), registered as in every
	// command that dials.
	_ "google.golang.org/grpc"
)

func TestHostPortAndGRPCTarget(t *testing.T) {
	for _, c := range []struct {
		addr       string
		hostPort   string // HostPort's error, "" for none
		grpcTarget string // GRPCTarget's error, "" for none
	}{
		{"127.0.0.1:7400", "", ""},
		{":7400", "", ""},
		{"[::1]:7400", "", ""},
		{"sluice-regional.ns.svc:7400", "", ""},
		{"", "it is empty", "it is empty"},
		{"127.0.0.1:", "missing port", "missing port"},
		{"127.0.0.1", "missing port in address", "missing port in address"},
		{"foo", "missing port in address", "missing port in address"},
		{"::1:7400", "too many colons in address", "too many colons in address"},
		{"dns:///sluice-regional.ns.svc:7400", "too many colons in address", ""},
		{"passthrough:///127.0.0.1:7400", "too many colons in address", ""},
		{"nosuchscheme:///x:1", "too many colons in address", "too many colons in address"},
	} {
		if got := errText(HostPort(c.addr)); got != c.hostPort {
			t.Errorf("HostPort(%q) = %q, want %q", c.addr, got, c.hostPort)
		}
		if got := errText(GRPCTarget(c.addr)); got != c.grpcTarget {
			t.Errorf("GRPCTarget(%q) = %q, want %q", c.addr, got, c.grpcTarget)
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
