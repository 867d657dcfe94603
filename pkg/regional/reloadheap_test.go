package regional_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/envcount"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/memtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// reloadBase is the document of the reload tests: one region, so the
// region leader's report alone lets the global tier confirm a revision.
const reloadBase = `
regions: {eu: {weight: 1}}
classes: {read: {mode: lease}, write: {mode: lease}}
tiers:
  free: {read: {rate: 10/s, burst: 20}, write: {rate: 2/s, burst: 5}}
  pro: {read: {rate: 2000/s, burst: 4000}, write: {rate: 500/s, burst: 1000}}
default_tier: free
`

// reloadConfig is reloadBase with n tenants named <prefix>0000000..;
// every seventh is pro with a write override whose rate is 100+gen.
func reloadConfig(t testing.TB, n, gen int, prefix string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(reloadBase))
	if err != nil {
		t.Fatal(err)
	}
	c.Tenants = make(map[string]config.Tenant, n)
	for i := range n {
		id := fmt.Sprintf("%s%07d", prefix, i)
		if i%7 == 0 {
			c.Tenants[id] = config.Tenant{Tier: "pro", Overrides: map[string]config.LimitSpec{
				"write": {Rate: config.Rate(100 + gen), Burst: 1000}}}
		} else {
			c.Tenants[id] = config.Tenant{Tier: "free"}
		}
	}
	return c
}

// reloadRig is a global allocator daemon and a region's server and leader,
// each with its own configstore.Watcher on one embedded etcd, as in three
// processes.
type reloadRig struct {
	cli            *clientv3.Client
	store          *configstore.Store
	global, region *configstore.Watcher
	leader         *regional.Leader
	rev            int64
}

