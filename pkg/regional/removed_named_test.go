package regional_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestOnlyTheReplicasOwnRegionRemovedIsRefused: a replica refuses requests
// when the live config no longer lists its own region, whatever that
// region is called, and keeps answering when another region is removed
// (docs/operations.md, "Remove a region for good": its replicas refuse
// every request once they adopt a config without it). Both are judged for
// a replica of "far" next to a region "local", so the check must read the
// replica's own name.
func TestOnlyTheReplicasOwnRegionRemovedIsRefused(t *testing.T) {
	const twoRegions = `
lease_ttl: 1s
refresh: 200ms
regions: {local: {weight: 1}, far: {weight: 1}}
classes:
  read: {mode: lease, on_failure: closed}
tiers:
  free: {read: {rate: 10/s, burst: 100}}
default_tier: free
`
	for _, tc := range []struct {
		name, remove string
		refused      bool
	}{
		{"its own region removed", ", far: {weight: 1}", true},
		{"the other region removed", "local: {weight: 1}, ", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			with := regiontest.MustConfig(t, twoRegions)
			var src regiontest.SwappedConfig
			src.Store(with)
			reg := regiontest.Start(t, with, "far", func(o *regional.Options) { o.Config = &src })
			src.Store(regiontest.MustConfig(t, strings.Replace(twoRegions, tc.remove, "", 1)))

			rpc := sluicev1.NewLeaseServiceClient(reg.Dial(t))
			resp, err := rpc.Acquire(context.Background(), &sluicev1.AcquireRequest{InstanceId: "i1", Incarnation: 1,
				Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Lease: 1, Want: 5}})
			if tc.refused {
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), `region "far" is not in the live config`) {
					t.Fatalf("Acquire in a replica whose region was removed: %v, want FailedPrecondition naming region far", err)
				}
				return
			}
			if err != nil || resp.GetGrant().GetGranted() != 5 {
				t.Fatalf("Acquire in a replica whose region is still configured: %v, %v; want 5 granted", resp, err)
			}
		})
	}
}
