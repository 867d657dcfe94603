package regional_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestOneCallReapsEightExpiredLeasesByDefault: a server given no
// ReapBudget has each script call reap at most 8 expired leases (the
// documented default), oldest first, so the work of one call stays bounded
// however many instances left a key without releasing it. Ten leases of
// one token expire with nothing calling on the key (this region has no
// leader and no Run loop, which would reap them too); one Check then
// reaps 8 of them and leaves 2 records, and the next reaps the rest.
// Refills are an hour per token, so no bucket refills during the test.
func TestOneCallReapsEightExpiredLeasesByDefault(t *testing.T) {
	r, cfg, reg, client := hourlyRegion(t, "lease_ttl: 1s\nrefresh: 200ms")
	ctx := context.Background()
	key := quota.Key{Tenant: "acme", Class: "read"}
	keys, _, _, err := r.Server.CommonFor(cfg, key)
	if err != nil {
		t.Fatal(err)
	}
	const leases = 10
	for i := range leases {
		resp, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "gone-" + string(rune('a'+i)),
			Report: &sluicev1.KeyReport{Key: qk(key.Tenant, key.Class), Seq: 1, Want: 1, Min: 1}})
		if err != nil || resp.GetGrant().GetGranted() != 1 {
			t.Fatalf("acquire %d: %v, %v", i, resp, err)
		}
	}
	// Plain reads (HGET, ZRANGE, TIME) reap nothing: wait, on the Redis
	// clock the leases' expiries are on, until the last one has passed.
	// The bucket counts its lease records in n (lib.lua, "Layouts").
	records := func() int64 {
		t.Helper()
		n, err := r.RDB.HGet(ctx, keys.Bucket, "n").Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return n
	}
	if n := records(); n != leases {
		t.Fatalf("%d lease records after %d acquires, want %d", n, leases, leases)
	}
	last, err := r.RDB.ZRangeWithScores(ctx, keys.Expiry, -1, -1).Result()
	if err != nil || len(last) != 1 {
		t.Fatalf("the latest lease expiry: %v, %v", last, err)
	}
	ttl := time.Duration(cfg.LeaseTTL)
	deadline := time.Now().Add(10 * ttl)
	for {
		now, err := r.RDB.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if float64(now.UnixMicro()) > last[0].Score {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis time %v still not past the last lease's expiry %.0f µs %v after the acquires (TTL %v)",
				now.UnixMicro(), last[0].Score, 10*ttl, ttl)
		}
		time.Sleep(ttl / 20) // polling the Redis clock with a deadline
	}

	reclaimed := func() float64 { return metrictest.Series(t, reg, "sluice_regional_reclaimed_tokens_total", nil) }
	check := func() {
		t.Helper()
		if _, err := client.Check(ctx, &sluicev1.CheckRequest{Key: qk(key.Tenant, key.Class), Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	check()
	if n, got := records(), reclaimed(); n != 2 || got != 8 {
		t.Fatalf("one call left %d lease records and reclaimed %v tokens, want 2 left and 8 reclaimed (the default budget of 8)", n, got)
	}
	check()
	if n, got := records(), reclaimed(); n != 0 || got != leases {
		t.Fatalf("a second call left %d lease records, %v tokens reclaimed in all; want none left and %d reclaimed", n, got, leases)
	}
}
