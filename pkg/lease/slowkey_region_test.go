package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// slowKeyRegion: keys of 7 an hour with a burst of 7 (read) and of 10 a
// minute with a burst of 10 (write) in one region, as an Envoy ratelimit
// config's `requests_per_unit: 7, unit: hour` and `requests_per_unit: 10,
// unit: minute` import.
const slowKeyRegion = `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}}
classes: {read: {mode: lease}, write: {mode: lease}}
tiers: {free: {read: {rate: 7/h, burst: 7}, write: {rate: 10/m, burst: 10}}}
default_tier: free
`

// TestPeerOfASlowKeyIsAdmittedWithinAFewRefreshes: two instances, each
// with its own lease client, share a key whose bucket takes minutes to
// refill (7 an hour, 10 a minute). Instance A asks first and, alone on the
// key, takes the whole burst; then B asks. B is denied only until A's next
// Sync gives the rest back (docs/architecture.md, "A peer of a lone
// holder"): it must be admitted within a few refreshes, and never be told
// to wait much longer. It was denied for as long as it ran and told to
// retry after the bucket's refill of one token plus spread (8.6-17
// minutes on the key of 7 an hour, 6-12 s on the one of 10 a minute)
// while A held the rest.
func TestPeerOfASlowKeyIsAdmittedWithinAFewRefreshes(t *testing.T) {
	// A region of its own, and mostly waiting on refreshes: it runs
	// beside the package's other parallel tests.
	t.Parallel()
	for _, tc := range []struct {
		class string
		burst int64
	}{{"read", 7}, {"write", 10}} {
		t.Run(tc.class, func(t *testing.T) { peerOfASlowKey(t, tc.class, tc.burst) })
	}
}

func peerOfASlowKey(t *testing.T, class string, burst int64) {
	// The development mode's refresh: a batch A sizes from its first
	// request's demand covers the whole burst.
	const refresh = time.Second
	cfg := regiontest.MustConfig(t, slowKeyRegion)
	reg := regiontest.Start(t, cfg, "local")
	key := quota.Key{Tenant: "acme", Class: class}
	newClient := func(id string, metrics *prometheus.Registry) *lease.Client {
		c, err := lease.NewClient(reg.Dial(t), lease.Options{
			InstanceID: id, Refresh: refresh,
			// Generous: the machine running the tests is shared.
			BreakerTimeout: 2 * time.Second, SyncTimeout: 2 * time.Second,
			Registerer: metrics,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	// A's Syncs are the clock of the waits below: on a starved machine A
	// refreshes less often than every refresh of the wall clock, and B
	// waits on A's next Sync.
	aSyncs := prometheus.NewRegistry()
	a, b := newClient("a", aSyncs), newClient("b", prometheus.NewRegistry())
	d, err := a.Allow(context.Background(), key, 1)
	if err != nil || !d.Allowed {
		t.Fatalf("A's first request: %+v, %v; want admitted", d, err)
	}
	// Alone on the key, A's batch (or the refill its first request
	// kicked) takes the rest of the burst: the region's bucket is empty
	// and A holds the tokens left.
	// Each of A's Syncs asks for at least what A holds below its batch
	// and takes a token while the region's bucket has one: within burst
	// of them, A holds the rest. At least the rest: the key of 10 a
	// minute refills a token every 6 s, which a Sync of A's on a starved
	// machine takes too.
	// A failure here was seen once in four make test runs and not
	// diagnosed: say what A held, and how its key was decided, at the end.
	t.Cleanup(func() {
		if t.Failed() {
			st, _ := a.Table().State(key)
			t.Logf("A's first decision %+v; its state of %v at the end: %+v; A's Syncs %d, Acquires %d", d, key, st,
				rpcCalls(t, aSyncs, "Sync"), rpcCalls(t, aSyncs, "Acquire"))
		}
	})
	held0 := rpcCalls(t, aSyncs, "Sync")
	waitForSyncs(t, "A to hold the rest of the burst", aSyncs, uint64(burst), func() bool {
		st, _ := a.Table().State(key)
		return st.Tokens >= burst-1 && !st.InFlight
	})
	t.Logf("A held the rest of the burst after %d of its Syncs", rpcCalls(t, aSyncs, "Sync")-held0)
	// The bound: B's first ask counts it live at the region; A's next
	// Sync (at most one refresh later) learns of it and gives back at
	// once what it holds above its batch cap; the region tells B to ask
	// again after about one refresh (the holders' give-back, not the
	// bucket's refill of a token, 8.6 minutes), and B adds at most as
	// much again of spread (it shares the key). So B is admitted within
	// three refreshes of its first ask, and never told to wait two. The
	// refreshes are counted in A's Syncs, the event B waits on: a starved
	// machine runs fewer of them a second.
	const bound = 3 // of A's Syncs
	maxRetry := 2 * refresh
	start, syncs0 := time.Now(), rpcCalls(t, aSyncs, "Sync")
	var worst time.Duration
	denials := 0
	for {
		d, err := b.Allow(context.Background(), key, 1)
		if err != nil {
			t.Fatalf("B: %v", err)
		}
		if d.Degraded {
			t.Fatalf("B decided degraded; the region answered")
		}
		if d.Allowed {
			break
		}
		denials++
		if d.RetryNever {
			t.Fatalf("B told never for one token of a key of burst 7")
		}
		worst = max(worst, d.RetryAfter)
		if n := rpcCalls(t, aSyncs, "Sync") - syncs0; n > bound {
			t.Fatalf("B still denied %v and %d of A's Syncs after its first ask (%d denials, worst RetryAfter %v); want admitted within %d", time.Since(start), n, denials, worst, bound)
		}
		// Ask again at the next instant the client would accept (a
		// denial is not retried inside the client's own wait).
		wait := time.NewTimer(min(d.RetryAfter, refresh/4) + time.Millisecond)
		<-wait.C
	}
	took, syncs := time.Since(start), rpcCalls(t, aSyncs, "Sync")-syncs0
	t.Logf("B admitted %v and %d of A's Syncs after its first ask, after %d denials; worst RetryAfter %v", took, syncs, denials, worst)
	if syncs > bound {
		t.Errorf("B admitted %d of A's Syncs after its first ask; want within %d (A's next Sync gives the rest back)", syncs, bound)
	}
	if worst > maxRetry {
		t.Errorf("B told to retry after up to %v; want at most %v (A gives back at its next Sync)", worst, maxRetry)
	}
}
