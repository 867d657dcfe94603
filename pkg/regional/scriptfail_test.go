package regional_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/regional/rpcerr"
)

// TestScriptFailuresMapToTheirCodes: each LeaseService call answers a
// failed script with a status an instance can act on: Unavailable when
// the script fails in Redis (here its key's bucket holds a value of
// another type), saying so (rpcerr.RedisFailed: the service answered),
// counted as a Redis error of its script; Canceled or
// DeadlineExceeded when the caller gave up first, not counted as a Redis
// error.
func TestScriptFailuresMapToTheirCodes(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local", func(o *regional.Options) { o.Registerer = reg })
	tenant := "acme"
	report := func(seq uint64) *sluicev1.KeyReport {
		return &sluicev1.KeyReport{Key: qk(tenant, "read"), Seq: seq, Want: 1}
	}
	calls := []struct {
		script string
		call   func(ctx context.Context) error
	}{
		{"acquire", func(ctx context.Context) error {
			_, err := r.Server.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i-1", Report: report(1)})
			return err
		}},
		{"sync", func(ctx context.Context) error {
			_, err := r.Server.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "i-1", Reports: []*sluicev1.KeyReport{report(2)}})
			return err
		}},
		{"release", func(ctx context.Context) error {
			_, err := r.Server.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: "i-1", Reports: []*sluicev1.KeyReport{report(3)}})
			return err
		}},
		{"check", func(ctx context.Context) error {
			_, err := r.Server.Check(ctx, &sluicev1.CheckRequest{Key: qk(tenant, "export"), Cost: 1})
			return err
		}},
	}
	redisErrors := func(script string) float64 {
		return metrictest.Series(t, reg, "sluice_regional_redis_errors_total", map[string]string{"script": script})
	}

	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancelExpired := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelExpired()
	for _, c := range calls {
		if err := c.call(canceled); status.Code(err) != codes.Canceled || rpcerr.RedisFailed(err) {
			t.Errorf("%s by a caller gone: %v (Redis failed: %v), want Canceled", c.script, err, rpcerr.RedisFailed(err))
		}
		if err := c.call(expired); status.Code(err) != codes.DeadlineExceeded || rpcerr.RedisFailed(err) {
			t.Errorf("%s by a caller past its deadline: %v (Redis failed: %v), want DeadlineExceeded", c.script, err, rpcerr.RedisFailed(err))
		}
		if n := redisErrors(c.script); n != 0 {
			t.Errorf("%s: a caller giving up counted %v Redis errors", c.script, n)
		}
	}

	tenant = "broken"
	rdb := r.Redis.Client()
	for _, class := range []string{"read", "export"} {
		keys, _, _, err := r.Server.CommonFor(r.Server.ConfigForTest(), quota.Key{Tenant: tenant, Class: class})
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.RPush(context.Background(), keys.Bucket, "not a bucket").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range calls {
		if err := c.call(context.Background()); status.Code(err) != codes.Unavailable || !rpcerr.RedisFailed(err) {
			t.Errorf("%s failing in Redis: %v, want Unavailable saying Redis failed", c.script, err)
		}
		if n := redisErrors(c.script); n != 1 {
			t.Errorf("%s failing in Redis: %v Redis errors counted, want 1", c.script, n)
		}
	}
}

// TestRedisThatStopsAnsweringIsAnOutage: when Redis stops answering
// (SIGSTOP of the real redis-server) a LeaseService call ends at the
// server's own bound on Redis (RedisTimeout, the client's timeouts) while
// the caller's deadline is far away. That is Redis failing, not the caller giving up:
// the answer is Unavailable (an instance's failure policy applies) and the
// call counts as a Redis error of its script.
func TestRedisThatStopsAnsweringIsAnOutage(t *testing.T) {
	// Mostly waits on a paused Redis of its own: it runs beside the
	// package's other parallel tests.
	t.Parallel()
	reg := prometheus.NewRegistry()
	const bound = 100 * time.Millisecond
	r := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local", func(o *regional.Options) {
		o.Registerer = reg
		o.RedisTimeout = bound
	})
	report := func(seq uint64) *sluicev1.KeyReport {
		return &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: seq, Want: 1}
	}
	calls := []struct {
		script string
		call   func(ctx context.Context) error
	}{
		{"acquire", func(ctx context.Context) error {
			_, err := r.Server.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i-1", Report: report(1)})
			return err
		}},
		{"check", func(ctx context.Context) error {
			_, err := r.Server.Check(ctx, &sluicev1.CheckRequest{Key: qk("acme", "export"), Cost: 1})
			return err
		}},
	}
	r.Redis.Pause()
	defer r.Redis.Resume()
	for _, c := range calls {
		// The caller would wait far longer than the server's bound: a
		// call that ends ends on the server's side.
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		err := c.call(ctx)
		callerDone := ctx.Err()
		cancel()
		if callerDone != nil {
			t.Fatalf("%s: the caller's hour ran out", c.script)
		}
		if got := status.Code(err); got != codes.Unavailable || !rpcerr.RedisFailed(err) {
			t.Errorf("%s against a Redis that does not answer: %v (%v), want Unavailable saying Redis failed", c.script, got, err)
		}
		if n := metrictest.Series(t, reg, "sluice_regional_redis_errors_total", map[string]string{"script": c.script}); n != 1 {
			t.Errorf("%s against a Redis that does not answer: %v Redis errors counted, want 1", c.script, n)
		}
	}
}
