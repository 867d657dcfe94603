package configstore

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/memtest"
	"github.com/sluicehq/sluice/pkg/config"
)

// namedTenants is the sample with n tenants named <prefix>0000000..; every
// seventh is pro with an override.
func namedTenants(n int, prefix string) *config.Config {
	c := config.Default()
	for i := range n {
		id := fmt.Sprintf("%s%07d", prefix, i)
		if i%7 == 0 {
			c.Tenants[id] = config.Tenant{Tier: "pro", Overrides: map[string]config.LimitSpec{
				"write": {Rate: 100, Burst: 1600}}}
		} else {
			c.Tenants[id] = config.Tenant{Tier: "free"}
		}
	}
	return c
}

// watchThrough runs a Watcher on store while drive runs (await waits
// until the watcher runs a revision), and returns it stopped.
func watchThrough(t *testing.T, store *Store, drive func(await func(rev int64))) *Watcher {
	t.Helper()
	w := NewWatcher(store, nil, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	drive(func(rev int64) {
		t.Helper()
		deadline := time.Now().Add(waitFor)
		for w.Revision() != rev {
			if time.Now().After(deadline) {
				t.Fatalf("watcher at revision %d, want %d", w.Revision(), rev)
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
	return w
}

// dropped is the heap *w holds: the heap in use less the heap once *w is
// dropped, with etcd stopped so that little else allocates meanwhile. Each
// side is the least of three readings: the etcd client's goroutines still
// try to reach the stopped server, and a reading taken while one attempt's
// buffers are live would count them as the watcher's (a run on a busy
// machine once read 1.18x for what reads about 1.0x).
func dropped(srv *etcdtest.Server, w **Watcher) int64 {
	srv.Stop()
	with := leastHeap()
	runtime.KeepAlive(*w)
	*w = nil
	return with - leastHeap()
}

// leastHeap is the least of three memtest.HeapAlloc readings.
func leastHeap() int64 {
	least := memtest.HeapAlloc()
	for range 2 {
		least = min(least, memtest.HeapAlloc())
	}
	return least
}

// TestReloadsKeepTheWatcherHeapToTheLiveConfig reloads a config ten
// times, each time with new tenant names that sort before the old ones (so
// every new tenant arrives before the old ones are deleted), and then
// compares the heap the watcher holds with a watcher that loaded the last
// config fresh: the tenants of configs gone must leave no room behind (Go
// maps never shrink, and the copy made for each change keeps the room).
func TestReloadsKeepTheWatcherHeapToTheLiveConfig(t *testing.T) {
	const n, reloads = 4000, 10
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "")
	// Each apply gets its own bound: eleven applies of 4,000 tenants under
	// the race detector on a busy machine outlast one shared bound.
	rev, err := store.Apply(testContext(t), namedTenants(n, fmt.Sprintf("g%02d-", reloads)), 0)
	if err != nil {
		t.Fatal(err)
	}
	reloaded := watchThrough(t, store, func(await func(int64)) {
		await(rev)
		for gen := reloads - 1; gen >= 0; gen-- {
			if rev, err = store.Apply(testContext(t), namedTenants(n, fmt.Sprintf("g%02d-", gen)), rev); err != nil {
				t.Fatal(err)
			}
			await(rev)
		}
	})
	held := dropped(srv, &reloaded)
	srv.Restart()
	fresh := watchThrough(t, store, func(await func(int64)) { await(rev) })
	heldFresh := dropped(srv, &fresh)
	t.Logf("%d tenants: the watcher holds %.2f MiB after %d reloads with new names, %.2f MiB loading the same config fresh",
		n, float64(held)/(1<<20), reloads, float64(heldFresh)/(1<<20))
	if float64(held) > 1.15*float64(heldFresh) {
		t.Fatalf("after %d reloads the watcher holds %d bytes, %.2fx what it holds loading the same config fresh (%d); want at most 1.15x",
			reloads, held, float64(held)/float64(heldFresh), heldFresh)
	}
}
