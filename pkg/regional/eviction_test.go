package regional_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// quickEpochs is oneRegion with a short epoch: the eviction watch reads
// Redis once an epoch.
const quickEpochs = "epoch: 100ms\n" + oneRegion

// startOn starts a daemon on addr with the quick-epoch config, logging
// into buf.
func startOn(t *testing.T, addr string, allow bool, buf *logtest.Buffer) (*regional.Daemon, error) {
	t.Helper()
	return regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: addr,
		Config: regional.StaticConfig{C: regiontest.MustConfig(t, quickEpochs)}, ColdStart: regional.ColdStartFull,
		Unleased: true, AllowEviction: allow,
		Logger: slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
}

// TestDaemonRefusesEvictingRedis: a Redis with maxmemory and an evicting
// policy drops token buckets under memory pressure and the scripts trust a
// missing bucket to be full (over b + r·t by hundreds of tokens a key), so
// the daemon refuses to start on it, naming the policy and the fix, and
// writes nothing; noeviction, or no maxmemory at all, starts.
func TestDaemonRefusesEvictingRedis(t *testing.T) {
	// Mostly waits for Redis servers of its own to start: it runs beside
	// the package's other parallel tests, and so do its cases.
	t.Parallel()
	for _, policy := range []string{"volatile-lru", "volatile-ttl", "allkeys-lru"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			rs := redistest.StartWith(t, "--maxmemory", "64mb", "--maxmemory-policy", policy)
			var buf logtest.Buffer
			d, err := startOn(t, rs.Addr(), false, &buf)
			if err == nil {
				d.Stop()
				t.Fatalf("started on a Redis with maxmemory-policy %s", policy)
			}
			var ee *regional.EvictionError
			if !errors.As(err, &ee) {
				t.Fatalf("error %v (%T), want an *EvictionError", err, err)
			}
			for _, want := range []string{"maxmemory-policy " + policy, "maxmemory 67108864 bytes", rs.Addr(), "noeviction", "invariant 1"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if n := redistest.KeyCount(t, rs.Addr()); n != 0 {
				t.Errorf("a refused start left %d keys in Redis", n)
			}
		})
	}
	for name, args := range map[string][]string{
		"noeviction":   {"--maxmemory", "64mb", "--maxmemory-policy", "noeviction"},
		"no maxmemory": {"--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rs := redistest.StartWith(t, args...)
			var buf logtest.Buffer
			d, err := startOn(t, rs.Addr(), false, &buf)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Stop()
			if v := metrictest.Gauge(t, d.Registry, "sluice_regional_redis_evicting"); v != 0 {
				t.Errorf("sluice_regional_redis_evicting = %v on a Redis that does not evict", v)
			}
		})
	}
}

// TestDaemonRefusesEvictingClusterNode: on a Redis Cluster every master is
// read; one evicting node is enough to refuse, and it is named.
func TestDaemonRefusesEvictingClusterNode(t *testing.T) {
	// A Redis cluster of its own, mostly waited for (redis-cli forms it
	// by polling): it runs beside the package's other parallel tests.
	t.Parallel()
	addrs := redistest.StartCluster(t, 3)
	c := redis.NewClient(&redis.Options{Addr: addrs[1]})
	defer c.Close()
	ctx := context.Background()
	if err := c.ConfigSet(ctx, "maxmemory", "64mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err(); err != nil {
		t.Fatal(err)
	}
	var buf logtest.Buffer
	d, err := startOn(t, strings.Join(addrs, ","), false, &buf)
	if err == nil {
		d.Stop()
		t.Fatal("started on a cluster with an evicting node")
	}
	var ee *regional.EvictionError
	if !errors.As(err, &ee) || len(ee.Nodes) != 1 || ee.Nodes[0].Node != addrs[1] {
		t.Fatalf("error %v, want an *EvictionError naming %s only", err, addrs[1])
	}
}

// TestAllowEvictionStartsAndSays: with the opt-out the daemon starts on an
// evicting Redis, logs it as an error once and exports it.
func TestAllowEvictionStartsAndSays(t *testing.T) {
	rs := redistest.StartWith(t, "--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru")
	var buf logtest.Buffer
	d, err := startOn(t, rs.Addr(), true, &buf)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	if v := metrictest.Gauge(t, d.Registry, "sluice_regional_redis_evicting"); v != 1 {
		t.Errorf("sluice_regional_redis_evicting = %v, want 1", v)
	}
	const line = "redis evicts keys under memory pressure"
	if n := buf.Count(line); n != 1 || !strings.Contains(buf.String(), "level=ERROR") {
		t.Errorf("logged %q %d times (want once, at ERROR):\n%s", line, n, buf.String())
	}
}

