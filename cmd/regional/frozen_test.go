package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// frozenConfig has two regions of equal weight; east alone sees demand,
// four times the key's rate, so the key is contended and the global tier
// grants east its share of it every epoch (west is silent and keeps its
// static share reserved).
const frozenConfig = `
epoch: 200ms
grant_validity: 1s
lease_ttl: 1s
refresh: 100ms
regions: {east: {weight: 1}, west: {weight: 1}}
classes: {read: {mode: lease, on_failure: closed}}
tiers: {free: {read: {rate: 100/s, burst: 100}}}
default_tier: free
`

// TestFrozenRegionLeaderResumesFenced: two processes of the regional
// service serve one region on one Redis and campaign for its leadership,
// under a real global allocator and etcd. While the global tier grants the
// region a contended key every epoch, the leader's process is frozen
// (SIGSTOP: a long GC pause, a frozen VM). The other replica takes over
// once the frozen one's session lapses and installs newer grants; then the
// frozen process resumes (SIGCONT) with whatever round it was in (an
// install of its old answer, when the freeze caught one in flight: not
// every run does, the round being short beside the epoch; pkg/luascripts
// and sim/live's stale-leader fault test the refusal itself). The grant
// Redis holds for the key never goes back to an older one (its fence,
// sampled throughout, only grows), and the resumed process says it lost
// the leadership and campaigns again behind the new leader.
func TestFrozenRegionLeaderResumesFenced(t *testing.T) {
	cfg := regiontest.MustConfig(t, frozenConfig)
	epoch, validity := time.Duration(cfg.Epoch), time.Duration(cfg.GrantValidity)
	etcd := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const prefix = "/frozen"
	if _, err := configstore.NewStore(etcd.Client(t), prefix).Apply(ctx, cfg, 0); err != nil {
		t.Fatal(err)
	}
	global, err := allocator.StartDaemon(ctx, allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", Etcd: etcd.Client(t), Prefix: prefix, SessionTTL: time.Second,
		Config: allocator.StaticConfig{C: cfg}, Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(global.Stop)
	rs := redistest.Start(t)

	type replica struct {
		stop  func(syscall.Signal)
		lines <-chan string
		addr  string
	}
	start := func() *replica {
		cmd, lines := regionalProcess(t, "-region", "east", "-listen", "127.0.0.1:0", "-metrics-listen", "off",
			"-redis-addr", rs.Addr(), "-etcd-endpoints", strings.Join(etcd.Endpoints(), ","), "-etcd-prefix", prefix,
			"-global-addr", global.GRPCAddr(), "-session-ttl", "1s", "-cold-start", "full", "-log-level", "info")
		l := awaitLine(t, lines, "regional service started")
		addr := fieldOf(l, "grpc=")
		return &replica{stop: func(s syscall.Signal) { cmd.Process.Signal(s) }, lines: lines, addr: addr}
	}
	a, b := start(), start()

	// The fence of the key's grant in Redis, polled until the end: it may
	// stay or grow, never fall.
	key := quota.Key{Tenant: "acme", Class: "read"}
	keys := luascripts.KeysFor(luascripts.DefaultPrefix, key)
	rdb := rs.Client()
	var (
		mu       sync.Mutex
		high     int64 // the highest fence read so far
		fell     string
		pollDone = make(chan struct{})
	)
	pollCtx, stopPoll := context.WithCancel(ctx)
	go func() {
		defer close(pollDone)
		for pollCtx.Err() == nil {
			g, ok, err := luascripts.ReadGrant(pollCtx, rdb, keys)
			mu.Lock()
			if err == nil && ok {
				if g.FenceUS < high && fell == "" {
					fell = time.Now().Format(time.RFC3339Nano) + ": fence " + time.UnixMicro(g.FenceUS).Format(time.RFC3339Nano) +
						" after " + time.UnixMicro(high).Format(time.RFC3339Nano)
				}
				high = max(high, g.FenceUS)
			}
			mu.Unlock()
			time.Sleep(5 * time.Millisecond) // sampling Redis, not waiting for an event
		}
	}()
	fence := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return high
	}
	awaitFence := func(above int64, what string) {
		t.Helper()
		deadline := time.Now().Add(30 * validity)
		for fence() <= above {
			if time.Now().After(deadline) {
				t.Fatalf("no grant %s within %v", what, 30*validity)
			}
			time.Sleep(epoch / 4) // polling the deployment with a deadline
		}
	}

	// Demand on the key through the replica that will not be frozen: the
	// leader is whichever campaigned first, learned below, and the traffic
	// goes to both in turn until then.
	var load sync.WaitGroup
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer func() { stopLoad(); load.Wait() }()
	drive := func(addr string) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		c, err := lease.NewClient(conn, lease.Options{InstanceID: "load-" + addr, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		load.Add(1)
		go func() {
			defer load.Done()
			defer conn.Close()
			defer c.Close(context.Background())
			tick := time.NewTicker(2500 * time.Microsecond) // 400/s against a key of 100/s
			defer tick.Stop()
			for {
				select {
				case <-loadCtx.Done():
					return
				case <-tick.C:
					c.Allow(loadCtx, key, 1)
				}
			}
		}()
	}

	// The leader is the replica that logs its election first.
	leader, other := a, b
	timeout := time.After(30 * time.Second)
	for elected := false; !elected; {
		var l string
		ok := true
		select {
		case l, ok = <-a.lines:
			elected = strings.Contains(l, "region leader elected")
		case l, ok = <-b.lines:
			if elected = strings.Contains(l, "region leader elected"); elected {
				leader, other = b, a
			}
		case <-timeout:
			t.Fatal("no replica was elected within 30s")
		}
		if !ok {
			t.Fatal("a replica's process ended before any was elected")
		}
	}
	drive(other.addr)
	awaitFence(0, "installed")

	frozenAt := fence()
	leader.stop(syscall.SIGSTOP)
	awaitLine(t, other.lines, "region leader elected")
	// The new leader installs grants of its own, newer than any the
	// frozen one installed.
	awaitFence(frozenAt, "from the new leader")
	leader.stop(syscall.SIGCONT)
	awaitLine(t, leader.lines, "region leadership lost")
	// The window in which a stale install would show: until the new leader
	// installs a grant answering a report sent a grant validity after the
	// resume (fences are those send times), by which the resumed
	// process's rounds, bounded by their validity, have ended.
	resumedAt := fence()
	awaitFence(resumedAt+validity.Microseconds(), "a grant validity after the old leader resumed")
	stopPoll()
	<-pollDone
	if fell != "" {
		t.Fatalf("Redis went back to an older grant: %s", fell)
	}
	t.Logf("fences: %v when frozen, %v when resumed, %v at the end", time.UnixMicro(frozenAt).Format(time.StampMicro),
		time.UnixMicro(resumedAt).Format(time.StampMicro), time.UnixMicro(high).Format(time.StampMicro))
}

// fieldOf returns the value of a logfmt field (name including its "=") in
// line, "" when it has none.
func fieldOf(line, name string) string {
	_, rest, ok := strings.Cut(line, name)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, " ")
	return v
}
