package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/pkg/config"
)

// TestStatusAgainstRealDaemons runs status against a whole in-process
// deployment: the global leader and the region leader come from etcd, the
// allocation from the real global daemon.
func TestStatusAgainstRealDaemons(t *testing.T) {
	c, err := devcluster.Start(context.Background(), devcluster.Options{
		Config: config.Default(), Regions: []string{"us-east"}, SessionTTL: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	endpoint := c.EtcdAddr()
	deadline := time.Now().Add(15 * time.Second)
	var out string
	for {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"-etcd-endpoints", endpoint, "-global-addr", c.GlobalAddrs()[0], "status"},
			strings.NewReader(""), &stdout, &stderr)
		out = stdout.String()
		// Ready once the region leader has reported to the global leader
		// and etcd shows it elected (its election key can lag its first
		// report, or be lost and won again on a starved machine).
		if code == exitOK && strings.Contains(out, "(leader)") && regexpLine(out, "us-east", "ago") &&
			strings.Contains(out, c.RegionalAddrs("us-east")[0]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed a leading allocator with a us-east report (exit %d):\n%s\n%s", code, out, stderr.String())
		}
		time.Sleep(50 * time.Millisecond) // polling the deployment with a deadline
	}
	for _, want := range []string{"global leader:  " + c.GlobalAddrs()[0], c.RegionalAddrs("us-east")[0]} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	// The default config's other regions run nowhere: never heard from.
	if !strings.Contains(out, "SILENT (never heard") && !strings.Contains(out, "DEGRADED (silent)") {
		t.Errorf("status shows no silent region:\n%s", out)
	}

	// -global-addr as cmd/regional takes it, comma separated: the
	// addresses are asked in turn until one answers.
	dead := grpctest.RefusedAddr(t)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-etcd-endpoints", endpoint, "-global-addr", dead + ", " + c.GlobalAddrs()[0], "status"},
		strings.NewReader(""), &stdout, &stderr)
	if code != exitOK || !regexpLine(stdout.String(), "global allocator:", c.GlobalAddrs()[0]) {
		t.Errorf("status with -global-addr %s,%s: exit %d, want %d and the allocation from the second:\n%s\n%s",
			dead, c.GlobalAddrs()[0], code, exitOK, stdout.String(), stderr.String())
	}
	// An address that is not host:port is bad usage naming it, before
	// anything is asked.
	stdout.Reset()
	stderr.Reset()
	code = run(context.Background(), []string{"-etcd-endpoints", endpoint, "-global-addr", c.GlobalAddrs()[0] + ";" + dead, "status"},
		strings.NewReader(""), &stdout, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "is not host:port") || stdout.Len() > 0 {
		t.Errorf("status with -global-addr %q: exit %d, stdout %q, stderr %q; want %d naming the address",
			c.GlobalAddrs()[0]+";"+dead, code, stdout.String(), stderr.String(), exitUsage)
	}
}

// regexpLine reports whether some line mentions both words.
func regexpLine(text, a, b string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, a) && strings.Contains(l, b) {
			return true
		}
	}
	return false
}