// TestDaemonNoticesEvictionAtRunTime: a policy changed with CONFIG SET
// while the daemon runs is logged once per change and exported, and keys
// evicted are counted and logged once per run of evictions.
func TestDaemonNoticesEvictionAtRunTime(t *testing.T) {
	// Not beside other tests: its one run of evictions lasts as long as
	// the test takes to lift maxmemory (the restart guard stamps the
	// evicted sentinel again, which evicts more), and starved beside four
	// parallel tests and two busy loops it took over a second, so the
	// watch saw a second run and rightly logged it again.
	rs := redistest.Start(t)
	var buf logtest.Buffer
	d, err := startOn(t, rs.Addr(), false, &buf)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	epoch := time.Duration(regiontest.MustConfig(t, quickEpochs).Epoch)
	ctx := context.Background()
	c := rs.Client()
	set := func(kv ...string) {
		t.Helper()
		for i := 0; i < len(kv); i += 2 {
			if err := c.ConfigSet(ctx, kv[i], kv[i+1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// waitFor polls cond for up to 50 epochs of the watch.
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(50 * epoch)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s not seen within 50 epochs; log:\n%s", what, buf.String())
			}
			time.Sleep(epoch / 4) // polling the once-an-epoch watch with a deadline
		}
	}
	evicting := func() float64 { return metrictest.Gauge(t, d.Registry, "sluice_regional_redis_evicting") }
	const changed = "redis evicts keys under memory pressure"

	set("maxmemory", "64mb", "maxmemory-policy", "volatile-ttl")
	waitFor("the evicting gauge at 1", func() bool { return evicting() == 1 })
	// A few more readings of the same settings log nothing more.
	read := regional.EvictionReadingsForTest(d)
	waitFor("three more readings", func() bool { return regional.EvictionReadingsForTest(d) >= read+3 })
	set("maxmemory-policy", "noeviction")
	waitFor("the evicting gauge at 0", func() bool { return evicting() == 0 })
	if n := buf.Count(changed); n != 1 {
		t.Errorf("one change to an evicting policy logged %d times:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "redis no longer evicts keys") {
		t.Errorf("the change back to noeviction was not logged:\n%s", buf.String())
	}

	// Keys evicted: fill Redis past a small maxmemory with keys that are
	// not Sluice's.
	used, err := c.InfoMap(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	var mem int64
	fmt.Sscan(used["Memory"]["used_memory"], &mem)
	set("maxmemory", fmt.Sprint(mem+4<<20), "maxmemory-policy", "allkeys-random")
	value := strings.Repeat("x", 64<<10)
	for i := range 256 { // 16 MiB into 4
		if err := c.Set(ctx, fmt.Sprintf("filler:%d", i), value, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	evicted := func() float64 {
		return metrictest.Series(t, d.Registry, "sluice_regional_redis_evicted_keys_total", nil)
	}
	waitFor("evicted keys counted", func() bool { return evicted() > 0 })
	set("maxmemory", "0")
	waitFor("the evicting gauge at 0 again", func() bool { return evicting() == 0 })
	if n := buf.Count("redis is evicting keys"); n != 1 {
		t.Errorf("one run of evictions logged %d times:\n%s", n, buf.String())
	}
	if n := buf.Count(changed); n != 2 {
		t.Errorf("two changes to an evicting policy logged %d times:\n%s", n, buf.String())
	}
}

// TestSentinelOutageLoggedOnce: a Redis that stops answering fails the
// restart sentinel check every epoch; each failure is counted (script
// "sentinel") but logged at WARN once per outage, and its end once at
// INFO. It was one WARN line an epoch for as long as the outage lasted.
func TestSentinelOutageLoggedOnce(t *testing.T) {
	// Mostly waits out epochs against a stopped Redis of its own: it runs
	// beside the package's other parallel tests.
	t.Parallel()
	rs := redistest.Start(t)
	var buf logtest.Buffer
	d, err := startOn(t, rs.Addr(), false, &buf)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	failures := func() float64 {
		return metrictest.Series(t, d.Registry, "sluice_regional_redis_errors_total", map[string]string{"script": "sentinel"})
	}
	rs.Stop()
	// Several epochs of failed checks: each is counted. Generous for a
	// loaded machine: a stalled process misses epochs.
	epoch := time.Duration(regiontest.MustConfig(t, quickEpochs).Epoch)
	within := 300 * epoch
	deadline := time.Now().Add(within)
	for failures() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%v sentinel failures counted within %v (epoch %v)", failures(), within, epoch)
		}
		time.Sleep(epoch / 5) // polling the daemon's metrics with a deadline
	}
	if n := buf.Count("restart sentinel check failed"); n != 1 {
		t.Errorf("%v failed checks logged %d times, want once:\n%s", failures(), n, buf.String())
	}
	rs.Restart()
	for buf.Count("restart sentinel check answering again") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no line saying the sentinel check answers again:\n%s", buf.String())
		}
		time.Sleep(epoch / 5) // polling the daemon's log with a deadline
	}
	if n := buf.Count("restart sentinel check failed"); n != 1 {
		t.Errorf("an outage logged %d failed checks, want one line", n)
	}
}
