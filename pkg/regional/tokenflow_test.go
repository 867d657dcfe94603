package regional_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// hourlyRegion starts a region whose one class, read, is leased and
// refilled an hour per token (burst 100), so no bucket refills during a
// test; lease holds its lease_ttl (and refresh) lines. Its metrics go to
// the returned registry.
func hourlyRegion(t *testing.T, lease string) (*regiontest.Region, *config.Config, *prometheus.Registry, sluicev1.LeaseServiceClient) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := regiontest.MustConfig(t, lease+`
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {free: {read: {rate: 1/h, burst: 100}}}
default_tier: free
`)
	r := regiontest.Start(t, cfg, "local", func(o *regional.Options) { o.Registerer = reg })
	return r, cfg, reg, sluicev1.NewLeaseServiceClient(r.Dial(t))
}

// TestGrantedTokensAreAllAccountedFor: every token the region grants is
// admitted (a report's used), released, returned in an Acquire's or a
// Sync's report (an instance giving back a pool above its batch cap),
// reclaimed from an expired lease, or still out in a live lease; the
// metrics and the region's state add up to the granted total. A retried
// Sync counts nothing twice, and a report returning more than its lease
// shows unspent counts only what went back. The tokens given back on Sync
// were counted nowhere: granted rose above the sum of the others with no
// lease out.
// Refills are an hour per token, so no bucket refills during the test.
func TestGrantedTokensAreAllAccountedFor(t *testing.T) {
	r, cfg, reg, client := hourlyRegion(t, "lease_ttl: 1s\nrefresh: 200ms")
	ctx := context.Background()
	key := quota.Key{Tenant: "acme", Class: "read"}
	report := func(seq uint64, used, returned, want int64) *sluicev1.KeyReport {
		return &sluicev1.KeyReport{Key: qk(key.Tenant, key.Class), Lease: 1, Seq: seq, Used: used, Returned: returned, Want: want}
	}
	acquire := func(instance string, want int64) {
		t.Helper()
		resp, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: instance, Report: report(1, 0, 0, want)})
		if err != nil || resp.GetGrant().GetGranted() != want {
			t.Fatalf("%s acquire of %d: %v, %v", instance, want, resp, err)
		}
	}
	sync := func(instance string, rep *sluicev1.KeyReport) {
		t.Helper()
		if _, err := client.Sync(ctx, &sluicev1.SyncRequest{InstanceId: instance, Reports: []*sluicev1.KeyReport{rep}}); err != nil {
			t.Fatalf("%s sync: %v", instance, err)
		}
	}
	counter := func(name string) int64 {
		if name == "sluice_regional_granted_tokens_total" {
			return int64(metrictest.Series(t, reg, name, map[string]string{"class": "read", "tier": "free"}))
		}
		return int64(metrictest.Series(t, reg, name, nil))
	}

	acquire("a", 60)
	// a spends 10 and gives back 20 of its pool, then (the same report
	// again, a retry) nothing more; then 5 more spent, 5 more given back
	// and 5 taken.
	sync("a", report(2, 10, 20, 0))
	sync("a", report(2, 10, 20, 0))
	sync("a", report(3, 15, 25, 5))
	acquire("b", 10)
	// b spends 3 and gives back more than its lease holds: only the 7
	// unspent tokens go back.
	sync("b", report(2, 3, 50, 0))
	acquire("c", 8)
	if _, err := client.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: "c",
		Reports: []*sluicev1.KeyReport{report(2, 2, 0, 0)}}); err != nil {
		t.Fatal(err)
	}
	// d takes 4 tokens and is never heard from again: reaped once its
	// TTL passed, by the next call on the key. a and b keep reporting, so
	// their leases live on.
	acquire("d", 4)
	ttl := time.Duration(cfg.LeaseTTL)
	deadline := time.Now().Add(10 * ttl)
	for seq := uint64(4); counter("sluice_regional_reclaimed_tokens_total") == 0; seq++ {
		if time.Now().After(deadline) {
			t.Fatalf("d's lease was not reclaimed %v after it was taken (TTL %v)", 10*ttl, ttl)
		}
		sync("a", report(seq, 15, 25, 0))
		sync("b", report(seq, 3, 50, 0))
		time.Sleep(ttl / 20) // polling the reaper with a deadline
	}

	keys, common, _, err := r.Server.CommonFor(cfg, key)
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.Server.Scripts().State(ctx, r.RDB, keys, common)
	if err != nil {
		t.Fatal(err)
	}
	granted := counter("sluice_regional_granted_tokens_total")
	released := counter("sluice_regional_released_tokens_total")
	returned := counter("sluice_regional_returned_tokens_total")
	reclaimed := counter("sluice_regional_reclaimed_tokens_total")
	t.Logf("granted %d: admitted %d, released %d, returned %d, reclaimed %d, out %d",
		granted, st.Admitted, released, returned, reclaimed, st.Outstanding)
	for _, c := range []struct {
		what      string
		got, want int64
	}{
		{"granted", granted, 60 + 5 + 10 + 8 + 4},
		{"admitted", st.Admitted, 15 + 3 + 2},
		{"released", released, 6},
		{"returned", returned, 25 + 7},
		// d's 4, and a's 25 unless a machine too loaded for a's reports
		// to keep its lease let the region reap it too.
		{"reclaimed and out", reclaimed + st.Outstanding, 4 + 65 - 15 - 25},
		{"granted less every flow", granted - (st.Admitted + released + returned + reclaimed + st.Outstanding), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.what, c.got, c.want)
		}
	}
}
