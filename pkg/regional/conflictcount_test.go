package regional_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestConflictingReportOfASyncIsNoDecision: a Sync whose report for one
// key conflicts with the lease another process of the same instance id
// holds is answered Aborted; the conflicting key is not counted as a
// decision (as Acquire does not count one), while the other key of the
// batch, applied, is counted once.
func TestConflictingReportOfASyncIsNoDecision(t *testing.T) {
	metrics := prometheus.NewRegistry()
	reg := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local",
		func(o *regional.Options) { o.Registerer = metrics })
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()
	decisions := func(result string) float64 {
		return metrictest.Series(t, metrics, "sluice_regional_decisions_total",
			map[string]string{"class": "read", "tier": "free", "result": result})
	}
	if _, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "shared", Incarnation: 1,
		Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Lease: 1, Want: 1}}); err != nil {
		t.Fatal(err)
	}
	_, err := client.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "shared", Incarnation: 2,
		Reports: []*sluicev1.KeyReport{
			{Key: qk("acme", "read"), Seq: 2, Lease: 1, Want: 1},
			{Key: qk("other", "read"), Seq: 1, Want: 1},
		}})
	if status.Code(err) != codes.Aborted {
		t.Fatalf("sync by another process: %v, want Aborted", err)
	}
	if g, e := decisions("granted"), decisions("empty"); g != 2 || e != 0 {
		t.Errorf("decisions: %v granted and %v empty, want 2 and 0 (the conflicting report uncounted)", g, e)
	}
}
