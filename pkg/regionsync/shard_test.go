package regionsync

import (
	"fmt"
	"math"
	"slices"
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

// TestShardLeasesKeepEveryShard: Of gives no lease for a shard outside the
// slice, negative ones included; With and Merge keep every shard either
// side holds (the result is as long as the longer, and never shorter than
// the shard written), each the longer of the two leases.
func TestShardLeasesKeepEveryShard(t *testing.T) {
	s := ShardLeases{{UntilUS: 100}, {UntilUS: 200}, {UntilUS: 300}}
	for _, i := range []int{-1, math.MinInt, 3, 1000} {
		if got := s.Of(i); got != (StaticLease{}) {
			t.Errorf("Of(%d) = %+v, want no lease", i, got)
		}
	}
	for _, c := range []struct {
		name string
		got  ShardLeases
		want ShardLeases
	}{
		{"With on the first shard", s.With(0, StaticLease{UntilUS: 150}), ShardLeases{{UntilUS: 150}, {UntilUS: 200}, {UntilUS: 300}}},
		{"With on the last shard", s.With(2, StaticLease{UntilUS: 250}), ShardLeases{{UntilUS: 100}, {UntilUS: 200}, {UntilUS: 300}}},
		{"With one past the end", s.With(3, StaticLease{UntilUS: 50}), ShardLeases{{UntilUS: 100}, {UntilUS: 200}, {UntilUS: 300}, {UntilUS: 50}}},
		{"With two past the end", s.With(4, StaticLease{UntilUS: 50}), ShardLeases{{UntilUS: 100}, {UntilUS: 200}, {UntilUS: 300}, {}, {UntilUS: 50}}},
		{"With on none", ShardLeases(nil).With(0, StaticLease{UntilUS: 7}), ShardLeases{{UntilUS: 7}}},
		{"Merge of a shorter", s.Merge(ShardLeases{{UntilUS: 400}}), ShardLeases{{UntilUS: 400}, {UntilUS: 200}, {UntilUS: 300}}},
		{"Merge into a shorter", ShardLeases{{UntilUS: 400}}.Merge(s), ShardLeases{{UntilUS: 400}, {UntilUS: 200}, {UntilUS: 300}}},
		{"Merge of none", s.Merge(nil), s},
		{"Merge into none", ShardLeases(nil).Merge(s), s},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
	if !slices.Equal(s, ShardLeases{{UntilUS: 100}, {UntilUS: 200}, {UntilUS: 300}}) {
		t.Fatalf("With or Merge changed the receiver: %v", s)
	}
}
