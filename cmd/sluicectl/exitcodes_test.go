package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// TestInterruptDuringANetworkStepExits130: SIGINT or SIGTERM while a
// command waits on etcd, a global allocator or a regional service that
// does not answer ends it as interrupted, as get and apply are, not as a
// service that could not be reached.
func TestInterruptDuringANetworkStepExits130(t *testing.T) {
	for _, tc := range []struct {
		name string
		args func(addr string) []string
	}{
		{"status waiting on etcd", func(addr string) []string { return []string{"-etcd-endpoints", addr, "status"} }},
		{"status waiting on the global allocator", func(addr string) []string { return []string{"-global-addr", addr, "status"} }},
		{"check waiting on a regional service", func(addr string) []string {
			return []string{"check", "-addr", addr, "-tenant", "acme"}
		}},
		{"lease waiting on a regional service", func(addr string) []string {
			return []string{"lease", "-addr", addr, "-tenant", "acme"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			addr := grpctest.SilentAddr(t, cancel)
			// -timeout far beyond the test: only the interrupt ends the wait.
			args := append([]string{"-timeout", "24h"}, tc.args(addr)...)
			r := runAppContext(t, ctx, &app{}, args...)
			wantCode(t, r, exitInterrupted)
			wantContains(t, "stderr", r.stderr, "interrupted")
		})
	}
}

// tlsRegion serves a regional service over mutual TLS with the
// certificates and auth section sluicectl certs writes, and returns its
// address and the certificate directory.
func tlsRegion(t *testing.T) (addr, dir string) {
	t.Helper()
	dir = t.TempDir()
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"certs", "-dir", dir, "-regions", "local", "-domain", "sluice.test"}, nil, &out, &errb); code != exitOK {
		t.Fatalf("certs: exit %d: %s", code, errb.String())
	}
	cfg := tlsConfig(t, dir)
	f := func(name string) string { return filepath.Join(dir, name) }
	serverTLS, err := tlsconfig.Server(f("regional-local.crt"), f("regional-local.key"), f("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	rs := redistest.Start(t)
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: rs.Addr(),
		Config: regional.StaticConfig{C: cfg}, ColdStart: regional.ColdStartFull, Unleased: true, ServerTLS: serverTLS,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d.GRPCAddr(), dir
}

// tlsConfig is a one-region config with the auth section certs wrote to dir.
func tlsConfig(t *testing.T, dir string) *config.Config {
	t.Helper()
	auth, err := os.ReadFile(filepath.Join(dir, "auth.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(`
regions: {local: {weight: 1}}
classes: {read: {}, export: {mode: strict}}
tiers: {free: {read: {rate: 100/s, burst: 100}, export: {rate: 100/s, burst: 100}}}
default_tier: free
` + string(auth)))
	if err != nil {
		t.Fatalf("the written auth section: %v", err)
	}
	return cfg
}

// tlsFlags are the global flags presenting who's certificate from dir.
func tlsFlags(dir, who string) []string {
	return []string{"-tls-ca", filepath.Join(dir, "ca.crt"),
		"-tls-cert", filepath.Join(dir, who+".crt"), "-tls-key", filepath.Join(dir, who+".key")}
}

// TestRegionalAnswersMapToTheirExitCodes: a regional service that answers
// is never reported unreachable. A certificate without the role the call
// needs is refused (exitRefused, naming the refusal and the certificate
// flags), and an unknown class is not found (exitNotFound).
func TestRegionalAnswersMapToTheirExitCodes(t *testing.T) {
	addr, dir := tlsRegion(t)
	for _, tc := range []struct {
		name  string
		args  []string
		code  int
		say   []string
		never string
	}{
		{"lease as instance", append(tlsFlags(dir, "instance"), "lease", "-addr", addr, "-tenant", "acme", "-class", "read"),
			exitOK, []string{}, ""},
		{"check as instance", append(tlsFlags(dir, "instance"), "check", "-addr", addr, "-tenant", "acme", "-class", "export"),
			exitOK, []string{}, ""},
		{"lease as operator", append(tlsFlags(dir, "operator"), "lease", "-addr", addr, "-tenant", "acme", "-class", "read"),
			exitRefused, []string{"refused this client", "PermissionDenied", `needs role "instance"`, "-tls-cert"}, "is the regional service running"},
		{"check as envoy", append(tlsFlags(dir, "envoy"), "check", "-addr", addr, "-tenant", "acme", "-class", "export"),
			exitRefused, []string{"refused this client", "PermissionDenied", `needs role "instance"`}, "is the regional service running"},
		{"lease of an unknown class", append(tlsFlags(dir, "instance"), "lease", "-addr", addr, "-tenant", "acme", "-class", "nope"),
			exitNotFound, []string{`class "nope" is not configured`}, "is the regional service running"},
		{"check of an unknown class", append(tlsFlags(dir, "instance"), "check", "-addr", addr, "-tenant", "acme", "-class", "nope"),
			exitNotFound, []string{`class "nope" is not configured`}, "is the regional service running"},
		{"check of an invalid tenant", append(tlsFlags(dir, "instance"), "check", "-addr", addr, "-tenant", "a b", "-class", "export"),
			exitInvalid, []string{"check refused"}, "is the regional service running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := sluicectl(t, "", tc.args...)
			wantCode(t, r, tc.code)
			wantContains(t, "stderr", r.stderr, tc.say...)
			if tc.never != "" && strings.Contains(r.stderr, tc.never) {
				t.Fatalf("stderr says %q of a service that answered:\n%s", tc.never, r)
			}
		})
	}
}

// TestStatusRefusedByTheGlobalAllocatorIsNotUnreachable: a global
// allocator that refuses a certificate without the operator role answered;
// status says so and exits exitRefused, while the operator certificate
// gets the status.
func TestStatusRefusedByTheGlobalAllocatorIsNotUnreachable(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"certs", "-dir", dir, "-regions", "local", "-domain", "sluice.test"}, nil, &out, &errb); code != exitOK {
		t.Fatalf("certs: exit %d: %s", code, errb.String())
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	serverTLS, err := tlsconfig.Server(f("global.crt"), f("global.key"), f("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	srv := etcdtest.Start(t)
	d, err := allocator.StartDaemon(context.Background(), allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", Etcd: srv.Client(t),
		Config: allocator.StaticConfig{C: tlsConfig(t, dir)}, ServerTLS: serverTLS,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)

	r := sluicectl(t, "", append(tlsFlags(dir, "instance"), "-global-addr", d.GRPCAddr(), "status")...)
	wantCode(t, r, exitRefused)
	wantContains(t, "stderr", r.stderr, "answered but refused this client", "PermissionDenied", "operator role")
	wantContains(t, "stdout", r.stdout, "refused this client's credentials (see below)")
	if strings.Contains(r.stdout, "unreachable") {
		t.Errorf("a global allocator that answered is reported unreachable:\n%s", r.stdout)
	}

	r = sluicectl(t, "", append(tlsFlags(dir, "operator"), "-global-addr", d.GRPCAddr(), "status")...)
	if r.code == exitRefused {
		t.Fatalf("the operator certificate was refused:\n%s", r)
	}
}

// TestAnAddressThatIsNotHostPortIsAUsageError: lease and check refuse an
// -addr that is not host:port as status refuses such a -global-addr: a
// usage error naming the flag and the address, not a service that could
// not be reached. A port left empty ("host:") is not host:port either.
// region drain, which asks -global-addr after it wrote, refuses such an
// address before writing.
func TestAnAddressThatIsNotHostPortIsAUsageError(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		say  []string
	}{
		{"lease -addr bogus", []string{"lease", "-addr", "bogus", "-tenant", "acme"}, []string{`-addr "bogus"`, "is not host:port"}},
		{"check -addr bogus", []string{"check", "-addr", "bogus", "-tenant", "acme", "-class", "export"}, []string{`-addr "bogus"`, "is not host:port"}},
		{"check -addr without a port", []string{"check", "-addr", "127.0.0.1:", "-tenant", "acme"}, []string{`-addr "127.0.0.1:"`, "is not host:port"}},
		{"lease -addr empty", []string{"lease", "-addr", "", "-tenant", "acme"}, []string{`-addr ""`, "is not host:port"}},
		{"status -global-addr without a port", []string{"-global-addr", "127.0.0.1:", "status"}, []string{"-global-addr", `"127.0.0.1:" is not host:port`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := sluicectl(t, "", tc.args...)
			wantCode(t, r, exitUsage)
			wantContains(t, "stderr", r.stderr, tc.say...)
			if r.stdout != "" || strings.Contains(r.stderr, "running there") {
				t.Fatalf("an address that is not host:port was dialed:\n%s", r)
			}
		})
	}

	t.Run("region drain -global-addr bogus", func(t *testing.T) {
		c := newCluster(t)
		wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
		before := c.revision(t)
		r := sluicectl(t, "", c.args("-global-addr", "bogus", "region", "drain", "eu-west", "-yes")...)
		wantCode(t, r, exitUsage)
		wantContains(t, "stderr", r.stderr, "-global-addr", `"bogus" is not host:port`)
		c.wantUnwritten(t, before, "a drain given a -global-addr that is not host:port")
	})
}

// TestOutOfRangeNumbersAreUsageErrorsBeforeAnyCall: a -want the
// LeaseService would refuse or that asks for nothing (0), a -cost it would
// refuse, and a -timeout that is not positive are usage errors naming the
// flag and its range, found before the regional service is dialed: the
// service at -addr cancels the run (an interrupt, exit 130) if it is.
func TestOutOfRangeNumbersAreUsageErrorsBeforeAnyCall(t *testing.T) {
	wantRange := fmt.Sprintf("1..%d", quota.MaxWant)
	costRange := fmt.Sprintf("1..%d", quota.MaxCost)
	for _, tc := range []struct {
		name string
		args []string
		say  []string
	}{
		{"lease -want 0", []string{"lease", "-want", "0"}, []string{"-want 0", wantRange}},
		{"lease -want -3", []string{"lease", "-want", "-3"}, []string{"-want -3", wantRange}},
		{"lease -want above quota.MaxWant", []string{"lease", "-want", fmt.Sprint(quota.MaxWant + 1)},
			[]string{fmt.Sprintf("-want %d", quota.MaxWant+1), wantRange}},
		{"check -cost 0", []string{"check", "-cost", "0"}, []string{"-cost 0", costRange}},
		{"check -cost -1", []string{"check", "-cost", "-1"}, []string{"-cost -1", costRange}},
		{"check -cost above quota.MaxCost", []string{"check", "-cost", fmt.Sprint(quota.MaxCost + 1)},
			[]string{fmt.Sprintf("-cost %d", quota.MaxCost+1), costRange}},
		{"lease -timeout 0", []string{"lease", "-timeout", "0s"}, []string{"-timeout must be positive"}},
		{"check -timeout -1s", []string{"check", "-timeout", "-1s"}, []string{"-timeout must be positive"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var dialed atomic.Bool
			addr := grpctest.SilentAddr(t, func() { dialed.Store(true); cancel() })
			// -timeout far beyond the test: a dial ends only by the cancel.
			args := append([]string{"-timeout", "24h"}, tc.args...)
			args = append(args, "-addr", addr, "-tenant", "acme")
			r := runAppContext(t, ctx, &app{}, args...)
			wantCode(t, r, exitUsage)
			wantContains(t, "stderr", r.stderr, tc.say...)
			if r.stdout != "" || dialed.Load() {
				t.Fatalf("the regional service was dialed (dialed %v):\n%s", dialed.Load(), r)
			}
		})
	}
}

// TestMalformedEtcdEndpointIsAUsageError: an -etcd-endpoints value the
// etcd client cannot dial is refused at once with exit 2, naming it,
// not waited on until -timeout and reported as etcd unreachable (exit 5).
func TestMalformedEtcdEndpointIsAUsageError(t *testing.T) {
	for _, ep := range []string{"http://[::1", "nohostport", "ftp://etcd:2379"} {
		r := runAppContext(t, t.Context(), &app{}, "-timeout", "24h", "-etcd-endpoints", ep, "get")
		wantCode(t, r, exitUsage)
		wantContains(t, "stderr", r.stderr, fmt.Sprintf("%q", ep))
	}
}
