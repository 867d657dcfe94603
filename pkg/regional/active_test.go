package regional

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/memtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// heapReturned fails the test when the heap is more than slack above base.
func heapReturned(t *testing.T, base int64, slack int64, what string) {
	t.Helper()
	now := memtest.HeapAlloc()
	t.Logf("%s: heap %+.1f MiB from the baseline", what, float64(now-base)/(1<<20))
	if now-base > slack {
		t.Fatalf("%s: heap is %.1f MiB above the baseline, want at most %.1f MiB", what,
			float64(now-base)/(1<<20), float64(slack)/(1<<20))
	}
}

func manyKeys(n int) []quota.Key {
	keys := make([]quota.Key, n)
	for i := range keys {
		keys[i] = quota.Key{Tenant: fmt.Sprintf("t%07d", i), Class: "read"}
	}
	return keys
}

// TestActiveIndexHoldsOnlyLiveKeys drives 200,000 keys through the index:
// half are released, half keep their leases until they expire. A key
// served since the last prune is kept; after that the released keys are
// forgotten at once, the others one lease TTL after their last reply, the
// live-lease count follows, and the memory comes back.
func TestActiveIndexHoldsOnlyLiveKeys(t *testing.T) {
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	const ttl = time.Second
	base := memtest.HeapAlloc()
	keys := manyKeys(n)
	a := newActiveKeys()
	now := time.Unix(1000, 0)
	for i, k := range keys {
		a.touch(now, k, 2)
		if i%2 == 0 {
			a.release(k)
			a.release(k)
		}
	}
	if got, want := a.leases(now, ttl), int64(n); got != want {
		t.Fatalf("%d live leases after releasing half, want %d", got, want)
	}
	a.prune(now, ttl)
	if got := a.size(); got != n {
		t.Fatalf("the first prune left %d keys, want all %d served since the last", got, n)
	}
	a.prune(now.Add(ttl/2), ttl)
	if got := a.size(); got != n/2 {
		t.Fatalf("the next prune kept %d keys, want the %d with live leases", got, n/2)
	}
	if got := a.leases(now.Add(ttl/2), ttl); got != int64(n) {
		t.Fatalf("%d live leases half a TTL later, want %d", got, n)
	}
	if got := a.leases(now.Add(ttl), ttl); got != 0 {
		t.Fatalf("%d live leases one TTL after the last reply, want 0", got)
	}
	a.prune(now.Add(ttl), ttl)
	if got := a.size(); got != 0 {
		t.Fatalf("%d keys kept one TTL after the last reply, want 0", got)
	}
	keys = nil
	heapReturned(t, base, 4<<20, "index emptied")
	runtime.KeepAlive(a)
}

func leaseConfig(t *testing.T, ttl string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(`
lease_ttl: ` + ttl + `
refresh: 200ms
regions: {local: {weight: 1}}
classes:
  read: {mode: lease}
tiers:
  free: {read: {rate: 1/s, burst: 100}}
default_tier: free
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newTestServer(t *testing.T, cfg *config.Config) *Server {
	t.Helper()
	rdb := redistest.Start(t).Client()
	s, err := New(Options{Region: "local", Redis: rdb, Config: StaticConfig{C: cfg}, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// leaseMany acquires a lease on each key from instances of its own and
// releases every other one; it returns how many it released.
func leaseMany(t *testing.T, s *Server, keys []quota.Key) int {
	t.Helper()
	ctx := context.Background()
	const workers = 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inst := fmt.Sprintf("i%d", w)
			for i := w; i < len(keys); i += workers {
				if _, err := s.Acquire(ctx, acquireReq(inst, keys[i], 1)); err != nil {
					errs <- err
					return
				}
				if i%2 == 0 {
					continue
				}
				_, err := s.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: inst, Reports: []*sluicev1.KeyReport{
					{Key: &sluicev1.QuotaKey{Tenant: keys[i].Tenant, Class: keys[i].Class}, Seq: 2},
				}})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return len(keys) / 2
}

// TestActiveLeasesGaugeCountsLiveLeases: a released lease leaves the
// sluice_regional_active_leases gauge at once.
func TestActiveLeasesGaugeCountsLiveLeases(t *testing.T) {
	s := newTestServer(t, leaseConfig(t, "1m"))
	keys := manyKeys(200)
	released := leaseMany(t, s, keys)
	if got, want := gaugeValue(t, s.metrics.activeLeases), float64(len(keys)-released); got != want {
		t.Fatalf("active leases gauge %v after releasing %d of %d leases, want %v", got, released, len(keys), want)
	}
	if got := gaugeValue(t, s.metrics.activeKeys); got != float64(len(keys)) {
		t.Fatalf("active keys gauge %v before any flush, want %d", got, len(keys))
	}
}

// TestReplicaForgetsReleasedAndExpiredLeases runs a real regional server on
// real Redis: instances acquire leases on many distinct keys, half release
// them and half let them expire. The replica's index and its live-lease
// gauge fall back to zero and the heap comes back, within a deadline
// derived from the lease TTL.
func TestReplicaForgetsReleasedAndExpiredLeases(t *testing.T) {
	n := 20_000
	if testing.Short() {
		n = 2_000
	}
	cfg := leaseConfig(t, "1s")
	ttl := time.Duration(cfg.LeaseTTL)
	s := newTestServer(t, cfg)
	ctx := context.Background()
	// Warm up the scripts and the connection pool before the baseline.
	leaseMany(t, s, manyKeys(64))
	base := memtest.HeapAlloc()

	keys := manyKeys(n)
	released := leaseMany(t, s, keys)
	leases := gaugeValue(t, s.metrics.activeLeases)
	t.Logf("%d keys leased, %d released: the gauge shows %.0f live leases", n, released, leases)
	if leases > float64(n-released+64) {
		t.Fatalf("active leases gauge %.0f after releasing %d of %d leases: released leases counted", leases, released, n)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.Run(runCtx, ttl/10) }()
	defer func() { cancel(); <-done }()
	// Every lease expires one TTL after its reply; the index needs a flush
	// and a prune after that. Allow many TTLs for a starved machine.
	deadline := time.Now().Add(30 * ttl)
	poll := time.NewTicker(ttl / 20)
	defer poll.Stop()
	for s.active.size() > 0 || gaugeValue(t, s.metrics.activeLeases) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d keys and %.0f live leases still tracked %v after the last lease was granted",
				s.active.size(), gaugeValue(t, s.metrics.activeLeases), 30*ttl)
		}
		<-poll.C
	}
	if got := gaugeValue(t, s.metrics.activeKeys); got != 0 {
		t.Fatalf("active keys gauge %v, want 0", got)
	}
	keys = nil
	heapReturned(t, base, 4<<20, "replica idle")
}

func gaugeValue(t *testing.T, g prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func acquireReq(inst string, k quota.Key, seq uint64) *sluicev1.AcquireRequest {
	return &sluicev1.AcquireRequest{InstanceId: inst, Report: &sluicev1.KeyReport{
		Key: &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}, Seq: seq, Want: 1,
	}}
}

// The region leader's demand baselines are bounded in pkg/regionsync
// (TestLeaderForgetsIdleBaselines there), where its report is built.