func startReloadRig(t *testing.T, first *config.Config) *reloadRig {
	t.Helper()
	ctx := t.Context()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	r := &reloadRig{cli: cli, store: configstore.NewStore(cli, "/reload")}
	rev, err := r.store.Apply(ctx, first, 0)
	if err != nil {
		t.Fatal(err)
	}
	r.rev = rev
	quiet := slog.New(slog.DiscardHandler)
	watch := func() *configstore.Watcher {
		w := configstore.NewWatcher(configstore.NewStore(etcd.Client(t), "/reload"), nil, quiet, nil)
		wctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = w.Run(wctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return w
	}
	r.global, r.region = watch(), watch()
	r.await(t)
	d, err := allocator.StartDaemon(ctx, allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", Etcd: cli, Prefix: "/reload", SessionTTL: 10 * time.Second,
		Config: r.global, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	awaitAllocatorLeader(t, d, 10*time.Second)
	srv, err := regional.New(regional.Options{Region: "eu", Redis: redistest.Start(t).Client(), Config: r.region, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	r.leader, err = regional.NewLeader(srv, regional.LeaderOptions{
		Etcd: cli, ElectionPrefix: "/reload/election/", Global: serviceTier{d.Service}, Identity: "eu",
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// await waits until both watchers run r.rev.
func (r *reloadRig) await(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for r.global.Revision() != r.rev || r.region.Revision() != r.rev {
		if time.Now().After(deadline) {
			t.Fatalf("watchers at revisions %d and %d, want %d", r.global.Revision(), r.region.Revision(), r.rev)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reload applies cfg, waits until both daemons run it and, when sync, has
// the region leader report once (it reports every epoch when it runs), and
// compacts etcd's history: the embedded etcd shares the process, and what
// its index keeps of older revisions is no daemon's.
func (r *reloadRig) reload(t *testing.T, cfg *config.Config, sync bool) {
	t.Helper()
	ctx := t.Context()
	rev, err := r.store.Apply(ctx, cfg, r.rev)
	if err != nil {
		t.Fatal(err)
	}
	r.rev = rev
	r.await(t)
	if sync {
		if err := r.leader.SyncOnce(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	head, err := r.cli.Get(ctx, "/reload/config", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.cli.Compact(ctx, head.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
}

// reloadProfileRate samples one allocation per 4 KiB, so that the heap
// the embedded etcd server holds is told from the daemons' heap.
const reloadProfileRate = 4096

// daemonHeap is the heap in use after garbage collection without what the
// embedded etcd server holds (its raft log and index, allocated under
// go.etcd.io/etcd/server and go.etcd.io/raft), estimated from the heap
// profile as pprof does: what etcd shares the process with in a test it
// does not in production.
func daemonHeap() (daemon, etcd int64) {
	runtime.GC()
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	n, _ := runtime.MemProfile(nil, true)
	recs := make([]runtime.MemProfileRecord, n+100)
	n, _ = runtime.MemProfile(recs, true)
	rate := float64(runtime.MemProfileRate)
	for _, r := range recs[:n] {
		objs, bytes := r.InUseObjects(), r.InUseBytes()
		if objs == 0 || !etcdServerStack(r.Stack()) {
			continue
		}
		avg := float64(bytes) / float64(objs)
		etcd += int64(float64(bytes) / (1 - math.Exp(-avg/rate)))
	}
	return int64(m.HeapAlloc) - etcd, etcd
}

func etcdServerStack(pcs []uintptr) bool {
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "go.etcd.io/etcd/server/") || strings.HasPrefix(f.Function, "go.etcd.io/raft/") {
			return true
		}
		if !more {
			return false
		}
	}
}

// TestReloadHeapSoak applies SLUICE_RELOAD_TENANTS tenants and reloads
// them SLUICE_RELOAD_TIMES times (default 10) in four ways: the same
// names with changed limits, new names each time (every tenant of the
// previous config removed), and both with the region never reporting (cut
// off from the global tier, so no revision is ever confirmed; these reload
// at least regionsync.MaxChain+4 times). It logs the heap in use after
// each reload, after garbage collection; SLUICE_RELOAD_HEAPPROFILE=DIR
// writes a heap profile after the last reload of each.
func TestReloadHeapSoak(t *testing.T) {
	n := envcount.Get(t, "SLUICE_RELOAD_TENANTS", 0, 1)
	if n == 0 {
		t.Skip("set SLUICE_RELOAD_TENANTS=100000 to measure the heap across reloads")
	}
	times := envcount.Get(t, "SLUICE_RELOAD_TIMES", 10, 1)
	defer func(r int) { runtime.MemProfileRate = r }(runtime.MemProfileRate)
	runtime.MemProfileRate = reloadProfileRate
	for _, c := range []struct {
		name         string
		rotate, sync bool
	}{
		{"same-names", false, true},
		{"rotating-names", true, true},
		{"same-names-unconfirmed", false, false},
		{"rotating-names-unconfirmed", true, false},
	} {
		reloads := times
		if !c.sync {
			// Past the bound on the configs a region keeps.
			reloads = max(times, regionsync.MaxChain+4)
		}
		t.Run(c.name, func(t *testing.T) {
			prefix := func(gen int) string {
				if c.rotate {
					return fmt.Sprintf("g%02d-", gen)
				}
				return "t"
			}
			base, _ := daemonHeap()
			r := startReloadRig(t, reloadConfig(t, n, 0, prefix(0)))
			if c.sync {
				if err := r.leader.SyncOnce(t.Context(), nil); err != nil {
					t.Fatal(err)
				}
			}
			line := ""
			record := func(gen int) {
				d, e := daemonHeap()
				line += fmt.Sprintf(" %d:%.1f/%.1f", gen, float64(d-base)/(1<<20), float64(e)/(1<<20))
			}
			record(0)
			for gen := 1; gen <= reloads; gen++ {
				r.reload(t, reloadConfig(t, n, gen, prefix(gen)), c.sync)
				record(gen)
			}
			t.Logf("%d tenants, %s: MiB of heap above the start without etcd's / etcd's, after each reload (0: loaded):%s", n, c.name, line)
			if dir := os.Getenv("SLUICE_RELOAD_HEAPPROFILE"); dir != "" {
				f, err := os.Create(filepath.Join(dir, c.name+".heap"))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				memtest.HeapAlloc()
				if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