// startTwoShards starts a deployment of the default config over two
// global shards and one region, us-east, stopped when t ends.
func startTwoShards(t *testing.T) *devcluster.Cluster {
	t.Helper()
	cfg := config.Default()
	cfg.GlobalShards = 2
	c, err := devcluster.Start(context.Background(), devcluster.Options{
		Config: cfg, Regions: []string{"us-east"}, SessionTTL: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// TestStatusAcrossShards: with global_shards 2, status names both shards'
// leaders (shard 1's from its own election) and asks both.
func TestStatusAcrossShards(t *testing.T) {
	c := startTwoShards(t)
	shard1 := c.GlobalShardAddrs(1)[0]
	awaitStatus(t, c, "showed both shards answering", func(code int, out, _ string) bool {
		return code == exitOK && regexpLine(out, "shard 1:", shard1) && regexpLine(out, "shard 1:", "contended keys") &&
			strings.Contains(out, "global leader:  "+c.GlobalAddrs()[0])
	})
}

// TestStatusShowsAShardPastTheConfigApart: global_shards lowered from 2
// to 1 while shard 1's replica still runs. Status lists shard 1 as not in
// the config and does not fold its figures (an idle shard's learning and
// silent regions) into the global tier's: it said "learning: yes" and
// "degraded: <every region>" of a tier whose one shard was neither.
func TestStatusShowsAShardPastTheConfigApart(t *testing.T) {
	c := startTwoShards(t)
	lowered := config.Default()
	lowered.GlobalShards = 1
	data, err := lowered.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, sluicectl(t, "", "-etcd-endpoints", c.EtcdAddr(), "apply", "-f", writeFile(t, "one-shard.yaml", string(data)), "-yes"), exitOK)

	shard1 := c.GlobalShardAddrs(1)[0]
	// us-east reports to shard 0 only now: live there, silent to shard 1,
	// which must not make the tier call it degraded.
	awaitStatus(t, c, "set shard 1 apart as not in the config", func(code int, out, _ string) bool {
		return code == exitOK && regexpLine(out, "shard 1:", shard1) && regexpLine(out, "shard 1:", "NOT IN THE CONFIG, which has 1 shards") &&
			regexpLine(out, "us-east", "live") && !regexpLine(out, "degraded:", "us-east")
	})
	var js, stderr bytes.Buffer
	if code := run(context.Background(), []string{"-etcd-endpoints", c.EtcdAddr(), "status", "-o", "json"},
		strings.NewReader(""), &js, &stderr); code != exitOK || !strings.Contains(js.String(), `"unconfigured": true`) {
		t.Fatalf("status -o json (exit %d) does not mark shard 1 unconfigured:\n%s", code, js.String())
	}
}

// TestStatusReportsADeletedConfigKey: with the config key deleted past
// sluicectl the daemons keep the config they run, but etcd no longer holds
// it and a daemon that starts would run something else: status says so
// and exits exitNotFound, rather than showing every region as not in the
// config and exiting 0.
func TestStatusReportsADeletedConfigKey(t *testing.T) {
	c, err := devcluster.Start(context.Background(), devcluster.Options{
		Config: config.Default(), Regions: []string{"us-east"}, SessionTTL: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	args := []string{"-etcd-endpoints", c.EtcdAddr(), "-global-addr", c.GlobalAddrs()[0], "status"}
	status := func(extra ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append(args, extra...), strings.NewReader(""), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	var rev int64
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, out, errOut := status("-o", "json")
		var rep statusReport
		if code == exitOK && json.Unmarshal([]byte(out), &rep) == nil && rep.Global != nil && rep.Global.ConfigRevision > 0 {
			rev = rep.Global.ConfigRevision
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed the global tier on a config from etcd (exit %d):\n%s\n%s", code, out, errOut)
		}
		time.Sleep(50 * time.Millisecond) // polling the deployment with a deadline
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.EtcdAddr()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Delete(t.Context(), "/sluice/config"); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := status()
	if code != exitNotFound {
		t.Fatalf("status with the config key deleted: exit %d, want %d\n%s\n%s", code, exitNotFound, out, errOut)
	}
	wantContains(t, "stdout", out, "config:", "DELETED")
	wantContains(t, "stderr", errOut, "etcd holds no config at /sluice/config", "deleted", "sluicectl apply")
	if !strings.Contains(out, "config revision:") || !strings.Contains(errOut, "revision "+strconv.FormatInt(rev, 10)) {
		t.Fatalf("status does not name revision %d the daemons keep:\n%s\n%s", rev, out, errOut)
	}
}

// TestStatusWithShardZeroDownStillShowsTheOtherShards: global_shards 2
// and shard 0's only replica stopped. Status says it is shard 0 that has
// no leader and still lists shard 1's leader and figures: it printed
// "global leader: none (no global allocator holds the election)" and
// "global allocator: unknown", nothing of shard 1, so a tier whose other
// shards granted as usual read as wholly down.
func TestStatusWithShardZeroDownStillShowsTheOtherShards(t *testing.T) {
	c := startTwoShards(t)
	for _, g := range c.Global {
		if g.Shard() == 0 {
			g.Stop() // resigns: shard 0's election is empty at once
		}
	}
	shard1 := c.GlobalShardAddrs(1)[0]
	awaitStatus(t, c, "named shard 0 down (exit 5) and showed shard 1 answering", func(code int, out, stderr string) bool {
		return code == exitUnreachable && regexpLine(out, "global leader:", "shard 0") &&
			regexpLine(out, "shard 1:", shard1) && regexpLine(out, "shard 1:", "contended keys") &&
			strings.Contains(stderr, "shard 0")
	})
}

// awaitStatus runs `sluicectl status` against c until ok takes its exit
// code, output and error output, polling for 15 s; then it fails saying
// the status never did what says, with the last run's exit and output.
func awaitStatus(t *testing.T, c *devcluster.Cluster, what string, ok func(code int, out, stderr string) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"-etcd-endpoints", c.EtcdAddr(), "status"},
			strings.NewReader(""), &stdout, &stderr)
		if ok(code, stdout.String(), stderr.String()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never %s (exit %d):\n%s\n%s", what, code, stdout.String(), stderr.String())
		}
		time.Sleep(50 * time.Millisecond) // polling the deployment with a deadline
	}
}

// TestApplyRaisingShardsWarnsOfShardsWithoutALeader: raising
// global_shards to include a shard no replica leads puts every key that
// moves to it on its floor in every region until one leads (a region runs
// a moved key on its static share only under its new owner's static
// lease, which a shard that never led never conferred). apply said
// nothing of it; it warns now, naming the shard, and stops warning once
// the shard's replica leads. Lowering the count never warns.
func TestApplyRaisingShardsWarnsOfShardsWithoutALeader(t *testing.T) {
	c := startTwoShards(t)
	withShards := func(n int64) string {
		next := config.Default()
		next.GlobalShards = n
		data, err := next.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return writeFile(t, "shards.yaml", string(data))
	}
	const warning = "no replica leads shard 2"
	r := sluicectl(t, "", "-etcd-endpoints", c.EtcdAddr(), "apply", "-f", withShards(3), "-dry-run")
	wantCode(t, r, exitOK)
	wantContains(t, "apply stderr", r.stderr, warning, "start its replicas first")
	r = sluicectl(t, "", "-etcd-endpoints", c.EtcdAddr(), "apply", "-f", withShards(1), "-dry-run")
	wantCode(t, r, exitOK)
	if strings.Contains(r.stderr, "no replica leads") {
		t.Fatalf("lowering global_shards warned of a shard without a leader:\n%s", r)
	}

	if _, err := c.AddGlobalShard(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		r = sluicectl(t, "", "-etcd-endpoints", c.EtcdAddr(), "apply", "-f", withShards(3), "-dry-run")
		if r.code == exitOK && !strings.Contains(r.stderr, warning) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("apply still warns once shard 2's replica runs:\n%s", r)
		}
		time.Sleep(50 * time.Millisecond) // polling the election with a deadline
	}
}
