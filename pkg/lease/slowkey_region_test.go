package lease_test

import (
	"context"
	"fmt"
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
	// request's demand covers the whole burst (when sized soon, below).
	const refresh = time.Second
	cfg := regiontest.MustConfig(t, slowKeyRegion)
	reg := regiontest.Start(t, cfg, "local")
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
	b := newClient("b", prometheus.NewRegistry())
	// Alone on the key, A takes the rest of the burst with the refill its
	// first request kicks, and the region's bucket is empty when B asks.
	// That holds only when the refill is sized soon enough: A's Acquire
	// for a key it never saw asks for the request's token alone (no
	// demand measured yet), and the refill after it asks for 1.5
	// refreshes of the demand A measured since its first request, one
	// token over max(the time since, refresh/20). It covers the rest of
	// the burst when sized within 1.5 refreshes / (burst − 1) of the
	// request: 300 ms on the key of 7 an hour, 167 ms on the one of 10 a
	// minute. A machine that holds A's Acquire's answer or its refill
	// longer (a loaded one running the whole suite) has A ask for less,
	// and A never holds the rest afterwards: its later Syncs size at a
	// demand that only falls, and hold at most half the burst once A does
	// not drain the region. The bucket then keeps tokens, B is admitted at
	// its first ask, and the run says nothing of B's wait for A's give-back.
	// It starts over instead, with a new instance A (whose Syncs carry no
	// other key's reports) on a fresh key (another tenant, a bucket of its
	// own), until A's first refill holds the rest: within burst of the A
	// instances' Syncs in all, each attempt taking at least one, its refill.
	// A's Syncs are the clock of the waits below: on a starved machine A
	// refreshes less often than every refresh of the wall clock, and B
	// waits on A's next Sync.
	var (
		a      *lease.Client
		aSyncs *prometheus.Registry
		key    quota.Key
		d      quota.Decision
		err    error
	)
	var setupSyncs uint64 // of the A instances before this attempt's
	for attempt := 1; ; attempt++ {
		id := "a"
		key = quota.Key{Tenant: "acme", Class: class}
		if attempt > 1 {
			id, key.Tenant = fmt.Sprintf("a-%d", attempt), fmt.Sprintf("acme-%d", attempt)
		}
		aSyncs = prometheus.NewRegistry()
		a = newClient(id, aSyncs)
		// Say what the last A held, and how its key was decided, should a
		// wait fail (before its Close: cleanups run last first).
		t.Cleanup(func(ac *lease.Client, reg *prometheus.Registry, k quota.Key) func() {
			return func() {
				if t.Failed() && ac == a {
					st, _ := ac.Table().State(k)
					t.Logf("A's first decision %+v; its state of %v at the end: %+v; A's Syncs %d, Acquires %d", d, k, st,
						rpcCalls(t, reg, "Sync"), rpcCalls(t, reg, "Acquire"))
				}
			}
		}(a, aSyncs, key))
		d, err = a.Allow(context.Background(), key, 1)
		if err != nil || !d.Allowed {
			t.Fatalf("A's first request on %v: %+v, %v; want admitted", key, d, err)
		}
		// The request took A's only token: the pool stays empty until the
		// refill it kicked is answered (a failed one is resent).
		var st lease.KeyState
		for {
			st, _ = a.Table().State(key)
			if st.Tokens > 0 && !st.InFlight {
				break
			}
			if n := setupSyncs + rpcCalls(t, aSyncs, "Sync"); n > uint64(burst) {
				t.Fatalf("A's refill after its first request on %v: not answered within %d of A's Syncs", key, n)
			}
			time.Sleep(5 * time.Millisecond) // polling, with a deadline in A's Syncs
		}
		setupSyncs += rpcCalls(t, aSyncs, "Sync")
		// At least the rest: a token the bucket refilled meanwhile (one
		// every 6 s on the key of 10 a minute) A's refill may take too.
		if st.Tokens >= burst-1 {
			t.Logf("A held the rest of the burst on %v after %d of its Syncs (attempt %d)", key, setupSyncs, attempt)
			break
		}
		if setupSyncs >= uint64(burst) {
			t.Fatalf("A's refill on %v brought %d tokens, not the rest of the burst (%d), in each of %d attempts within %d of A's Syncs",
				key, st.Tokens, burst-1, attempt, setupSyncs)
		}
		t.Logf("A's refill on %v brought %d tokens, not the rest of the burst (%d): sized late, at a demand of %.3g/s; again with a new A on a fresh key",
			key, st.Tokens, burst-1, st.Rate)
		if err := a.Close(context.Background()); err != nil {
			t.Fatalf("closing A: %v", err)
		}
	}
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
