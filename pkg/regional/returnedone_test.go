package regional_test

import (
	"context"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/metrictest"
)

// TestASingleTokenGivenBackIsCountedReturned: the tokens a report gives
// back in an Acquire or a Sync are counted as they go back to the bucket,
// however few: one token given back counts one, and the next token two.
// Refills are an hour per token, so no bucket refills during the test.
func TestASingleTokenGivenBackIsCountedReturned(t *testing.T) {
	_, _, reg, client := hourlyRegion(t, "lease_ttl: 1m")
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
