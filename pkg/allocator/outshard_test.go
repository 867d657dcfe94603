package allocator_test

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/pkg/allocator"
)

// lineLog keeps a daemon's log lines for the test to wait on.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// find is the first line containing s, or "".
func (l *lineLog) find(s string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}

// lastTime is the time= field of the last line containing s (zero when
// none has one).
func (l *lineLog) lastTime(s string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.lines) - 1; i >= 0; i-- {
		if !strings.Contains(l.lines[i], s) {
			continue
		}
		v, _, _ := strings.Cut(strings.TrimPrefix(l.lines[i], "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return time.Time{}
		}
		return at
	}
	return time.Time{}
}

// TestShardOutOfTheConfigIsNotLearning: the leader of shard 2 after
// global_shards went from 3 to 2 owns no keys and hears no reports, so no
// region ever confirms the new count to it; its learning gauge reads 0
// (it learns nothing), not 1 for as long as its replicas run. When the
// count goes back to 3, its log names the time it was out of the config
// as idle_for, not 0.
func TestShardOutOfTheConfigIsNotLearning(t *testing.T) {
	srv := etcdtest.Start(t)
	src := configtest.NewSource(mustConfig(t, twoRegions+"global_shards: 3\n"), 5)
	logs := &lineLog{}
	reg := prometheus.NewRegistry()
	d, err := allocator.StartDaemon(context.Background(), allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Etcd: srv.Link(t).Client(t), Prefix: "/test",
		SessionTTL: testTTL, Config: src, DrainTimeout: 2 * time.Second, Shard: 2, Registry: reg,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	t.Cleanup(d.Stop)
	waitFor(t, 10*time.Second, "shard 2 leads", d.IsLeader)
	learning := func() float64 { return metrictest.Gauge(t, reg, "sluice_global_learning") }
	waitFor(t, 4*(testValidity+testEpoch), "shard 2 ends its election's learning", func() bool { return learning() == 0 })

	src.Set(mustConfig(t, twoRegions+"global_shards: 2\n"), 6)
	waitFor(t, 10*testEpoch, "shard 2 applies global_shards 2", func() bool { return logs.find("global_shards changed") != "" })
	out := time.Now()
	// Learning for a reshard lasts at least one validity and one epoch:
	// polled over three of those, the gauge reads 0 throughout.
	for time.Since(out) < 3*(testValidity+testEpoch) {
		if g := learning(); g != 0 {
			t.Fatalf("shard 2, out of a config of 2 shards for %v, reads sluice_global_learning %v", time.Since(out), g)
		}
		time.Sleep(testEpoch) // sampling the gauge over a span the reshard would learn through
	}
	if !d.IsLeader() {
		t.Fatal("shard 2 lost its leadership")
	}

	src.Set(mustConfig(t, twoRegions+"global_shards: 3\n"), 7)
	idleOut := time.Since(out)
	// A starved machine can let the election's session lapse while the
	// shard is out: a new term starts its idle time afresh (an earlier
	// leader may have granted), so the bound is the time since the last
	// term began if that is later, less an epoch (the term notes the shard
	// out when it applies the config, and the log's times are whole
	// milliseconds).
	if began := logs.lastTime("leading the global tier"); began.After(out) {
		t.Logf("shard 2 was elected again %v after it went out of the config", began.Sub(out))
		idleOut = time.Since(began) - testEpoch
	}
	var line string
	waitFor(t, 10*testEpoch, "shard 2 owns keys again", func() bool { line = logs.find("this shard owns keys from now on"); return line != "" })
	m := regexp.MustCompile(`idle_for=(\S+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no idle_for in %q", line)
	}
	idle, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatal(err)
	}
	if idle < idleOut {
		t.Fatalf("idle_for=%v, want at least the %v shard 2 was out of the config: %s", idle, idleOut, line)
	}
}
