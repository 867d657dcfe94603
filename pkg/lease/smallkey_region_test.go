package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// smallKeyRegion: a key of 100/s with a burst of 20 shared by two regions
// of equal weight, only "local" running: the region's share is 50/s with a
// cap of 10, so one refresh (200ms) refills exactly its cap, as a key of
// 10/s does at the default refresh of 1s.
const smallKeyRegion = `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}, far: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {free: {read: {rate: 100/s, burst: 20}}}
default_tier: free
`

// TestPeersSharingASmallKeyUnderItsRateAreNotDenied: several instances,
// each with its own lease client, share a key whose region cap is small
// (10 tokens), and send requests on the same tick, each tick a refresh
// after the previous one's last answer: at most 40% and 80% of the
// region's rate, and never two ticks closer than the refill of the cap.
// Every request can be admitted, so every denial is false: the tokens the
// peers hold (and have spent without reporting yet, which the region
// counts as out) must leave the region's bucket room to refill every peer
// at once. Once the key's first refreshes are past (the first acquire,
// before the cap and the live instances are known, may take the whole
// bucket until the next Sync gives it back), at most one request in a
// hundred is denied; the sizing of batches at up to
// max(burst/n, rate × refresh / n) per instance denied 4-25% here. The
// bucket's bound still holds: over every window of ticks, the admissions
// are at most b + r·t on the region's Redis clock. Denials are judged
// only in ticks the region answered every call of: a call it did not
// answer in time (a loaded machine delays one past any timeout) is decided
// by the key's on_failure policy (Degraded), or denied for a round trip
// when the region answered a later call, and says nothing of the batch
// sizing (a single degraded decision failed the test).
func TestPeersSharingASmallKeyUnderItsRateAreNotDenied(t *testing.T) {
	// A region of its own, and mostly waiting on ticks: it runs beside
	// the package's other parallel tests.
	t.Parallel()
	const (
		peers   = 4
		ticks   = 50
		period  = 200 * time.Millisecond // one refresh
		burst   = 10.0
		rate    = 50.0 // tokens/s, the region's share
		maxDeny = 0.01
		warmup  = 2 // ticks: the key's first two refreshes
	)
	for _, tc := range []struct {
		name    string
		perTick int // requests each peer sends on every tick
	}{
		// 4 × 1 per refresh: at most 20/s offered against 50/s.
		{"offered 40% of the region's rate", 1},
		// 4 × 2 per refresh: at most 40/s offered against 50/s.
		{"offered 80% of the region's rate", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := regiontest.MustConfig(t, smallKeyRegion)
			reg := regiontest.Start(t, cfg, "local")
			key := quota.Key{Tenant: "acme", Class: "read"}
			var clients []*lease.Client
			var metrics []*prometheus.Registry
			for i := range peers {
				m := prometheus.NewRegistry()
				c, err := lease.NewClient(reg.Dial(t), lease.Options{
					InstanceID: fmt.Sprintf("peer%d", i), Refresh: period,
					// Generous: the machine running the tests is shared.
					BreakerTimeout: 2 * time.Second, SyncTimeout: 2 * time.Second,
					Registerer: m,
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close(context.Background()) })
				clients = append(clients, c)
				metrics = append(metrics, m)
			}
			failed := func() (n uint64) {
				for _, m := range metrics {
					n += rpcFailures(t, m)
				}
				return n
			}
			// before[k] and after[k] bracket tick k's requests on the
			// region's clock; admitted[k] is how many it admitted.
			before := make([]time.Time, ticks)
			after := make([]time.Time, ticks)
			admitted := make([]int, ticks)
			denied := make([]int, ticks)
			unjudged := make([]bool, ticks) // a call of the tick failed
			degraded := 0
			tick := time.NewTicker(period)
			defer tick.Stop()
			for k := range ticks {
				if k > 0 {
					<-tick.C
				}
				before[k] = reg.RedisNow(t)
				failedBefore, degradedBefore := failed(), degraded
				var wg sync.WaitGroup
				var mu sync.Mutex
				for _, c := range clients {
					for range tc.perTick {
						wg.Go(func() {
							d, err := c.Allow(context.Background(), key, 1)
							mu.Lock()
							defer mu.Unlock()
							switch {
							case err != nil:
								t.Errorf("Allow: %v", err)
							case d.Degraded:
								degraded++
							case d.Allowed:
								admitted[k]++
							default:
								denied[k]++
							}
						})
					}
				}
				wg.Wait()
				after[k] = reg.RedisNow(t)
				unjudged[k] = failed() != failedBefore || degraded != degradedBefore
				// The next tick is a whole refresh after this one's last
				// answer: the bucket refills its cap in between, whatever
				// delayed this tick. On a fixed schedule a late tick was
				// followed by the next one within a few milliseconds, and
				// two ticks' requests (16) in 30-100ms are more than
				// b + r·t (10 + 50/s × 0.1s) admits: denials the bucket
				// owes, not false ones.
				tick.Reset(period)
			}
			perTick := peers * tc.perTick
			early, late, sent, left := 0, 0, 0, 0
			for k, n := range denied {
				switch {
				case k < warmup:
					early += n
				case unjudged[k]:
					left++
				default:
					late += n
					sent += perTick
				}
			}
			t.Logf("%d peers, %d requests a tick: %d of %d denied in the first %d ticks, %d of %d (%.1f%%) after in the ticks the region answered; %d ticks with a call it did not answer, %d requests degraded",
				peers, perTick, early, warmup*perTick, warmup, late, sent, 100*float64(late)/float64(max(sent, 1)), left, degraded)
			if sent == 0 {
				t.Skipf("the region answered no tick after the first %d in full: nothing to judge", warmup)
			}
			if float64(late) > maxDeny*float64(sent) {
				t.Errorf("%d of %d requests after the first %d ticks denied on a key offered under its region's rate; want at most %.0f%%", late, sent, warmup, 100*maxDeny)
			}
			for i := range ticks {
				n := 0
				for j := i; j < ticks; j++ {
					n += admitted[j]
					if bound := burst + rate*after[j].Sub(before[i]).Seconds(); float64(n) > bound {
						t.Fatalf("ticks %d..%d admitted %d; b + r·t = %.3f", i, j, n, bound)
					}
				}
			}
		})
	}
}

