package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
)

const bootstrapYAML = `
epoch: 100ms
regions:
  us-east: {weight: 1}
classes:
  write: {}
tiers:
  free: {write: {rate: 10/s, burst: 10}}
default_tier: free
`

// start runs the command on a port of its own choosing until the test
// ends. It returns a client of its gRPC address, once the daemon serves,
// and stop, which cancels the run (like a signal) and returns its result;
// stop may be called more than once. A run that ends before it serves
// fails the test with its error.
func start(t *testing.T, endpoints []string, configFile string) (sluicev1.AllocatorServiceClient, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	served := make(chan string, 1)
	go func() {
		done <- runNotifying(ctx, []string{"-listen", "127.0.0.1:0", "-metrics-listen", "off", "-session-ttl", "1s",
			"-etcd-prefix", "/cmdtest", "-config", configFile, "-log-level", "warn",
			"-etcd-endpoints", strings.Join(endpoints, ",")}, func(addr string) { served <- addr })
	}()
	stop := sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() { stop() })
	var addr string
	select {
	case addr = <-served:
	case err := <-done:
		done <- err // for stop
		t.Fatalf("the command ended before it served: %v", err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return sluicev1.NewAllocatorServiceClient(conn), stop
}

// TestRunBootstrapsAndLeads runs the command against a real etcd: the
// bootstrap file lands in etcd when it holds no config, the replica leads
// on it, a second bootstrap does not overwrite it, and a signal-like
// cancel drains and returns cleanly.
func TestRunBootstrapsAndLeads(t *testing.T) {
	srv := etcdtest.Start(t)
	dir := t.TempDir()
	first := filepath.Join(dir, "first.yaml")
	if err := os.WriteFile(first, []byte(bootstrapYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	api, stop := start(t, srv.Endpoints(), first)
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, c := context.WithTimeout(context.Background(), time.Second)
		st, err := api.Status(ctx, &sluicev1.StatusRequest{})
		c()
		if err == nil && st.Leader && st.ConfigRevision > 0 && len(st.Regions) == 1 && st.Regions[0].Region == "us-east" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never led on the bootstrap config: %v %v", st, err)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	store := configstore.NewStore(srv.Client(t), "/cmdtest")
	ctx, c := context.WithTimeout(context.Background(), 5*time.Second)
	defer c()
	stored, rev, err := store.Get(ctx)
	if err != nil || stored == nil || len(stored.Regions) != 1 {
		t.Fatalf("etcd config after bootstrap: %v rev %d %v", stored, rev, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("run after cancel: %v", err)
	}

	second := filepath.Join(dir, "second.yaml")
	if err := os.WriteFile(second, []byte(strings.Replace(bootstrapYAML, "us-east", "eu-west", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	api, _ = start(t, srv.Endpoints(), second)
	deadline = time.Now().Add(15 * time.Second)
	for {
		ctx, c := context.WithTimeout(context.Background(), time.Second)
		st, err := api.Status(ctx, &sluicev1.StatusRequest{})
		c()
		if err == nil && st.Leader && st.ConfigRevision == rev {
			if len(st.Regions) != 1 || st.Regions[0].Region != "us-east" {
				t.Fatalf("the second bootstrap overrode etcd: %v", st.Regions)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("second run never led on etcd's config (revision %d): %v %v", rev, st, err)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "-etcd-endpoints is required"},
		{[]string{"-etcd-endpoints", "127.0.0.1:1", "-tls-cert", "x.pem"}, "a certificate file and a key file are both required"},
		{[]string{"-etcd-endpoints", "127.0.0.1:1", "-log-level", "loud"}, "log level loud"},
		{[]string{"-etcd-endpoints", "127.0.0.1:1", "-config", missing}, missing},
		{[]string{"-etcd-endpoints", "127.0.0.1:1", "-shard", "256"}, `-shard "256": want a shard in 0..255 or "ordinal"`},
		{[]string{"-etcd-endpoints", "127.0.0.1:1", "-shard", "-1"}, `-shard "-1"`},
		{[]string{"-etcd-endpoints", "127.0.0.1:1", "-session-ttl", "1.5s"}, "-session-ttl 1.5s must be whole seconds, at least 1s"},
		{[]string{"-etcd-endpoints", "127.0.0.1:1", "-session-ttl", "0s"}, "-session-ttl 0s must be whole seconds"},
		{[]string{"-etcd-endpoints", "127.0.0.1:1", "-max-inflight-per-connection", "-1"}, "-max-inflight-per-connection -1 must be at least 1"},
		{[]string{"-etcd-endpoints", "127.0.0.1:1", "-max-inflight-per-identity", "0"}, "-max-inflight-per-identity 0 must be at least 1"},
		{[]string{"-etcd-endpoints", "127.0.0.1:1", "-max-report-bytes", "-1"}, "-max-report-bytes -1 must not be negative"},
		// The flag package stops at the first argument that is no flag:
		// the flags after it would be dropped without a word.
		{[]string{"-etcd-endpoints", "127.0.0.1:1", "stray", "-listen", "127.0.0.1:0"}, `unexpected arguments ["stray" "-listen" "127.0.0.1:0"]`},
	} {
		// Each is refused before etcd is asked; the deadline only ends a
		// run that was not.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := run(ctx, c.args)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run %v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// TestRunRefusesAnAdvertiseThatIsNotHostPort: an -advertise with no port
// was taken as is; the replica led under it, etcd named it as the leader,
// and every region sent there by a standby (and sluicectl status) failed
// to dial it until the region's grants lapsed. It is refused before etcd is
// asked, naming the flag.
func TestRunRefusesAnAdvertiseThatIsNotHostPort(t *testing.T) {
	for _, c := range []struct{ addr, want string }{
		{"sluice-global", `-advertise "sluice-global": want the host:port regions and other replicas dial this replica at: missing port in address`},
		{"10.0.0.7:", `-advertise "10.0.0.7:": want the host:port regions and other replicas dial this replica at: missing port`},
		{"a:b:7500", "too many colons in address"},
	} {
		// Refused before etcd is asked; the deadline only ends a run that
		// was not (it waits for etcd, then stops cleanly).
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := run(ctx, []string{"-etcd-endpoints", "127.0.0.1:1", "-advertise", c.addr})
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("-advertise %q: %v, want an error containing %q", c.addr, err, c.want)
		}
	}
	for _, addr := range []string{"", "10.0.0.7:7500", "sluice-global-0.sluice-global:7500", "[fd00::7]:7500"} {
		if err := checkAdvertise(addr); err != nil {
			t.Errorf("-advertise %q refused: %v", addr, err)
		}
	}
}

func TestShardFromOrdinal(t *testing.T) {
	host := func(name string) func() (string, error) { return func() (string, error) { return name, nil } }
	if n, err := parseShard("ordinal", host("sluice-global-3")); n != 3 || err != nil {
		t.Fatalf("sluice-global-3: %d, %v", n, err)
	}
	if n, err := parseShard("2", host("x")); n != 2 || err != nil {
		t.Fatalf("2: %d, %v", n, err)
	}
	for _, name := range []string{"sluice-global", "global-x", "global-300"} {
		if _, err := parseShard("ordinal", host(name)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want an error naming it", name, err)
		}
	}
}

// TestRunStartsOnTheLastGoodConfigWhenEtcdHoldsABadTenantKey: a tenant key
// written into etcd by hand (not through sluicectl) that does not parse
// does not stop a replica that starts: it leads on the last good config
// revision, the one running replicas kept, instead of exiting.
func TestRunStartsOnTheLastGoodConfigWhenEtcdHoldsABadTenantKey(t *testing.T) {
	srv := etcdtest.Start(t)
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(bootstrapYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	store := configstore.NewStore(srv.Client(t), "/cmdtest")
	ctx, c := context.WithTimeout(context.Background(), 5*time.Second)
	defer c()
	cfg, err := config.Parse([]byte(bootstrapYAML))
	if err != nil {
		t.Fatal(err)
	}
	rev, err := store.Apply(ctx, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client(t).Put(ctx, store.TenantKey("t7"), "not json"); err != nil {
		t.Fatal(err)
	}
	api, stop := start(t, srv.Endpoints(), file)
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, c := context.WithTimeout(context.Background(), time.Second)
		st, err := api.Status(ctx, &sluicev1.StatusRequest{})
		c()
		if err == nil && st.Leader && st.ConfigRevision == rev {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never led on the last good config (revision %d): %v %v", rev, st, err)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	if err := stop(); err != nil {
		t.Fatalf("run after cancel: %v", err)
	}
}

// TestStopWhileAwaitingEtcdIsClean: a stop requested while the start waits
// for an unreachable etcd (here before its first answer) is a clean stop,
// not an error (it returned context.Canceled: exit 1).
func TestStopWhileAwaitingEtcdIsClean(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the signal, already there
	// Port 1 on loopback: nothing listens there.
	err := run(ctx, []string{"-listen", "127.0.0.1:0", "-metrics-listen", "off", "-log-level", "error",
		"-etcd-endpoints", "127.0.0.1:1", "-etcd-prefix", "/stoptest"})
	if err != nil {
		t.Fatalf("run stopped while awaiting etcd: %v; want nil", err)
	}
}
