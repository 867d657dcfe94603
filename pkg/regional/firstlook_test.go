package regional_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestColdStartFullFirstLookThatTimedOutIsMadeBeforeTheFirstCall: under
// -cold-start full, the restart guard's look at start did not answer (its
// Redis held writes past the client's timeout: a slow machine). The first
// call then makes that look before its script runs: the fresh Redis's
// sentinel is stamped trusted (0) and the first lease gets the whole
// burst. Without it, the call's script wrote a birth of now and the
// bucket started empty for a restart wait (granted 0), as for a Redis
// lost while the process runs.
func TestColdStartFullFirstLookThatTimedOutIsMadeBeforeTheFirstCall(t *testing.T) {
	ctx := context.Background()
	rs, rdb, admin, g := firstLookTimedOut(t)

	reg := regiontest.StartOn(t, rs, regiontest.MustConfig(t, oneRegion), "local", func(o *regional.Options) {
		o.Guard, o.Redis = g, rdb
	})
	resp, err := sluicev1.NewLeaseServiceClient(reg.Dial(t)).Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i-1",
		Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Lease: 1, Want: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if n := resp.GetGrant().GetGranted(); n != 100 {
		t.Fatalf("first lease on a fresh Redis under -cold-start full, the look at start having timed out: granted %d, want the burst 100", n)
	}
	if v, err := admin.Get(ctx, luascripts.DefaultPrefix+"born").Result(); err != nil || v != "0" {
		t.Fatalf("sentinel after the first call: %q, %v; want 0 (trusted to start full)", v, err)
	}
	if !g.Looked() {
		t.Fatal("the guard has not made its first look after the first call")
	}
}

// firstLookTimedOut starts a redis-server and a -cold-start full restart
// guard whose look at start timed out: Redis held every write (a script
// call is one) for longer than the client waits, then answered again. It
// returns the server, the client the guard looked through (200 ms
// timeouts, no retries), a client of its own for the test, and the guard.
func firstLookTimedOut(t *testing.T) (*redistest.Server, *redis.Client, *redis.Client, *regional.RestartGuard) {
	t.Helper()
	ctx := context.Background()
	rs := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	admin := rs.Client()
	t.Cleanup(func() { admin.Close() })
	if err := rdb.Ping(ctx).Err(); err != nil { // connected before the pause
		t.Fatal(err)
	}

	g := regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartFull, nil)
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	err := g.Check(ctx, rdb)
	if uerr := admin.Do(ctx, "CLIENT", "UNPAUSE").Err(); uerr != nil {
		t.Fatalf("CLIENT UNPAUSE: %v", uerr)
	}
	if err == nil {
		t.Fatal("the look at start answered through a Redis holding writes; the fault was not injected")
	}
	if g.Looked() {
		t.Fatal("the guard counts a look that timed out as made")
	}
	if n, err := admin.Exists(ctx, luascripts.DefaultPrefix+"born").Result(); err != nil || n != 0 {
		t.Fatalf("sentinel after the look that timed out: exists %d, %v; want missing", n, err)
	}
	return rs, rdb, admin, g
}

// TestColdStartFullFirstLookThatAnswersLogsNoFailure: the first call's
// look, made before its script once the look at start timed out, answers;
// even at debug level nothing says it failed.
func TestColdStartFullFirstLookThatAnswersLogsNoFailure(t *testing.T) {
	ctx := context.Background()
	rs, rdb, _, g := firstLookTimedOut(t)
	logs := &logtest.Buffer{}
	reg := regiontest.StartOn(t, rs, regiontest.MustConfig(t, oneRegion), "local", func(o *regional.Options) {
		o.Guard, o.Redis = g, rdb
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	if _, err := sluicev1.NewLeaseServiceClient(reg.Dial(t)).Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i-1",
		Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Lease: 1, Want: 100}}); err != nil {
		t.Fatal(err)
	}
	if !g.Looked() {
		t.Fatal("the guard has not made its first look after the first call")
	}
	if n := logs.Count("first look failed"); n != 0 {
		t.Errorf("a first look that answered logged %d failures:\n%s", n, logs.String())
	}
}