// TestPeersWithEqualDemandOnAContendedKeyShareIt: two instances offer the
// same load, four times what the region's share refills, on a key whose
// region cap is 5 tokens at 5/s. Denied together, both were told the same
// instant to ask again, and the same one won nearly every round (one
// instance admitted 20-38% of the tokens, and behind two agents 8%). Each
// now gets at least a third of what the region admits, and together they
// admit no more than b + r·t on the region's clock.
func TestPeersWithEqualDemandOnAContendedKeyShareIt(t *testing.T) {
	// A region of its own, and mostly waiting on ticks: it runs beside
	// the package's other parallel tests.
	t.Parallel()
	const (
		run   = 12 * time.Second
		every = 10 * time.Millisecond // 100/s offered by each peer
		burst = 5.0
		rate  = 5.0 // the region's share: a 10/s key over two regions
	)
	cfg := regiontest.MustConfig(t, `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}, far: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 10/s, burst: 10}}}
default_tier: free
`)
	reg := regiontest.Start(t, cfg, "local")
	key := quota.Key{Tenant: "acme", Class: "write"}
	var admitted [2]int
	start := reg.RedisNow(t)
	var wg sync.WaitGroup
	for i := range admitted {
		c, err := lease.NewClient(reg.Dial(t), lease.Options{InstanceID: fmt.Sprintf("peer%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		wg.Go(func() {
			tick := time.NewTicker(every)
			defer tick.Stop()
			for end := time.Now().Add(run); time.Now().Before(end); <-tick.C {
				d, err := c.Allow(context.Background(), key, 1)
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if d.Allowed && !d.Degraded {
					admitted[i]++
				}
			}
		})
	}
	wg.Wait()
	end := reg.RedisNow(t)
	total := admitted[0] + admitted[1]
	t.Logf("admitted %d and %d", admitted[0], admitted[1])
	if bound := burst + rate*end.Sub(start).Seconds(); float64(total) > bound {
		t.Fatalf("admitted %d in all; b + r·t = %.3f", total, bound)
	}
	for i, n := range admitted {
		if 3*n < total {
			t.Errorf("peer %d admitted %d of %d; want at least a third with equal demand", i, n, total)
		}
	}
}

// TestARetryAtRetryAfterOnAnIdleKeyIsAdmitted: a caller denied on a key
// nothing else spends from, which waits exactly the RetryAfter it was told
// and asks again, is admitted: the instance's own wait never outlasts what
// it told its callers (a periodic Sync asking during the region's wait
// moved it later by the round trip and a millisecond's rounding: 3 of 40
// such retries were denied again, with a RetryAfter of 1-3ms), and the
// region's bucket holds the token by then (its wait, on its Redis clock,
// began before its answer left). The first is the instance's promise,
// checked on its own clock (the key's state) at the retry. The second is
// the region's, so it is judged only on keys whose calls the region
// answered: a call it did not answer in time (the client counts the RPC
// as failed) is decided by the key's on_failure policy (Degraded), or
// denied for a round trip when the region answered a later call, and says
// nothing of the region's wait. At a load of 15-20 on two cores (1 run in
// 30) an Acquire outlasted the breaker timeout of 2s, and the retry it
// carried, decided by the local bucket (charged with the 20 tokens the
// region had just admitted, so empty), failed the test.
func TestARetryAtRetryAfterOnAnIdleKeyIsAdmitted(t *testing.T) {
	// A region of its own, and mostly waiting out RetryAfters: it runs
	// beside the package's other parallel tests.
	t.Parallel()
	_, c, m := lonelyCaller(t)
	ctx := context.Background()
	const keys = 40
	judged := 0
	// notJudged logs a key a call of which the region did not answer, and
	// waits until it answers again (the owner's next Sync, a refresh away,
	// ends degraded mode and closes the breaker), so that the next key is
	// not decided by the policy at once; false when it did not within a
	// lease TTL (lonelyCaller's, the default): then no later key would be
	// judged either.
	notJudged := func(format string, args ...any) bool {
		t.Logf(format, args...)
		for deadline := time.Now().Add(config.DefaultLeaseTTL); c.Table().Degraded(); time.Sleep(lease.DefaultRefresh / 10) {
			if time.Now().After(deadline) {
				t.Logf("the region answered no call for a lease TTL (%v): no further key judged", config.DefaultLeaseTTL)
				return false
			}
		}
		return true
	}
	for i := range keys {
		key := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "read"}
		// answered: the region answered every call while the key's
		// requests ran (none failed), and decided each of them.
		failedBefore := rpcFailures(t, m)
		degraded := false
		allow := func(cost int64) (quota.Decision, error) {
			d, err := c.Allow(ctx, key, cost)
			degraded = degraded || d.Degraded
			return d, err
		}
		answered := func() bool { return !degraded && rpcFailures(t, m) == failedBefore }
		// Spend the whole bucket, then ask for one more until denied (on
		// a slow machine the bucket refills a token or two meanwhile).
		d, err := allow(1)
		if err == nil && d.Allowed {
			d, err = allow(19)
		}
		for n := 0; err == nil && d.Allowed && n < 100; n++ {
			d, err = allow(1)
		}
		if !answered() {
			if !notJudged("key %s: a call the region did not answer (%+v, %v): not judged", key, d, err) {
				break
			}
			continue
		}
		if err != nil || d.Allowed || d.Degraded || d.RetryNever || d.RetryAfter <= 0 {
			t.Fatalf("key %s: %+v, %v; want the bucket spent, then a denial with a wait", key, d, err)
		}
		wait := d.RetryAfter
		time.Sleep(wait) // what a caller told to retry after wait does
		if st, ok := c.Table().State(key); ok && st.NegUntil.After(time.Now()) {
			t.Errorf("key %s: told to retry after %v, the instance's own wait still runs for %v then", key, wait, time.Until(st.NegUntil))
		}
		d, err = allow(1)
		if !answered() {
			if !notJudged("key %s: the retry %v after a denial, which the region did not answer (%+v, %v): not judged", key, wait, d, err) {
				break
			}
			continue
		}
		judged++
		if err != nil || !d.Allowed {
			t.Errorf("key %s: the retry %v after a denial: %+v, %v; want it admitted", key, wait, d, err)
		}
	}
	t.Logf("%d of %d retries judged (the region answered every call of the key)", judged, keys)
	if judged == 0 {
		t.Skip("the region answered no key's calls: nothing to judge")
	}
}

