package regional_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestColdStartFullRetriedFirstLookOnAClusterTrustsOnlyTheSlotsNoCallAnsweredFrom:
// on a three-node Redis Cluster under -cold-start full, the guard's first
// look did not answer, and a script call of this process then answered
// from one slot's data set. Every node loses its data. The retried first
// look dates that slot's data set on the Redis clock (leases the call may
// have issued are still out) and trusts every other slot's to start full
// (0), the slots before and after it on its node included. The look
// counts no loss, and the next look, whose probes find their sentinels as
// the first one left them, neither counts one nor stamps anything beyond
// its one probe per node.
func TestColdStartFullRetriedFirstLookOnAClusterTrustsOnlyTheSlotsNoCallAnsweredFrom(t *testing.T) {
	ctx := context.Background()
	addrs, cc, g := guardedCluster(t, regional.ColdStartFull)
	nodes := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { nodes[i].Close() })
	}

	// The first look does not answer (its context ended before it ran).
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := g.Check(gone, cc); err == nil {
		t.Fatal("a first look whose context had ended answered")
	}
	if g.Looked() {
		t.Fatal("the guard counts a look that did not answer as made")
	}

	// A call of this process answers from the data set of one slot, with
	// slots on both sides of it.
	key := quota.Key{Tenant: "acme", Class: "read"}
	used := luascripts.Slot(key.Tenant + "|" + key.Class)
	if used == 0 || used == luascripts.SlotCount-1 {
		t.Fatalf("the key's slot %d has no slot on one side", used)
	}
	common := luascripts.Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Minute, RestartWait: time.Minute, ReapBudget: 8, DemandWindow: time.Millisecond}
	if _, err := luascripts.NewWith(g.Generations()).Check(ctx, cc, luascripts.ClusterKeysFor(luascripts.DefaultPrefix, key), common, 1); err != nil {
		t.Fatal(err)
	}

	// Every node loses its data.
	for _, n := range nodes {
		if err := n.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	before, err := nodes[0].Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, cc); err != nil {
		t.Fatalf("retried first look: %v", err)
	}
	born := luascripts.BornKeys(luascripts.DefaultPrefix, true)
	gets := make([]*redis.StringCmd, len(born))
	if _, err := cc.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range born {
			gets[i] = p.Get(ctx, k)
		}
		return nil
	}); err != nil {
		t.Fatalf("read the sentinels: %v", err)
	}
	for slot, get := range gets {
		v, err := get.Int64()
		switch {
		case err != nil:
			t.Fatalf("slot %d's sentinel after the retried look: %v", slot, err)
		case slot == used && v < before.UnixMicro():
			t.Fatalf("slot %d's sentinel, which a call answered from: %d µs, before the look (%d µs); want the Redis clock at the look, never trusted full", slot, v, before.UnixMicro())
		case slot != used && v != 0:
			t.Fatalf("slot %d's sentinel, which no call answered from: %d; want 0 (trusted to start full)", slot, v)
		}
	}
	if got := g.Restarts(); got != 0 {
		t.Fatalf("the retried first look counted %d data losses, want 0", got)
	}

	for _, n := range nodes {
		if err := n.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Check(ctx, cc); err != nil {
		t.Fatal(err)
	}
	if got := g.Restarts(); got != 0 {
		t.Fatalf("a look that found the sentinels as the first one left them counted %d data losses, want 0", got)
	}
	calls := 0
	for _, n := range nodes {
		info, err := n.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		calls += scriptCalls(t, info)
	}
	if calls != len(nodes) {
		t.Fatalf("a look that found the sentinels as the first one left them ran %d script calls, want one probe per node (%d)", calls, len(nodes))
	}
}

// scriptCalls sums the calls of EVAL and EVALSHA in an INFO commandstats
// reply.
func scriptCalls(t *testing.T, info string) int {
	t.Helper()
	n := 0
	for line := range strings.SplitSeq(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_eval" && name != "cmdstat_evalsha") {
			continue
		}
		for f := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				c, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("commandstats line %q: %v", line, err)
				}
				n += c
			}
		}
	}
	return n
}

