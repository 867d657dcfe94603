package regional_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestDecisionMetricsCountEachOutcome: every lease request that wants
// tokens is counted once by its result (granted, or empty when nothing
// could be granted) with the tokens it got; a retry of an applied report
// and a report that wants nothing are not counted. Every strict check is
// counted as allowed or denied, a denial in a shadow class as
// shadow_denied. Tokens an instance releases, and the unspent tokens of a
// lease that expired (however few: one here), are counted as they return
// to the bucket.
// Refills are an hour per token, so no bucket refills during the test.
func TestDecisionMetricsCountEachOutcome(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := regiontest.Start(t, regiontest.MustConfig(t, `
lease_ttl: 1s
refresh: 200ms
regions: {local: {weight: 1}}
classes:
  read:   {mode: lease}
  export: {mode: strict}
  trial:  {mode: strict, shadow: true}
tiers:
  free: {read: {rate: 1/h, burst: 100}, export: {rate: 1/h, burst: 20}, trial: {rate: 1/h, burst: 20}}
default_tier: free
`), "local", func(o *regional.Options) { o.Registerer = reg })
	client := sluicev1.NewLeaseServiceClient(r.Dial(t))
	ctx := context.Background()
	decisions := func(class, result string) float64 {
		return metrictest.Series(t, reg, "sluice_regional_decisions_total", map[string]string{"class": class, "tier": "free", "result": result})
	}
	granted := func() float64 {
		return metrictest.Series(t, reg, "sluice_regional_granted_tokens_total", map[string]string{"class": "read", "tier": "free"})
	}
	acquire := func(instance, tenant string, seq uint64, want, min int64) int64 {
		t.Helper()
		resp, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: instance,
			Report: &sluicev1.KeyReport{Key: qk(tenant, "read"), Seq: seq, Want: want, Min: min}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetGrant().GetGranted()
	}
	check := func(class string, cost int64) bool {
		t.Helper()
		resp, err := client.Check(ctx, &sluicev1.CheckRequest{Key: qk("acme", class), Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAllowed()
	}

	if got := acquire("i1", "acme", 1, 60, 0); got != 60 {
		t.Fatalf("granted %d, want 60", got)
	}
	if got := acquire("i1", "acme", 1, 60, 0); got != 60 { // a retry
		t.Fatalf("the retry was granted %d, want the 60 applied", got)
	}
	acquire("i2", "acme", 1, 0, 0) // wants nothing
	if got := acquire("i3", "acme", 1, 30, 0); got != 30 {
		t.Fatalf("granted %d, want 30", got)
	}
	if got := acquire("i4", "acme", 1, 50, 50); got != 0 {
		t.Fatalf("granted %d of a bucket of 10 to a min of 50, want 0", got)
	}
	if g, e := decisions("read", "granted"), decisions("read", "empty"); g != 2 || e != 1 {
		t.Errorf("lease decisions: %v granted and %v empty, want 2 and 1 (the retry and the report wanting nothing uncounted)", g, e)
	}
	if got := granted(); got != 90 {
		t.Errorf("granted tokens %v, want 90", got)
	}

	// Two checks of cost 10 fit the burst of 20, the third does not. A
	// shadow class's verdicts are the real ones (the client admits): its
	// denial is counted as shadow_denied.
	for _, class := range []string{"export", "trial"} {
		if !check(class, 10) || !check(class, 10) || check(class, 10) {
			t.Fatalf("%s: the burst of 20 admitted other than two checks of cost 10", class)
		}
	}
	for _, c := range []struct {
		class, result string
		want          float64
	}{
		{"export", "allowed", 2}, {"export", "denied", 1}, {"export", "shadow_denied", 0},
		{"trial", "allowed", 2}, {"trial", "denied", 0}, {"trial", "shadow_denied", 1},
	} {
		if got := decisions(c.class, c.result); got != c.want {
			t.Errorf("%s checks counted %s: %v, want %v", c.class, c.result, got, c.want)
		}
	}

	rel, err := client.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: "i1",
		Reports: []*sluicev1.KeyReport{{Key: qk("acme", "read"), Seq: 2, Used: 10, Returned: 50}}})
	if err != nil || rel.GetReturned() != 50 {
		t.Fatalf("release: %v, %v; want 50 returned", rel, err)
	}
	if got := metrictest.Series(t, reg, "sluice_regional_released_tokens_total", nil); got != 50 {
		t.Errorf("released tokens %v, want 50", got)
	}

	// A lease of one token whose instance goes away: once its TTL passed,
	// the next call on its key reaps it and counts the token reclaimed.
	if got := acquire("gone", "solo", 1, 1, 0); got != 1 {
		t.Fatalf("granted %d, want 1", got)
	}
	if g, got := decisions("read", "granted"), granted(); g != 3 || got != 91 {
		t.Errorf("a grant of one token: %v lease grants counting %v tokens, want 3 counting 91", g, got)
	}
	ttl := time.Duration(r.Server.ConfigForTest().LeaseTTL)
	deadline := time.Now().Add(10 * ttl)
	for seq := uint64(1); metrictest.Series(t, reg, "sluice_regional_reclaimed_tokens_total", nil) == 0; seq++ {
		if time.Now().After(deadline) {
			t.Fatalf("no token counted reclaimed %v after the lease was taken (TTL %v)", 10*ttl, ttl)
		}
		acquire("poll", "solo", seq, 0, 0)
		time.Sleep(ttl / 20) // polling the reaper with a deadline
	}
	if got := metrictest.Series(t, reg, "sluice_regional_reclaimed_tokens_total", nil); got != 1 {
		t.Errorf("reclaimed tokens %v, want the lease's 1", got)
	}

	// The same through a strict check on a lease key: a check reaps too.
	if got := acquire("gone", "duo", 1, 1, 0); got != 1 {
		t.Fatalf("granted %d, want 1", got)
	}
	deadline = time.Now().Add(10 * ttl)
	for metrictest.Series(t, reg, "sluice_regional_reclaimed_tokens_total", nil) == 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no check counted a token reclaimed %v after the lease was taken (TTL %v)", 10*ttl, ttl)
		}
		if _, err := client.Check(ctx, &sluicev1.CheckRequest{Key: qk("duo", "read"), Cost: 1}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(ttl / 20) // polling the reaper with a deadline
	}
	if got := metrictest.Series(t, reg, "sluice_regional_reclaimed_tokens_total", nil); got != 2 {
		t.Errorf("reclaimed tokens %v, want the two leases' 2", got)
	}
}

// TestEmptySyncAndReleaseRunNoScript: a Sync or a Release with no
// reports is answered with nothing and runs no script (no script latency
// is observed for it).
func TestEmptySyncAndReleaseRunNoScript(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local", func(o *regional.Options) { o.Registerer = reg })
	ctx := context.Background()
	sr, err := r.Server.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "i-1"})
	if err != nil || len(sr.GetGrants()) != 0 {
		t.Fatalf("empty sync: %v, %v; want no grants", sr, err)
	}
	rr, err := r.Server.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: "i-1"})
	if err != nil || rr.GetReturned() != 0 {
		t.Fatalf("empty release: %v, %v; want nothing returned", rr, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_regional_lua_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if n := m.GetHistogram().GetSampleCount(); n != 0 {
				t.Errorf("script latency observed %d times (%v) for calls with no reports", n, m.GetLabel())
			}
		}
	}
}
