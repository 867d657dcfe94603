package regional_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestRestartGuardCountsEachDataLoss: a guard counts one restart for each
// look that finds its sentinel missing or holding another birth than the
// one it last saw, and none for its first look or a look that finds the
// sentinel as it left it.
func TestRestartGuardCountsEachDataLoss(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	t.Cleanup(func() { rdb.Close() })
	born := luascripts.DefaultPrefix + "born"
	g := regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartConservative, slog.New(slog.DiscardHandler))
	for _, step := range []struct {
		name     string
		before   func() error
		restarts int64
	}{
		{"the first look stamps an empty Redis", nil, 0},
		{"the sentinel as the guard left it", nil, 0},
		{"the data set lost", func() error { return rdb.FlushAll(ctx).Err() }, 1},
		{"the new sentinel as the guard stamped it", nil, 1},
		{"another birth stamped behind the guard's back", func() error { return rdb.Set(ctx, born, "12345", 0).Err() }, 2},
		{"that birth seen again", nil, 2},
	} {
		if step.before != nil {
			if err := step.before(); err != nil {
				t.Fatal(err)
			}
		}
		if err := g.Check(ctx, rdb); err != nil {
			t.Fatal(err)
		}
		if got := g.Restarts(); got != step.restarts {
			t.Fatalf("%s: %d restarts counted, want %d", step.name, got, step.restarts)
		}
	}
	var none *regional.RestartGuard
	if got := none.Restarts(); got != 0 {
		t.Fatalf("a nil guard counts %d restarts, want 0", got)
	}
	if got := none.Rollbacks(); got != 0 {
		t.Fatalf("a nil guard counts %d rollbacks, want 0", got)
	}
}

// TestColdStartFullTrustsOnlyTheFirstLook: under ColdStartFull the first
// look at an empty Redis stamps its birth 0 (new buckets start full); a
// data loss noticed later is stamped on the Redis clock like any other,
// and the conservative mode stamps the Redis clock from the first look.
func TestColdStartFullTrustsOnlyTheFirstLook(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	t.Cleanup(func() { rdb.Close() })
	born := func() int64 {
		t.Helper()
		v, err := rdb.Get(ctx, luascripts.DefaultPrefix+"born").Int64()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	check := func(g *regional.RestartGuard) {
		t.Helper()
		if err := g.Check(ctx, rdb); err != nil {
			t.Fatal(err)
		}
	}
	full := regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartFull, slog.New(slog.DiscardHandler))
	check(full)
	if got := born(); got != 0 {
		t.Fatalf("ColdStartFull's first look stamped born %d, want 0", got)
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	check(full)
	if got := born(); got <= 0 {
		t.Fatalf("ColdStartFull stamped born %d after a loss it noticed while running, want the Redis clock", got)
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	check(regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartConservative, slog.New(slog.DiscardHandler)))
	if got := born(); got <= 0 {
		t.Fatalf("ColdStartConservative's first look stamped born %d, want the Redis clock", got)
	}
}

// TestRestartWaitIsTheLongerOfLeaseTTLAndValidityPlusEpoch: a guard waits
// the scripts' restart wait under the config; no guard waits nothing.
func TestRestartWaitIsTheLongerOfLeaseTTLAndValidityPlusEpoch(t *testing.T) {
	g := regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartConservative, nil)
	var none *regional.RestartGuard
	for _, tc := range []struct {
		leaseTTL, validity, epoch string
		want                      time.Duration
	}{
		{"3s", "1s", "250ms", 3 * time.Second},
		{"1s", "2s", "500ms", 2500 * time.Millisecond},
	} {
		cfg, err := config.Parse(fmt.Appendf(nil, `
lease_ttl: %s
refresh: 200ms
grant_validity: %s
epoch: %s
regions: {eu: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`, tc.leaseTTL, tc.validity, tc.epoch))
		if err != nil {
			t.Fatal(err)
		}
		if got := g.RestartWait(cfg); got != tc.want {
			t.Fatalf("restart wait under lease_ttl %s, grant_validity %s, epoch %s: %v, want %v",
				tc.leaseTTL, tc.validity, tc.epoch, got, tc.want)
		}
		if got := none.RestartWait(cfg); got != 0 {
			t.Fatalf("no guard's restart wait %v, want 0", got)
		}
	}
}