// TestRestartGuardRebirthsANodeGoneBackOnACluster: one node of a
// three-node Redis Cluster goes back in time (every slot's write
// generation below the one the guard saw, as after an older snapshot is
// restored). The guard's probe of that node's first slot re-births its
// data set, and the same check re-births every other slot's of the node
// on the Redis clock, though no call touched them: a key first used long
// after is not held to a birth dated at its first call. It counts one
// data loss, a rollback, and leaves the other nodes' slots alone.
func TestRestartGuardRebirthsANodeGoneBackOnACluster(t *testing.T) {
	ctx := context.Background()
	cc, g, slots := lookedCluster(t)
	if len(slots) < 2 {
		t.Fatalf("%d slot ranges, want one per node", len(slots))
	}
	back, other := slots[0], slots[1]
	node := redis.NewClient(&redis.Options{Addr: back.Nodes[0].Addr})
	t.Cleanup(func() { node.Close() })
	sentinel := func(slot int) int64 {
		t.Helper()
		v, err := cc.Get(ctx, luascripts.BornKey(luascripts.DefaultPrefix, slot)).Int64()
		if err != nil {
			t.Fatalf("slot %d's sentinel: %v", slot, err)
		}
		return v
	}
	otherBorn := sentinel(other.Start)

	// The node goes back: every slot's generation is below the one seen.
	if _, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for s := back.Start; s <= back.End; s++ {
			p.Set(ctx, luascripts.GenKey(luascripts.BornKey(luascripts.DefaultPrefix, s)), "5", 0)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	before, err := node.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, cc); err != nil {
		t.Fatal(err)
	}
	for _, s := range []int{back.Start, back.Start + 1, (back.Start + back.End) / 2, back.End} {
		if v := sentinel(s); v < before.UnixMicro() {
			t.Fatalf("slot %d's sentinel of the node gone back: %d µs, before the check (%d µs); want it re-birthed on the Redis clock at the check", s, v, before.UnixMicro())
		}
	}
	if v := sentinel(other.Start); v != otherBorn {
		t.Fatalf("slot %d's sentinel of a node that did not go back: %d, want %d as before", other.Start, v, otherBorn)
	}
	for range 2 {
		if r, b := g.Restarts(), g.Rollbacks(); r != 1 || b != 1 {
			t.Fatalf("%d data losses, %d rollbacks counted, want 1 and 1", r, b)
		}
		if err := g.Check(ctx, cc); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRestartGuardProbeNoticesANodeLossACallStampedFirst: a node of a
// three-node Redis Cluster loses its data, and a script call touching
// that node's first slot (the one the guard probes) stamps its sentinel
// again before the guard's next check. The probe finds a sentinel it did
// not write but with another birth than the one it last saw: the check
// counts the loss and stamps the node's other slots again.
func TestRestartGuardProbeNoticesANodeLossACallStampedFirst(t *testing.T) {
	ctx := context.Background()
	cc, g, slots := lookedCluster(t)
	lost := slots[0]
	// A key of the probed slot.
	key := quota.Key{Class: "read"}
	for n := 0; ; n++ {
		key.Tenant = "t" + strconv.Itoa(n)
		if luascripts.Slot(key.Tenant+"|"+key.Class) == lost.Start {
			break
		}
	}
	node := redis.NewClient(&redis.Options{Addr: lost.Nodes[0].Addr})
	t.Cleanup(func() { node.Close() })
	if err := node.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	common := luascripts.Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Minute, RestartWait: time.Minute, ReapBudget: 8, DemandWindow: time.Millisecond}
	if _, err := luascripts.NewWith(g.Generations()).Check(ctx, cc, luascripts.ClusterKeysFor(luascripts.DefaultPrefix, key), common, 1); err != nil {
		t.Fatal(err)
	}
	if err := g.Check(ctx, cc); err != nil {
		t.Fatal(err)
	}
	if got := g.Restarts(); got != 1 {
		t.Fatalf("%d data losses counted, want 1", got)
	}
	if n, err := cc.Exists(ctx, luascripts.BornKey(luascripts.DefaultPrefix, lost.End)).Result(); err != nil || n != 1 {
		t.Fatalf("the lost node's last sentinel: exists %d, %v; want it stamped again", n, err)
	}
}

// guardedCluster starts a three-node Redis Cluster of the test's own, a
// client of it and a restart guard in mode that has not looked yet. The
// cluster is mostly waited for (redis-cli forms it by polling), so the
// test runs beside the package's other parallel tests.
func guardedCluster(t *testing.T, mode regional.ColdStart) ([]string, *redis.ClusterClient, *regional.RestartGuard) {
	t.Helper()
	t.Parallel()
	addrs := redistest.StartCluster(t, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { cc.Close() })
	return addrs, cc, regional.NewRestartGuard(luascripts.DefaultPrefix, mode, slog.New(slog.DiscardHandler))
}

// lookedCluster is guardedCluster with a conservative guard that made its
// first look, and the cluster's slot ranges, one per node.
func lookedCluster(t *testing.T) (*redis.ClusterClient, *regional.RestartGuard, []redis.ClusterSlot) {
	t.Helper()
	_, cc, g := guardedCluster(t, regional.ColdStartConservative)
	if err := g.Check(context.Background(), cc); err != nil {
		t.Fatal(err)
	}
	slots, err := cc.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return cc, g, slots
}
