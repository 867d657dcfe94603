package regionsync

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/shard"
)

// TestLeaseCameBackOnlyOffAnEnd: a view's lease came back when it had
// ended a grant validity before the estimate (the global tier counts a
// region at its floor no sooner) and the new one runs then; not when it
// ended more recently, was extended while running, when the new one is not
// running either, nor when none was ever held.
func TestLeaseCameBackOnlyOffAnEnd(t *testing.T) {
	const est = 10_000_000
	const validity = 2 * time.Second
	v := validity.Microseconds()
	for _, tc := range []struct {
		name      string
		old, next int64
		want      bool
	}{
		{"ended over a validity ago, conferred again", est - v - 500_000, est + 2_000_000, true},
		{"ended exactly a validity before the estimate", est - v, est + 1, true},
		{"ended less than a validity ago: never counted at its floor", est - v + 1, est + 2_000_000, false},
		{"ended at the estimate", est, est + 1, false},
		{"extended while running", est + 1, est + 2_000_000, false},
		{"ended, and the new one ended too", est - v - 500_000, est, false},
		{"ended, not extended", est - v - 500_000, est - v - 500_000, false},
		{"never held (a fresh region, a new shard)", 0, est + 2_000_000, false},
	} {
		if got := CameBack(StaticLease{UntilUS: tc.old}, StaticLease{UntilUS: tc.next}, est, validity); got != tc.want {
			t.Errorf("%s: came back %v, want %v", tc.name, got, tc.want)
		}
	}
	if !CameBack(StaticLease{UntilUS: est}, StaticLease{UntilUS: est + 1}, est, -time.Second) {
		t.Error("a negative validity is taken as none")
	}
}

// TestStaticRisesNoticedPerShardAndOnlyRaised: a view's leases moving notice a
// rise at the estimate only for the shards whose lease came back; a rise
// is never lowered, by a notice, a merge or a region-wide raise.
func TestStaticRisesNoticedPerShardAndOnlyRaised(t *testing.T) {
	const est = 5_000_000
	old := ShardLeases{{UntilUS: est - 1}, {UntilUS: est + 10}, {UntilUS: est - 3}}
	next := ShardLeases{{UntilUS: est + 100}, {UntilUS: est + 100}, {UntilUS: est - 3}, {UntilUS: est + 100}}
	got := ShardRises{0, 0, 7}.Noticed(old, next, est, 0)
	if want := (ShardRises{est, 0, 7}); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("noticed %v, want %v (shard 0 came back; 1 extended; 2 still ended; 3 never held)", got, want)
	}
	if got := (ShardRises{est + 9}).Noticed(old, next, est, 0); got.Of(0) != est+9 {
		t.Fatalf("a notice lowered shard 0's rise to %d", got.Of(0))
	}
	if got := (ShardRises{10, 20}).Merge(ShardRises{15, 5, 30}); fmt.Sprint(got) != fmt.Sprint(ShardRises{15, 20, 30}) {
		t.Fatalf("merge %v, want the later of each", got)
	}
	if got := (ShardRises{10, 50}).With(1, 40).With(3, 9); fmt.Sprint(got) != fmt.Sprint(ShardRises{10, 50, 0, 9}) {
		t.Fatalf("with %v", got)
	}
	if got := (ShardRises{10, 50, 0}).All(4, 40); fmt.Sprint(got) != fmt.Sprint(ShardRises{40, 50, 40, 40}) {
		t.Fatalf("all %v, want every shard below 4 at least 40", got)
	}
	if got := (ShardRises{10, 50, 0}).All(1, 40); fmt.Sprint(got) != fmt.Sprint(ShardRises{40, 50, 40}) {
		t.Fatalf("all %v, want every shard held raised too", got)
	}
	if (ShardRises{1}).Of(-1) != 0 || (ShardRises{1}).Of(1) != 0 {
		t.Fatal("a shard out of range has a rise")
	}
}

// TestKeyRiseIsItsLeaseOwnersLatest: a key runs under its owner's rise under
// one map and the latest of its owners' rises under several (it ran on its
// floor while either lease had ended), shard 0's with no map.
func TestKeyRiseIsItsLeaseOwnersLatest(t *testing.T) {
	m3, _ := shard.New(3)
	m4, _ := shard.New(4)
	rises := ShardRises{100, 400, 200, 300}
	for i := range 200 {
		k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
		if got, want := KeyRise(k, []shard.Map{m3}, rises), rises.Of(m3.Of(k)); got != want {
			t.Fatalf("%v under 3 shards: %d, want %d", k, got, want)
		}
		if got, want := KeyRise(k, []shard.Map{m4, m3}, rises), max(rises.Of(m3.Of(k)), rises.Of(m4.Of(k))); got != want {
			t.Fatalf("%v under 4 and 3 shards: %d, want %d", k, got, want)
		}
	}
	if KeyRise(quota.Key{Tenant: "a", Class: "b"}, nil, rises) != 100 {
		t.Fatal("no map: shard 0's rise")
	}
}