// TestParseColdStart: the flag's two words, the empty default, and an
// error naming both for anything else.
func TestParseColdStart(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want regional.ColdStart
		bad  bool
	}{
		{"", regional.ColdStartConservative, false},
		{"conservative", regional.ColdStartConservative, false},
		{"full", regional.ColdStartFull, false},
		{"Full", regional.ColdStartConservative, true},
		{"fast", regional.ColdStartConservative, true},
	} {
		got, err := regional.ParseColdStart(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Fatalf("ParseColdStart(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

// TestRestartGuardCountsANodeLossOnACluster: on a three-node Redis
// Cluster the guard's probe of each node's first slot notices a node that
// lost its data, or all of them at once: one restart is counted for each,
// every missing sentinel of that node is stamped again, and looks that
// find the probes as the guard left them count nothing.
func TestRestartGuardCountsANodeLossOnACluster(t *testing.T) {
	ctx := context.Background()
	addrs, cc, g := guardedCluster(t, regional.ColdStartConservative)
	check := func(want int64) {
		t.Helper()
		if err := g.Check(ctx, cc); err != nil {
			t.Fatal(err)
		}
		if got := g.Restarts(); got != want {
			t.Fatalf("%d restarts counted, want %d", got, want)
		}
	}
	check(0)
	check(0)
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	node := redis.NewClient(&redis.Options{Addr: slots[0].Nodes[0].Addr})
	t.Cleanup(func() { node.Close() })
	if err := node.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	check(1)
	// The lost node's sentinels are back, its last slot's included.
	if n, err := cc.Exists(ctx, luascripts.BornKey(luascripts.DefaultPrefix, int(slots[0].End))).Result(); err != nil || n != 1 {
		t.Fatalf("the lost node's last sentinel: exists %d, %v; want it stamped again", n, err)
	}
	check(1)
	// Every node loses its data at once: every probe finds its sentinel
	// missing, one restart more.
	for _, a := range addrs {
		n := redis.NewClient(&redis.Options{Addr: a})
		err := n.FlushAll(ctx).Err()
		n.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	check(2)
	check(2)
}

// TestRestartGuardRebirthsADataSetGoneBack: a data set whose write
// generation is behind the one the guard's process saw (an older snapshot
// restored while no call touched it) is re-birthed by the guard's own
// check on the Redis clock and counted once, as a data loss and as a
// rollback; the checks after it count nothing more.
func TestRestartGuardRebirthsADataSetGoneBack(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	t.Cleanup(func() { rdb.Close() })
	born := luascripts.DefaultPrefix + "born"
	g := regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartFull, slog.New(slog.DiscardHandler))
	check := func() {
		t.Helper()
		if err := g.Check(ctx, rdb); err != nil {
			t.Fatal(err)
		}
	}
	check() // a new deployment: born 0, trusted full
	if seen := g.Generations().Seen(born); seen == 0 {
		t.Fatal("the first stamp showed the guard no generation")
	}
	if err := rdb.Set(ctx, luascripts.GenKey(born), "5", 0).Err(); err != nil {
		t.Fatal(err)
	}
	check()
	v, err := rdb.Get(ctx, born).Int64()
	if err != nil || v <= 0 {
		t.Fatalf("born %d (%v) after the data set went back, want the Redis clock (not the trusted 0)", v, err)
	}
	for range 2 {
		if r, b := g.Restarts(), g.Rollbacks(); r != 1 || b != 1 {
			t.Fatalf("%d data losses, %d rollbacks counted, want 1 and 1", r, b)
		}
		check()
	}
}