// TestACostAboveTheBurstOfAFreshKeyLeavesNothing: a first request whose
// cost is above the key's burst fails with the region's reason, said once
// as invalid input, and leaves no bucket or lease in the region's Redis
// (it created both, counting the instance among the key's live ones).
func TestACostAboveTheBurstOfAFreshKeyLeavesNothing(t *testing.T) {
	reg, c, _ := lonelyCaller(t)
	_, err := c.Allow(context.Background(), quota.Key{Tenant: "fresh", Class: "read"}, 21)
	if !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), "cost 21 exceeds the burst 20") ||
		strings.Count(err.Error(), quota.ErrInvalid.Error()) != 1 {
		t.Fatalf("cost 21 on a fresh key of burst 20: %v; want invalid input said once, naming the cost and the burst", err)
	}
	if n, err := reg.RDB.DBSize(context.Background()).Result(); err != nil || n != 0 {
		t.Fatalf("Redis holds %d keys (%v) after a refused first request, want none", n, err)
	}
}

// lonelyCaller is the only lease client of a region whose read class is
// 10/s with a burst of 20, with waits generous for a shared machine, and
// the registry of its metrics.
func lonelyCaller(t *testing.T) (*regiontest.Region, *lease.Client, *prometheus.Registry) {
	t.Helper()
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {free: {read: {rate: 10/s, burst: 20}}}
default_tier: free
`)
	reg := regiontest.Start(t, cfg, "local")
	m := prometheus.NewRegistry()
	c, err := lease.NewClient(reg.Dial(t), lease.Options{InstanceID: "caller", BreakerTimeout: 2 * time.Second, SyncTimeout: 2 * time.Second, Registerer: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return reg, c, m
}

// rpcFailures is how many RPCs to the region the client whose metrics m
// holds saw fail (any code but OK, the breaker open included), whatever
// their method.
func rpcFailures(t *testing.T, m *prometheus.Registry) uint64 {
	t.Helper()
	return metrictest.Samples(t, m, "sluice_client_rpc_duration_seconds", func(l map[string]string) bool { return l["code"] != "OK" })
}
