package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
)

// stopConfig serves Envoy: tenant acme is of tier pro, every other of
// free; class read decides by its local share while the region is out of
// reach.
const stopConfig = `
regions: {us-east: {weight: 1}}
classes: {read: {mode: lease, on_failure: local}}
tiers:
  free: {read: {rate: 1000/s, burst: 1000}}
  pro:  {read: {rate: 100000/s, burst: 100000}}
tenants: {acme: {tier: pro}}
default_tier: free
envoy: {descriptors: [{domain: sluice, tenant_key: tenant, class_key: class}]}
`

func rlsRequest(tenant string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "sluice", HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}, {Key: "class", Value: "read"}},
	}}}
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestStopFinishesInFlightEnvoyCalls: a stop under Envoy load answers
// every call the server took (health NOT_SERVING, in-flight calls finish,
// then the Envoy endpoint's lease client releases its leases). The lease
// client was closed before the server drained, so calls arriving
// meanwhile failed with `envoyrls: deciding descriptors[0]: lease:
// closed`.
func TestStopFinishesInFlightEnvoyCalls(t *testing.T) {
	rs := redistest.Start(t)
	cfgFile := writeConfig(t, stopConfig)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	served := make(chan string, 1)
	go func() {
		done <- runNotifying(ctx, []string{"-region", "us-east", "-listen", "127.0.0.1:0", "-metrics-listen", "off",
			"-redis-addr", rs.Addr(), "-config", cfgFile, "-cold-start", "full", "-log-level", "error"},
			os.Stdout, func(addr string) { served <- addr })
	}()
	var addr string
	select {
	case addr = <-served:
	case err := <-done:
		t.Fatalf("the service ended before it served: %v", err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)

	// Four callers call until the server is gone; the stop comes once
	// each has been answered a few times.
	const callers, warm = 4, 20
	var (
		mu       sync.Mutex
		answered int
		failed   []string
		wg       sync.WaitGroup
	)
	warmed := make(chan struct{})
	var warmOnce sync.Once
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := rls.ShouldRateLimit(cctx, rlsRequest("acme"))
				ccancel()
				mu.Lock()
				if err == nil {
					answered++
					if answered >= callers*warm {
						warmOnce.Do(func() { close(warmed) })
					}
					mu.Unlock()
					continue
				}
				// An answer of the server's Envoy endpoint is a failed
				// call; a connection refused or closed by the drain is the
				// client's cue to go elsewhere.
				if strings.Contains(status.Convert(err).Message(), "envoyrls") {
					failed = append(failed, err.Error())
					mu.Unlock()
					continue
				}
				mu.Unlock()
				return
			}
		}()
	}
	select {
	case <-warmed:
	case err := <-done:
		t.Fatalf("the service ended under load: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d calls failed during the stop (of %d answered), first: %s", len(failed), answered, failed[0])
	}
}

// regionalProcess runs the command as a process (the test binary running
// main) and returns its stderr lines as they come.
func regionalProcess(t *testing.T, args ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, stderr)
	}()
	return cmd, lines
}

// awaitLine reads lines until one contains want (at most 30 s); it fails
// the test with what it read when the process ends first.
func awaitLine(t *testing.T, lines <-chan string, want string) string {
	t.Helper()
	seen := awaitLines(t, lines, want)
	return seen[len(seen)-1]
}

// awaitLines is awaitLine returning every line read, the one containing
// want last.
func awaitLines(t *testing.T, lines <-chan string, want string) []string {
	t.Helper()
	var seen []string
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the process ended before logging %q:\n%s", want, strings.Join(seen, "\n"))
			}
			seen = append(seen, l)
			if strings.Contains(l, want) {
				return seen
			}
		case <-timeout:
			t.Fatalf("no %q logged within 30s:\n%s", want, strings.Join(seen, "\n"))
		}
	}
}

// deadAddr is a loopback address where nothing answers: every
// connection is closed as soon as it is accepted. The port stays held for
// the test's life, so no other test's server (an embedded etcd, a Redis,
// started in parallel on port 0) can be given it and answer in its place,
// as one did when the port was only picked and freed.
func deadAddr(t *testing.T) string { return grpctest.ClosingAddr(t).Addr }