// TestDrainLiftedOnlyWhenNoConfigDrainsAnyMore: a confirmation lifts a
// drain of a region when the chain held a config draining it and holds
// none after; adopting the restore does not (the drained config still
// bounds the share), nor a confirmation that keeps a draining config, nor
// one of a region never drained; and a drain of another region is not
// this region's.
func TestDrainLiftedOnlyWhenNoConfigDrainsAnyMore(t *testing.T) {
	plain, drained := awaitConfig(t, false, false, 1), awaitConfig(t, false, true, 1) // us drained
	drainedChain := NewChain(1, plain).Adopt(2, drained).Confirm(2)
	restoring := drainedChain.Adopt(3, plain)
	for _, tc := range []struct {
		name      string
		old, next Chain
		region    string
		want      bool
	}{
		{"restore confirmed", restoring, restoring.Confirm(3), "us", true},
		{"restore adopted, not confirmed", drainedChain, restoring, "us", false},
		{"drain confirmed", NewChain(1, plain).Adopt(2, drained), NewChain(1, plain).Adopt(2, drained).Confirm(2), "us", false},
		{"drained, restored, drained again: the restore confirmed", restoring.Adopt(4, drained), restoring.Adopt(4, drained).Confirm(3), "us", false},
		{"another region's drain lifted", restoring, restoring.Confirm(3), "eu", false},
		{"never drained", NewChain(1, plain).Adopt(2, plain), NewChain(1, plain).Adopt(2, plain).Confirm(2), "us", false},
		{"a process started drained, restored and confirmed", NewChain(2, drained).Adopt(3, plain), NewChain(2, drained).Adopt(3, plain).Confirm(3), "us", true},
	} {
		if got := DrainLifted(tc.region, tc.old, tc.next); got != tc.want {
			t.Errorf("%s: drain lifted of %s %v, want %v", tc.name, tc.region, got, tc.want)
		}
	}
	// The share follows: while a drain is in the chain, us runs its floor
	// whatever the current config says; once it is lifted, its share.
	k := quota.Key{Tenant: "acme", Class: "write"}
	res, err := plain.Resolve(k)
	if err != nil {
		t.Fatal(err)
	}
	before, _, _ := restoring.Share("us", k, plain, res)
	after, _, _ := restoring.Confirm(3).Share("us", k, plain, res)
	if !(before < after) || math.IsNaN(before) {
		t.Fatalf("us's share %v before the lift, %v after; want it to rise", before, after)
	}
}

// TestKeyRiseAtItsEdges: no rise known is 0 for every key, whatever the
// maps; a single shard's rise is that shard's; a key whose owners never
// rose is 0, not the latest rise of some other shard; and a lease held
// until the first microsecond still counts as held for CameBack.
func TestKeyRiseAtItsEdges(t *testing.T) {
	m2, _ := shard.New(2)
	k := quota.Key{Tenant: "acme", Class: "write"}
	k1 := k // a key of shard 1 under m2
	for i := 0; m2.Of(k1) != 1; i++ {
		k1 = quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
	}
	for _, tc := range []struct {
		name  string
		maps  []shard.Map
		rises ShardRises
		want  int64
	}{
		{"no rise known, no map", nil, nil, 0},
		{"no rise known, under a map", []shard.Map{m2}, ShardRises{}, 0},
		{"one shard, no map", nil, ShardRises{70}, 70},
		{"one shard known, the key's owner past it", []shard.Map{m2}, ShardRises{70}, 0},
		{"its owner never rose, another did", []shard.Map{m2}, ShardRises{70, 0}, 0},
	} {
		if got := KeyRise(k1, tc.maps, tc.rises); got != tc.want {
			t.Errorf("%s: rise %d, want %d", tc.name, got, tc.want)
		}
	}
	if !CameBack(StaticLease{UntilUS: 1}, StaticLease{UntilUS: 10_000_000}, 5_000_000, time.Second) {
		t.Error("a lease that ended at 1 µs, a validity before the estimate, did not come back")
	}
}
