package regional_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestASingleTokenGivenBackIsCountedReturned: the tokens a report gives
// back in an Acquire or a Sync are counted as they go back to the bucket,
// however few: one token given back counts one, and the next token two.
// Refills are an hour per token, so no bucket refills during the test.
func TestASingleTokenGivenBackIsCountedReturned(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := regiontest.Start(t, regiontest.MustConfig(t, `
lease_ttl: 1m
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {free: {read: {rate: 1/h, burst: 100}}}
default_tier: free
`), "local", func(o *regional.Options) { o.Registerer = reg })
	client := sluicev1.NewLeaseServiceClient(r.Dial(t))
	ctx := context.Background()
	returned := func() float64 { return metrictest.Series(t, reg, "sluice_regional_returned_tokens_total", nil) }
	report := func(seq uint64, returned, want int64) *sluicev1.KeyReport {
		return &sluicev1.KeyReport{Key: qk("acme", "read"), Lease: 1, Seq: seq, Returned: returned, Want: want}
	}

	resp, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i-1", Report: report(1, 0, 10)})
	if err != nil || resp.GetGrant().GetGranted() != 10 {
		t.Fatalf("acquire of 10: %v, %v", resp, err)
	}
	if _, err := client.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "i-1", Reports: []*sluicev1.KeyReport{report(2, 1, 0)}}); err != nil {
		t.Fatal(err)
	}
	if got := returned(); got != 1 {
		t.Fatalf("returned tokens %v after a Sync gave back one, want 1", got)
	}
	if _, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i-1", Report: report(3, 2, 0)}); err != nil {
		t.Fatal(err)
	}
	if got := returned(); got != 2 {
		t.Fatalf("returned tokens %v after an Acquire gave back one more, want 2", got)
	}
}
