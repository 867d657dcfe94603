package lease_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// oneRegion: a single region, so its static share is the whole limit.
// Rates are slow so that refill during a test barely moves the numbers.
const oneRegion = `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}}
classes:
  read:     {mode: lease}
  shadowed: {mode: lease, shadow: true}
  export:   {mode: strict, on_failure: closed}
tiers:
  free: {read: {rate: 1/s, burst: 100}, shadowed: {rate: 1/s, burst: 2}, export: {rate: 1/s, burst: 3}}
  tiny: {read: {rate: 1/s, burst: 10}, shadowed: {rate: 1/s, burst: 2}, export: {rate: 1/s, burst: 3}}
tenants:
  small: {tier: tiny}
default_tier: free
`

var (
	acmeRead  = quota.Key{Tenant: "acme", Class: "read"}
	smallRead = quota.Key{Tenant: "small", Class: "read"}
)

type env struct {
	reg *regiontest.Region
	cfg *config.Config
}

func startRegion(t *testing.T) env {
	t.Helper()
	cfg := regiontest.MustConfig(t, oneRegion)
	return env{reg: regiontest.Start(t, cfg, "local"), cfg: cfg}
}

// regionState reads the region's view of key: cumulative tokens reported
// used, tokens out in live leases, bucket tokens.
func (e env) regionState(t *testing.T, key quota.Key) luascripts.State {
	t.Helper()
	keys, common, _, err := e.reg.Server.CommonFor(e.cfg, key)
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.reg.Server.Scripts().State(context.Background(), e.reg.RDB, keys, common)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitForSyncs polls cond until it holds, for as long as the client
// whose metrics reg holds has answered at most n more Syncs: a deadline in
// the client's own refreshes, of which a starved machine runs fewer a
// second than an idle one.
func waitForSyncs(t *testing.T, what string, reg *prometheus.Registry, n uint64, cond func() bool) {
	t.Helper()
	limit := rpcCalls(t, reg, "Sync") + n
	for !cond() {
		if rpcCalls(t, reg, "Sync") > limit {
			t.Fatalf("timed out waiting for %s: not within %d of the client's Syncs", what, n)
		}
		time.Sleep(5 * time.Millisecond) // polling, with a deadline in the client's refreshes
	}
}

func newClient(t *testing.T, e env, mod ...func(*lease.Options)) (*lease.Client, *prometheus.Registry, *logtest.Buffer) {
	t.Helper()
	reg := prometheus.NewRegistry()
	logs := &logtest.Buffer{}
	o := lease.Options{
		InstanceID: "it-" + strings.ReplaceAll(t.Name(), "/", "-"),
		Refresh:    200 * time.Millisecond,
		// Generous: the machine running the tests is shared. The tests
		// judge the totals a Sync or the Release at Close carries, not
		// its latency; the default SyncTimeout (Refresh/2) is short for
		// a region starved of CPU.
		BreakerTimeout: 2 * time.Second,
		SyncTimeout:    2 * time.Second,
		Registerer:     reg,
		Logger:         slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, f := range mod {
		f(&o)
	}
	c, err := lease.NewClient(e.reg.Dial(t), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c, reg, logs
}

func mustAllow(t *testing.T, c *lease.Client, key quota.Key, cost int64) quota.Decision {
	t.Helper()
	d, err := c.Allow(context.Background(), key, cost)
	if err != nil {
		t.Fatalf("Allow(%s, %d): %v", key, cost, err)
	}
	return d
}

// counter sums the samples of a counter family whose labels include want.
func counter(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labelsMatch(m, want) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// rpcCalls is how many method RPCs the client sent (and observed in its
// latency histogram), whatever their codes.
func rpcCalls(t *testing.T, reg *prometheus.Registry, method string) uint64 {
	t.Helper()
	return metrictest.Samples(t, reg, "sluice_client_rpc_duration_seconds", func(l map[string]string) bool { return l["method"] == method })
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// Allow spends leased tokens; the background Sync reports the use to the
// region; Close gives every unspent token back.
func TestClientLeasesReportsAndReleases(t *testing.T) {
	e := startRegion(t)
	c, reg, _ := newClient(t, e)
	for i := 0; i < 30; i++ {
		if d := mustAllow(t, c, acmeRead, 1); !d.Allowed || d.Degraded || d.Limit != 100 {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	// Reports run in the background, so the two views agree once the
	// latest one has been applied: then the region counts the 30 tokens
	// used and shows exactly what the client holds as out in its lease.
	waitFor(t, "the region to count 30 tokens used and see the client's pool out", func() bool {
		st := e.regionState(t, acmeRead)
		return st.Admitted == 30 && st.Outstanding == c.Table().HeldTokens()
	})
	if got := counter(t, reg, "sluice_client_decisions_total", map[string]string{"class": "read", "tier": "free", "result": "allowed", "degraded": "false"}); got != 30 {
		t.Fatalf("allowed decisions metric %v, want 30", got)
	}

	if err := c.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	st := e.regionState(t, acmeRead)
	if st.Outstanding != 0 || st.Admitted != 30 {
		t.Fatalf("after Close: region outstanding %d admitted %d; want 0 and 30", st.Outstanding, st.Admitted)
	}
	if st.Holding() < 69 {
		t.Fatalf("after Close the region holds %.1f tokens; 100 - 30 used should be back", st.Holding())
	}
	if _, err := c.Allow(context.Background(), acmeRead, 1); !errors.Is(err, lease.ErrClosed) {
		t.Fatalf("Allow after Close: %v", err)
	}
}

// Over quota is a denial with RetryAfter, not an error, and never degraded;
// the instance never admits more than the region's burst plus refill.
func TestClientDeniesOverQuota(t *testing.T) {
	e := startRegion(t)
	c, _, _ := newClient(t, e)
	start := time.Now()
	var allowed, denied int
	for i := 0; i < 25; i++ {
		d := mustAllow(t, c, smallRead, 1)
		if d.Degraded {
			t.Fatalf("request %d degraded: %+v", i, d)
		}
		if d.Allowed {
			allowed++
			continue
		}
		denied++
		if d.RetryAfter <= 0 || !d.WouldDeny {
			t.Fatalf("denial without RetryAfter: %+v", d)
		}
	}
	bound := 10 + int(time.Since(start).Seconds()+1)
	if allowed < 9 || allowed > bound {
		t.Fatalf("admitted %d of 25 with burst 10 at 1/s; want 9..%d", allowed, bound)
	}
}

func TestClientStrictClassChecksEveryRequest(t *testing.T) {
	e := startRegion(t)
	c, _, _ := newClient(t, e, func(o *lease.Options) {
		o.Classes = map[string]lease.ClassPolicy{"export": {Mode: lease.ModeStrict, OnFailure: lease.PolicyClosed}}
	})
	key := quota.Key{Tenant: "acme", Class: "export"}
	var allowed int
	for i := 0; i < 5; i++ {
		d := mustAllow(t, c, key, 1)
		if d.Allowed {
			allowed++
		} else if d.RetryAfter <= 0 {
			t.Fatalf("strict denial without RetryAfter: %+v", d)
		}
	}
	if allowed != 3 {
		t.Fatalf("strict key with burst 3 admitted %d of 5", allowed)
	}
	if st := e.regionState(t, key); st.Admitted != 3 || st.Outstanding != 0 {
		t.Fatalf("region admitted %d outstanding %d; want 3 and 0 (no lease)", st.Admitted, st.Outstanding)
	}
	if _, err := c.Allow(context.Background(), key, 4); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("cost above the strict key's burst: %v", err)
	}
}

// TestStrictFirstCheckKnowsTheRegionsCap: a strict class configured up
// front is checked from the first request, with no grant to learn the
// region's burst from; the check's answer carries it, so the very first
// decision says what this region can spend (its static half of the burst
// 10: Cap 5), not the global limit.
func TestStrictFirstCheckKnowsTheRegionsCap(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}, other: {weight: 1}}
classes: {export: {mode: strict, on_failure: closed}}
tiers: {free: {export: {rate: 1/h, burst: 10}}}
default_tier: free
`)
	e := env{reg: regiontest.Start(t, cfg, "local"), cfg: cfg}
	c, _, _ := newClient(t, e, func(o *lease.Options) {
		o.Classes = map[string]lease.ClassPolicy{"export": {Mode: lease.ModeStrict, OnFailure: lease.PolicyClosed}}
	})
	key := quota.Key{Tenant: "acme", Class: "export"}
	d := mustAllow(t, c, key, 1)
	if !d.Allowed || d.Limit != 10 || !d.CapKnown || d.Cap != 5 || d.Remaining != 4 {
		t.Fatalf("first strict decision %+v: want allowed, Limit 10, Cap 5 (the region's half) known, Remaining 4", d)
	}
	if st := e.regionState(t, key); st.Admitted != 1 || st.Outstanding != 0 {
		t.Fatalf("region admitted %d outstanding %d; want 1 and 0 (checked, no lease)", st.Admitted, st.Outstanding)
	}
}

// A class the client did not know is strict is learned from the first
// reply and checked from then on.
func TestClientLearnsStrictMode(t *testing.T) {
	e := startRegion(t)
	c, _, _ := newClient(t, e)
	key := quota.Key{Tenant: "acme", Class: "export"}
	var allowed int
	for i := 0; i < 5; i++ {
		if mustAllow(t, c, key, 1).Allowed {
			allowed++
		}
	}
	if allowed != 3 {
		t.Fatalf("admitted %d of 5 on a strict key with burst 3", allowed)
	}
	if st, _ := c.Table().State(key); st.Mode != lease.ModeStrict {
		t.Fatalf("mode %v, want strict", st.Mode)
	}
}

func TestClientShadowMode(t *testing.T) {
	e := startRegion(t)
	c, reg, _ := newClient(t, e)
	key := quota.Key{Tenant: "acme", Class: "shadowed"}
	var would int
	for i := 0; i < 5; i++ {
		d := mustAllow(t, c, key, 1)
		if !d.Allowed {
			t.Fatalf("shadow mode denied: %+v", d)
		}
		if d.WouldDeny {
			would++
		}
	}
	// A fresh region bucket may sit a hair below full, so 1 or 2 of the
	// burst of 2 are admitted.
	if would < 3 || would > 4 {
		t.Fatalf("%d of 5 would have been denied with burst 2; want 3 or 4", would)
	}
	if got := counter(t, reg, "sluice_client_decisions_total", map[string]string{"class": "shadowed", "result": "shadow_denied"}); got != float64(would) {
		t.Fatalf("shadow_denied metric %v, want %d", got, would)
	}
}

// A class the region does not know is bad input: an error carrying the
// region's reason, and nothing is left behind.
func TestClientUnknownClassIsInvalid(t *testing.T) {
	e := startRegion(t)
	c, _, _ := newClient(t, e)
	_, err := c.Allow(context.Background(), quota.Key{Tenant: "acme", Class: "nope"}, 1)
	if !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown class: %v", err)
	}
	// The region's reason comes with it.
	if !strings.Contains(err.Error(), "is not configured") {
		t.Fatalf("unknown class: %v, want the region's reason (the class is not configured)", err)
	}
	if _, err := c.Allow(context.Background(), quota.Key{Tenant: "bad tenant", Class: "read"}, 1); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("bad tenant: %v", err)
	}
	if _, err := c.Allow(context.Background(), acmeRead, 0); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("cost 0: %v", err)
	}
	if n := c.Table().Len(); n != 0 {
		t.Fatalf("client tracks %d keys after refused input", n)
	}
}

// With the region's Redis down, requests beyond the held tokens are
// decided by the local policy and marked degraded; when Redis is back the
// background Sync resumes leasing.
func TestClientDegradedWhileRedisDown(t *testing.T) {
	e := startRegion(t)
	// newClient's generous BreakerTimeout: the first request must be
	// decided from a lease, and a starved region can take longer than a
	// short wait to answer it. A stopped Redis refuses at once, so the
	// breaker still opens after two fast failures.
	c, reg, logs := newClient(t, e, func(o *lease.Options) {
		o.BreakerFailures = 2
		o.BreakerCooldown = 100 * time.Millisecond
	})
	if d := mustAllow(t, c, acmeRead, 1); !d.Allowed || d.Degraded {
		t.Fatalf("first request: %+v", d)
	}
	e.reg.Redis.Stop()
	waitFor(t, "a degraded decision", func() bool { return mustAllow(t, c, acmeRead, 1).Degraded })
	if got := metrictest.Gauge(t, reg, "sluice_client_degraded"); got != 1 {
		t.Fatalf("degraded gauge %v while Redis is down", got)
	}
	// The line may come from the background refresh that noticed first.
	waitFor(t, "a log line on entering degraded mode", func() bool { return strings.Contains(logs.String(), "degraded mode") })
	// The local policy: region 1/s burst 100 over 1 instance.
	if d := mustAllow(t, c, acmeRead, 1); !d.Degraded || !d.Allowed || d.Limit != 100 {
		t.Fatalf("local policy decision %+v", d)
	}

	e.reg.Redis.Restart()
	waitFor(t, "leasing to resume", func() bool { return c.Table().DegradedKeys() == 0 })
	if d := mustAllow(t, c, acmeRead, 1); !d.Allowed || d.Degraded {
		t.Fatalf("after recovery: %+v", d)
	}
	if got := metrictest.Gauge(t, reg, "sluice_client_degraded"); got != 0 {
		t.Fatalf("degraded gauge %v after recovery", got)
	}
	waitFor(t, "a log line on leaving degraded mode", func() bool { return strings.Contains(logs.String(), "degraded mode over") })
}

// Many goroutines on one key: the region never hands out more than its
// burst plus refill, and the instance admits exactly what it was granted
// minus what it returns.
func TestClientConcurrentAllowConservesTokens(t *testing.T) {
	e := startRegion(t)
	c, _, _ := newClient(t, e)
	var mu sync.Mutex
	allowed := 0
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				d, err := c.Allow(context.Background(), acmeRead, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					allowed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := e.regionState(t, acmeRead)
	if st.Admitted != int64(allowed) || st.Outstanding != 0 {
		t.Fatalf("client admitted %d, region counted %d used (outstanding %d)", allowed, st.Admitted, st.Outstanding)
	}
	if allowed < 100 {
		t.Fatalf("admitted only %d of 320 with a burst of 100 free", allowed)
	}
}
