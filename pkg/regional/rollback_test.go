package regional_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestRedisRolledBackUnderLeasesHandsOutNoBurst: a real regional daemon
// and real redis-server; three instances spend one key (20/s, burst 40)
// flat out and hold leases on it; Redis is saved, the instances go on for
// 1.5s, and Redis is killed and restarted from that older snapshot on the
// same address, its born sentinel intact. The first call that finds the
// data set's write generation below the one the process saw re-births it,
// so over every interval the instances admit at most b + r·t, and the
// loss is counted once in sluice_regional_redis_data_losses_total. (Before
// the generation, the restored bucket refilled the 1.5s it had already
// handed out: 31-37 tokens over, nothing counted.)
func TestRedisRolledBackUnderLeasesHandsOutNoBurst(t *testing.T) {
	// Mostly waits out lease TTLs and a restart of its own Redis: it runs
	// beside the package's other parallel tests.
	t.Parallel()
	rs, d, cfg := startSnapshottingRegion(t)
	ctx := context.Background()
	rdb := rs.Client()
	reg := &regiontest.Region{Addr: d.GRPCAddr()}
	key := quota.Key{Tenant: "acme", Class: "closed"}
	const r, b = 20.0, 40.0

	load := startClosedLoad(t, reg, key)
	// Saturate: the burst is gone and the instances hold leases.
	load.waitFor(t, int(b)+10)
	if err := rdb.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// More leases taken and spent after the snapshot: about 1.5s of the
	// key's rate, which the snapshot does not know was handed out.
	load.waitFor(t, load.count()+int(1.5*r))
	rs.Restart() // kill -9, then start from the saved RDB
	restarted := time.Now()
	// Run on for one lease TTL after the rollback: every lease issued
	// before it has ended by then.
	<-time.After(time.Duration(cfg.LeaseTTL) + 500*time.Millisecond)
	admitted := load.finish()
	excess := worstExcess(admitted, r, b)
	t.Logf("admitted %d, %d after the rollback; worst interval exceeds b + r·t by %.1f tokens", len(admitted), admittedAfter(admitted, restarted), excess)
	if excess > 0 {
		t.Errorf("over some interval the instances admitted %.1f tokens more than b + r·t: the rolled-back Redis handed out a burst", excess)
	}
	// Counted at the guard's next check (every epoch; a starved machine
	// checks late, so many epochs are allowed).
	// Counted once. Whether also as a rollback depends on who re-birthed
	// the data set: a request's call whose reply was dropped (its caller
	// gave up on a starved machine) leaves the guard only the renewed
	// sentinel to see (TestRollbackWithNoCallInFlightIsCountedAsOne counts
	// the label).
	if losses, rollbacks := awaitDataLoss(t, d, cfg, 0); losses != 1 || rollbacks > 1 {
		t.Errorf("sluice_regional_redis_data_losses_total = %v, sluice_regional_redis_rollbacks_total = %v after the rollback, want 1 and at most 1", losses, rollbacks)
	}
}

// TestRollbackWithNoCallInFlightIsCountedAsOne: Redis restored from an
// older snapshot while no instance calls: the guard's own epoch check finds
// the generation behind, re-births the data set and counts one data loss,
// labelled a rollback (sluice_regional_redis_rollbacks_total).
func TestRollbackWithNoCallInFlightIsCountedAsOne(t *testing.T) {
	t.Parallel()
	rs, d, cfg := startSnapshottingRegion(t)
	ctx := context.Background()
	rdb := rs.Client()
	reg := &regiontest.Region{Addr: d.GRPCAddr()}
	c := newClient(t, reg, "i-0", lease.Options{})
	key := quota.Key{Tenant: "acme", Class: "closed"}
	spend := func() {
		t.Helper()
		if _, err := c.Allow(ctx, key, 1); err != nil {
			t.Fatal(err)
		}
	}
	spend()
	if err := rdb.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	spend() // a lease, and so a generation, the snapshot does not have
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rs.Restart() // kill -9, then start from the saved RDB
	if losses, rollbacks := awaitDataLoss(t, d, cfg, 1); losses != 1 || rollbacks != 1 {
		t.Errorf("sluice_regional_redis_data_losses_total = %v, sluice_regional_redis_rollbacks_total = %v after the rollback, want 1 and 1", losses, rollbacks)
	}
}

// startSnapshottingRegion starts a redis-server that saves its snapshots
// in a directory of its own (so a restart restores the last one) and an
// unleased regional daemon on it, under restartUnderLeases. Its data set
// is marked as in service long before the test (born 0, trusted full), so
// a load starts on full buckets.
func startSnapshottingRegion(t *testing.T) (*redistest.Server, *regional.Daemon, *config.Config) {
	t.Helper()
	rs := redistest.StartWith(t, "--dir", t.TempDir())
	cfg := regiontest.MustConfig(t, restartUnderLeases)
	ctx := context.Background()
	if err := rs.Client().Set(ctx, luascripts.DefaultPrefix+"born", "0", 0).Err(); err != nil {
		t.Fatal(err)
	}
	d, err := regional.StartDaemon(ctx, regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: rs.Addr(),
		Config: regional.StaticConfig{C: cfg}, Unleased: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return rs, d, cfg
}

// awaitDataLoss polls d's registry until sluice_regional_redis_data_losses_total
// counts a loss and sluice_regional_redis_rollbacks_total at least
// rollbacks, within 30 epochs of cfg (the guard checks once an epoch; a
// starved machine checks late; a rollback whose re-birth a check read before
// the reply of the call that made it is labelled at the check after), and
// returns both.
func awaitDataLoss(t *testing.T, d *regional.Daemon, cfg *config.Config, rollbacks float64) (float64, float64) {
	t.Helper()
	read := func(name string) float64 { return metrictest.Series(t, d.Registry, name, nil) }
	losses := func() float64 { return read("sluice_regional_redis_data_losses_total") }
	labelled := func() float64 { return read("sluice_regional_redis_rollbacks_total") }
	for deadline := time.Now().Add(30 * time.Duration(cfg.Epoch)); (losses() < 1 || labelled() < rollbacks) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // polling the guard's epoch check with a deadline
	}
	return losses(), labelled()
}