// TestStopWhileAwaitingEtcdExitsZero: SIGTERM, SIGINT or SIGHUP while the
// start waits for an unreachable etcd is a requested stop, exit 0 (it
// printed `regional: context canceled` and exited 1; SIGHUP killed it).
func TestStopWhileAwaitingEtcdExitsZero(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		t.Run(sig.String(), func(t *testing.T) {
			// A process of its own, waiting out its first attempt at an
			// unreachable etcd (the start's bound on one attempt, 10 s):
			// the signals are tried side by side.
			t.Parallel()
			cmd, lines := regionalProcess(t, "-listen", "127.0.0.1:0", "-metrics-listen", "off",
				"-etcd-endpoints", deadAddr(t), "-etcd-prefix", "/stoptest")
			awaitLine(t, lines, "etcd not reachable; waiting")
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			var rest []string
			for l := range lines {
				rest = append(rest, l)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("after %v: %v; want exit 0\n%s", sig, err, strings.Join(rest, "\n"))
			}
		})
	}
}

// TestDegradedDecisionsCountUnderTheirTier: the Envoy endpoint's lease
// client counts the decisions it makes for keys its region never answered
// (here Redis is down) under the key's tier, as the Envoy endpoint's own
// counter does, not as tier "unknown".
func TestDegradedDecisionsCountUnderTheirTier(t *testing.T) {
	cfgFile := writeConfig(t, stopConfig)
	cmd, lines := regionalProcess(t, "-region", "us-east", "-listen", "127.0.0.1:0", "-metrics-listen", "127.0.0.1:0",
		"-redis-addr", deadAddr(t), "-config", cfgFile, "-log-level", "info")
	started := awaitLine(t, lines, `msg="regional service started"`)
	go func() {
		for range lines { // keep the pipe flowing
		}
	}()
	addrs := map[string]string{}
	for _, field := range strings.Fields(started) {
		if k, v, ok := strings.Cut(field, "="); ok {
			addrs[k] = v
		}
	}
	conn, err := grpc.NewClient(addrs["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tenant := range []string{"acme", "someone"} {
		// The start is logged just before the Envoy endpoint gets its
		// lease client: until then it answers that it is not ready.
		for {
			_, err := rls.ShouldRateLimit(ctx, rlsRequest(tenant))
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), "no limiter attached") || ctx.Err() != nil {
				t.Fatalf("ShouldRateLimit(%s): %v", tenant, err)
			}
		}
	}
	body := metrictest.Scrape(t, "http://"+addrs["http"]+"/metrics")
	tiers := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^sluice_client_decisions_total\{[^}]*\btier="([^"]*)"`).FindAllStringSubmatch(body, -1) {
		tiers[m[1]] = true
	}
	if !tiers["pro"] || !tiers["free"] || tiers["unknown"] {
		t.Fatalf("sluice_client_decisions_total tiers %v, want pro and free, never unknown:\n%s", tiers, grepLines(body, "sluice_client_decisions_total"))
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v; want exit 0", err)
	}
}

func grepLines(text, want string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, want) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestSampleWarningOnlyWhenServingTheSample: without -config, the WARN
// that the built-in sample and its tenants are served is logged when etcd
// holds no config, and not when it holds one (it was logged on every start).
func TestSampleWarningOnlyWhenServingTheSample(t *testing.T) {
	srv := etcdtest.Start(t)
	rs := redistest.Start(t)
	cfg, err := config.Parse([]byte(stopConfig))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := configstore.NewStore(srv.Client(t), "/held").Apply(context.Background(), cfg, 0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		prefix string
		warns  bool
	}{{"/held", false}, {"/empty", true}} {
		cmd, lines := regionalProcess(t, "-region", "us-east", "-listen", "127.0.0.1:0", "-metrics-listen", "off",
			"-redis-addr", rs.Addr(), "-etcd-endpoints", strings.Join(srv.Endpoints(), ","), "-etcd-prefix", c.prefix)
		seen := awaitLines(t, lines, `msg="regional service started"`)
		warned := false
		for _, l := range seen {
			if strings.Contains(l, "level=WARN") && strings.Contains(l, "sample") {
				warned = true
			}
		}
		if warned != c.warns {
			t.Errorf("etcd prefix %s: warned of the sample config %v, want %v:\n%s", c.prefix, warned, c.warns, strings.Join(seen, "\n"))
		}
		cmd.Process.Signal(syscall.SIGTERM)
		for range lines {
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("after SIGTERM: %v; want exit 0", err)
		}
	}
}
