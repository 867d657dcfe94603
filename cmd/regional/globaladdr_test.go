package main

import (
	"strings"
	"testing"
)

// TestGlobalAddrThatIsNotHostPortIsRefused: a -global-addr that is not
// host:port (a typo, a port left out) was taken as is; the replica started,
// reported ready, and the mistake showed only once it led its region, as
// sync failures while the region ran on its grants, then on its floor. It
// is refused at start, naming the flag and the address, before etcd or
// Redis is asked.
func TestGlobalAddrThatIsNotHostPortIsRefused(t *testing.T) {
	for _, tc := range []struct{ addr, bad, why string }{
		{"sluice-global", "sluice-global", "missing port in address"},
		{"127.0.0.1:7500,sluice-global", `"sluice-global"`, "missing port in address"},
		{"sluice-global:", "sluice-global:", "missing port"},
		{"a:b:7500", "a:b:7500", "too many colons in address"},
	} {
		_, err := parseFlags([]string{"-etcd-endpoints", "127.0.0.1:1", "-global-addr", tc.addr})
		if err == nil || !strings.Contains(err.Error(), "-global-addr wants host:port") ||
			!strings.Contains(err.Error(), tc.why) || !strings.Contains(err.Error(), tc.bad) {
			t.Errorf("-global-addr %q: err %v, want it to say the flag wants host:port, %q and name %s", tc.addr, err, tc.why, tc.bad)
		}
	}
	// The command exits 1 with that line, before anything else is asked.
	stderr, code := runMain(t, "-global-addr", "sluice-global", "-listen", "127.0.0.1:0", "-metrics-listen", "off")
	if code != 1 || !strings.Contains(stderr, `regional: -global-addr wants host:port`) ||
		strings.Contains(stderr, "needs -etcd-endpoints") || strings.Contains(stderr, "started") {
		t.Errorf("-global-addr sluice-global: exit %d:\n%s", code, stderr)
	}
	for _, addr := range []string{
		"127.0.0.1:7500",
		"sluice-global.sluice-us-east.svc:7500,10.0.0.7:7500",
		"sluice-global-shard-{shard}.sluice-us-east.svc:7500",
		"dns:///sluice-global.sluice-us-east.svc:7500",
		"[::1]:7500",
	} {
		if _, err := parseFlags([]string{"-etcd-endpoints", "127.0.0.1:1", "-global-addr", addr}); err != nil {
			t.Errorf("-global-addr %q refused: %v", addr, err)
		}
	}
}
