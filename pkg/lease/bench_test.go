package lease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// benchRegion lets one key run at far more than the hot path can spend, so
// the benchmark measures leased decisions, never the limit.
const benchRegion = `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}}
classes:
  read: {mode: lease}
tiers:
  free: {read: {rate: 100000000/s, burst: 1000000000}}
default_tier: free
`

// BenchmarkClientAllow: many goroutines on one hot key whose lease is held,
// against a real regional server (real Redis, real gRPC). A warm-up first
// builds the demand estimate, so the batches fetched in the background keep
// the pool ahead of the benchmark and no request waits for the region. The
// slow/op metric counts decisions that missed the lock-free path.
func BenchmarkClientAllow(b *testing.B) {
	reg := regiontest.Start(b, regiontest.MustConfig(b, benchRegion), "local")
	metrics := prometheus.NewRegistry()
	c, err := lease.NewClient(reg.Dial(b), lease.Options{InstanceID: "bench", BreakerTimeout: 5 * time.Second, Registerer: metrics})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	ctx := context.Background()
	key := quota.Key{Tenant: "acme", Class: "read"}
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		for range 1000 {
			if d, err := c.Allow(ctx, key, 1); err != nil || !d.Allowed {
				b.Fatalf("warm-up: %+v %v", d, err)
			}
		}
	}
	slowBefore := slowDecisions(b, metrics)
	var refused atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d, err := c.Allow(ctx, key, 1)
			if err != nil || !d.Allowed {
				refused.Add(1)
			}
		}
	})
	b.StopTimer()
	if n := refused.Load(); n > 0 {
		b.Fatalf("%d of %d requests refused: the benchmark must run on a held lease", n, b.N)
	}
	b.ReportMetric(float64(slowDecisions(b, metrics)-slowBefore)/float64(b.N), "slow/op")
}

func slowDecisions(b *testing.B, reg *prometheus.Registry) uint64 {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_client_decision_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "path" && l.GetValue() == "slow" {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

// BenchmarkXTimeRateAllow is the yardstick: x/time/rate's Limiter.Allow at
// an effectively unlimited (finite) rate, same parallel shape.
func BenchmarkXTimeRateAllow(b *testing.B) {
	lim := rate.NewLimiter(rate.Limit(1e15), 1<<30)
	var refused atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !lim.Allow() {
				refused.Add(1)
			}
		}
	})
	if n := refused.Load(); n > 0 {
		b.Fatalf("%d refused", n)
	}
}
