package regionsync

import (
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/shard"
)

// TestKeyLeaseIsItsOwnersShortest: a key runs under its owner's lease under
// one map, and under the shortest of its owners' leases under several (a
// key moving between shards needs both leases); a shard without a lease
// leaves its keys on the floor whatever the others hold.
func TestKeyLeaseIsItsOwnersShortest(t *testing.T) {
	m3, _ := shard.New(3)
	m4, _ := shard.New(4)
	leases := ShardLeases{}.With(0, StaticLease{UntilUS: 100}).With(1, StaticLease{UntilUS: 200}).
		With(2, StaticLease{UntilUS: 300}).With(3, StaticLease{UntilUS: 400})
	for i := range 200 {
		k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
		if got, want := KeyLease(k, []shard.Map{m3}, leases), leases.Of(m3.Of(k)); got != want {
			t.Fatalf("%v under 3 shards: %v, want %v", k, got, want)
		}
		got := KeyLease(k, []shard.Map{m4, m3}, leases)
		want := min(leases.Of(m3.Of(k)).UntilUS, leases.Of(m4.Of(k)).UntilUS)
		if got.UntilUS != want {
			t.Fatalf("%v under 4 and 3 shards: %v, want %d", k, got, want)
		}
		if KeyLease(k, []shard.Map{m4}, leases[:2]).UntilUS != 0 && m4.Of(k) >= 2 {
			t.Fatalf("%v: a shard holding no lease gave one", k)
		}
	}
	if KeyLease(quota.Key{Tenant: "a", Class: "b"}, nil, leases) != leases.Of(0) {
		t.Fatal("no map: shard 0's lease")
	}
	// Leases only grow.
	if l := leases.With(1, StaticLease{UntilUS: 50}); l.Of(1).UntilUS != 200 || leases.Merge(ShardLeases{{UntilUS: 500}}).Of(0).UntilUS != 500 {
		t.Fatal("a lease shrank")
	}
}

// TestChainShardMaps: the maps of every config the chain honours, the
// current one first, without repeats.
func TestChainShardMaps(t *testing.T) {
	cfg := func(n int64) *config.Config {
		c := config.Default()
		c.GlobalShards = n
		return c
	}
	c := NewChain(1, cfg(3))
	c, _ = c.Reported()
	c = c.Adopt(2, cfg(4))
	c = c.Adopt(3, cfg(4))
	got := c.ShardMaps()
	if len(got) != 2 || got[0].N() != 4 || got[1].N() != 3 {
		t.Fatalf("maps %v, want 4 then 3 shards", got)
	}
	if c = c.Confirm(3); len(c.ShardMaps()) != 1 {
		t.Fatalf("after confirming the newest: %v", c.ShardMaps())
	}
}
