package regional_test

import (
	"context"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestDaemonServesHealthMetricsAndDrains runs the whole regional process:
// gRPC health turns SERVING once Redis answers, /metrics exposes the
// series, and Stop drains (health NOT_SERVING, listener closed).
func TestDaemonServesHealthMetricsAndDrains(t *testing.T) {
	rs := redistest.Start(t)
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RedisAddr: rs.Addr(),
		Config: regional.StaticConfig{C: regiontest.MustConfig(t, oneRegion)}, ColdStart: regional.ColdStartFull,
		Unleased: true, // no global tier: static shares unconditional
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	conn := regiontest.Dial(t, d.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(conn)
	for {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("never SERVING: %v %v", resp, err)
		}
		time.Sleep(20 * time.Millisecond) // polling readiness with a deadline
	}
	lease := sluicev1.NewLeaseServiceClient(conn)
	g, err := lease.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i1",
		Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Want: 10}})
	if err != nil || g.Grant.Granted != 10 {
		t.Fatalf("acquire: %v %v", g, err)
	}
	body := scrape(t, d)
	for _, m := range []string{
		`sluice_regional_requests_total{code="OK",method="Acquire"} 1`,
		`sluice_regional_decisions_total{class="read",result="granted",tier="free"} 1`,
		`sluice_regional_granted_tokens_total{class="read",tier="free"} 10`,
		"sluice_regional_lua_duration_seconds_bucket",
		"sluice_regional_active_leases 1",
	} {
		if !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %q", m)
		}
	}
	d.Stop()
	if _, err := lease.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i1",
		Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 2, Want: 10}}); err == nil {
		t.Fatal("stopped daemon still answers")
	}
}
