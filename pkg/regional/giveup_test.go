package regional_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestCallerGivingUpIsNoRedisFailure: an instance that gives up on a call
// (its Sync timeout ended, or it is shutting down) while the script runs is
// routine, not a Redis failure: the regional service logs no WARN for it.
// (Idle keys' releases logged "redis script failed ... context canceled"
// at WARN in normal operation.)
func TestCallerGivingUpIsNoRedisFailure(t *testing.T) {
	var logs bytes.Buffer
	reg := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local", func(o *regional.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	var reports []*sluicev1.KeyReport
	for _, tenant := range []string{"a", "b", "c"} {
		if _, err := client.Acquire(context.Background(), &sluicev1.AcquireRequest{InstanceId: "i-1",
			Report: &sluicev1.KeyReport{Key: qk(tenant, "read"), Seq: 1, Lease: 1, Want: 3}}); err != nil {
			t.Fatal(err)
		}
		reports = append(reports, &sluicev1.KeyReport{Key: qk(tenant, "read"), Seq: 2, Lease: 1, Returned: 3})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the caller is gone by the time the scripts run
	if _, err := reg.Server.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: "i-1", Reports: reports}); err == nil {
		t.Fatal("a release whose caller gave up succeeded")
	}
	if _, err := reg.Server.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i-2",
		Report: &sluicev1.KeyReport{Key: qk("a", "read"), Seq: 1, Lease: 1, Want: 3}}); err == nil {
		t.Fatal("an acquire whose caller gave up succeeded")
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("a caller giving up was logged as a failure:\n%s", logs.String())
	}
}
