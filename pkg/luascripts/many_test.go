package luascripts

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// manyCommon are the settings of the batch tests' keys.
var manyCommon = Common{StaticRate: 10, StaticBurst: 20, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 2,
	DemandWindow: 300 * time.Millisecond, MarkEvery: 250 * time.Millisecond}

// manyRig starts a redis-server and gives the batch tests a client of it,
// scripts on a virtual clock set to now, and a Model.
func manyRig(t *testing.T) (ctx context.Context, rdb *redis.Client, sc *Scripts, m *Model, now int64) {
	t.Helper()
	now = 1_700_000_000_000_000
	sc = newVirtual()
	sc.setNow(now)
	return context.Background(), redistest.Start(t).Client(), sc, NewModel(), now
}

// modelCheck returns a check that a batch's replies are want and that
// the whole stored state is the Model's.
func modelCheck(ctx context.Context, t *testing.T, rdb *redis.Client, m *Model) func(what string, got, want any) {
	return func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: reply differs\n lua:   %+v\n model: %+v", what, got, want)
		}
		if rs, ms := snapshot(ctx, t, rdb), m.Snapshot(); !reflect.DeepEqual(rs, ms) {
			t.Fatalf("%s: state differs\n redis: %v\n model: %v", what, rs, ms)
		}
	}
}

// TestManyMatchesModel runs the region leader's batches (StateMany,
// SetRateMany) over more keys than one call carries, of one slot and of
// many (cluster keys), and requires every key's reply and the whole stored
// state to be what the Model gives for one call per key, in order.
func TestManyMatchesModel(t *testing.T) {
	ctx, rdb, sc, m, now := manyRig(t)
	var keys []Keys
	for i := range 2*BatchKeys + 30 {
		k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "read"}
		if i%3 == 0 {
			keys = append(keys, ClusterKeysFor(DefaultPrefix, k))
		} else {
			keys = append(keys, KeysFor(DefaultPrefix, k))
		}
	}
	check := modelCheck(ctx, t, rdb, m)
	for i, k := range keys {
		sc.setNow(now)
		r := Report{Instance: "i", Incarnation: 1, Lease: 1, Seq: 1, Want: int64(1 + i%7), Min: 1, BuiltUS: 1_000_000}
		got, err := sc.Acquire(ctx, rdb, k, manyCommon, r)
		if err != nil {
			t.Fatal(err)
		}
		if want := m.Acquire(now, k, manyCommon, r); got != want {
			t.Fatalf("acquire %d: %+v, model %+v", i, got, want)
		}
	}
	for round := range 3 {
		now += 1_300_000
		_, now = installThenRead(ctx, rdb, sc, m, check, round, keys, manyCommon, now, func(i int) SetRateItem {
			return SetRateItem{Rate: float64(i%5) * 7.5, Burst: float64(i % 40),
				ExpiryUS: now + int64(1+i%4)*1_000_000, IssuedUS: now - int64(round)}
		})
	}
}

// installThenRead runs, at now, one SetRateMany over keys (key i's grant
// from grant(i); its keys and settings c), then, 700ms later, one
// StateMany; check compares each with the Model's calls, one per key, in
// order. It returns the Model's set_rate replies and the read's instant.
func installThenRead(ctx context.Context, rdb *redis.Client, sc *Scripts, m *Model, check func(what string, got, want any),
	round int, keys []Keys, c Common, now int64, grant func(i int) SetRateItem) ([]SetRateResult, int64) {
	sc.setNow(now)
	var items []SetRateItem
	var want []SetRateResult
	for i, k := range keys {
		it := grant(i)
		it.Keys, it.Common = k, c
		items = append(items, it)
		want = append(want, SetRateResult{Reply: m.SetRate(now, k, c, it.Rate, it.Burst, it.ExpiryUS, it.IssuedUS, it.Deposit)})
	}
	check(fmt.Sprintf("round %d: set_rate", round), sc.SetRateMany(ctx, rdb, items), want)
	now += 700_000
	sc.setNow(now)
	var reads []KeyCommon
	var states []StateResult
	for _, k := range keys {
		reads = append(reads, KeyCommon{Keys: k, Common: c})
		states = append(states, StateResult{State: m.State(now, k, c)})
	}
	check(fmt.Sprintf("round %d: state", round), sc.StateMany(ctx, rdb, reads), states)
	return want, now
}

// TestManyKeyFailureIsItsOwn: a key whose call fails (here its bucket is
// not a hash) fails alone; the keys after it in the same call are read and
// granted exactly as without it.
func TestManyKeyFailureIsItsOwn(t *testing.T) {
	ctx, rdb, sc, m, now := manyRig(t)
	var keys []Keys
	for i := range 3 {
		keys = append(keys, KeysFor(DefaultPrefix, quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "read"}))
	}
	if err := rdb.Set(ctx, keys[1].Bucket, "not a bucket", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var items []SetRateItem
	for _, k := range keys {
		items = append(items, SetRateItem{Keys: k, Common: manyCommon, Rate: 5, Burst: 9, ExpiryUS: now + 3e6, IssuedUS: now})
	}
	res := sc.SetRateMany(ctx, rdb, items)
	if err := res[1].Err; err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("set_rate on a key that is not a bucket: err %v, want WRONGTYPE", err)
	}
	for _, i := range []int{0, 2} {
		want := m.SetRate(now, keys[i], manyCommon, 5, 9, now+3e6, now, 0)
		if res[i].Err != nil || res[i].Reply != want {
			t.Fatalf("key %d beside the failing one: %+v, %v; want %+v", i, res[i].Reply, res[i].Err, want)
		}
	}
	st := sc.StateMany(ctx, rdb, []KeyCommon{{keys[0], manyCommon}, {keys[1], manyCommon}, {keys[2], manyCommon}})
	if st[1].Err == nil {
		t.Fatal("state of a key that is not a bucket: no error")
	}
	for _, i := range []int{0, 2} {
		if want := m.State(now, keys[i], manyCommon); st[i].Err != nil || st[i].State != want {
			t.Fatalf("state of key %d beside the failing one: %+v, %v; want %+v", i, st[i].State, st[i].Err, want)
		}
	}
}

// TestManyOnRedisCluster runs the batches on a real Redis Cluster: keys of
// one slot go in one call (with its slot's born sentinel and candidate
// set), keys of other slots in calls of their own, each to its node.
func TestManyOnRedisCluster(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.StartCluster(t, 3)})
	t.Cleanup(func() { rdb.Close() })
	sc := New()
	// Three keys that share a slot, and keys spread over others.
	var keys []Keys
	bySlot := map[int][]quota.Key{}
	for i := 0; len(keys) < 3; i++ {
		k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "read"}
		s := Slot(k.Tenant + "|" + k.Class)
		bySlot[s] = append(bySlot[s], k)
		if len(bySlot[s]) == 3 {
			for _, k := range bySlot[s] {
				keys = append(keys, ClusterKeysFor(DefaultPrefix, k))
			}
		}
	}
	for i := range 20 {
		keys = append(keys, ClusterKeysFor(DefaultPrefix, quota.Key{Tenant: fmt.Sprintf("u%d", i), Class: "read"}))
	}
	for _, k := range keys {
		if _, err := sc.Acquire(ctx, rdb, k, manyCommon, Report{Instance: "i", Incarnation: 1, Lease: 1, Seq: 1, Want: 3, Min: 1}); err != nil {
			t.Fatal(err)
		}
	}
	nowUS := time.Now().UnixMicro()
	var items []SetRateItem
	var reads []KeyCommon
	for _, k := range keys {
		items = append(items, SetRateItem{Keys: k, Common: manyCommon, Rate: 40, Burst: 60, ExpiryUS: nowUS + 60e6, IssuedUS: nowUS})
		reads = append(reads, KeyCommon{Keys: k, Common: manyCommon})
	}
	for i, r := range sc.SetRateMany(ctx, rdb, items) {
		if r.Err != nil || !r.Reply.Applied {
			t.Fatalf("set_rate %d: %+v, %v", i, r.Reply, r.Err)
		}
	}
	for i, r := range sc.StateMany(ctx, rdb, reads) {
		if r.Err != nil || r.State.Rate != 40 || r.State.Cap != 60 || r.State.Outstanding != 3 {
			t.Fatalf("state %d after its grant: %+v, %v", i, r.State, r.Err)
		}
	}
}

// TestManyAfterScriptFlush: a batch whose script Redis no longer knows
// (SCRIPT FLUSH, a restart) loads it again and answers as before.
func TestManyAfterScriptFlush(t *testing.T) {
	ctx, rdb, sc, m, now := manyRig(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "t", Class: "read"})
	for round := range 2 {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		now += 1_000_000
		sc.setNow(now)
		res := sc.SetRateMany(ctx, rdb, []SetRateItem{{Keys: k, Common: manyCommon, Rate: 3, Burst: 4, ExpiryUS: now + 5e6, IssuedUS: now}})
		if want := m.SetRate(now, k, manyCommon, 3, 4, now+5e6, now, 0); res[0].Err != nil || res[0].Reply != want {
			t.Fatalf("round %d: set_rate after SCRIPT FLUSH: %+v, %v; want %+v", round, res[0].Reply, res[0].Err, want)
		}
		st := sc.StateMany(ctx, rdb, []KeyCommon{{k, manyCommon}})
		if want := m.State(now, k, manyCommon); st[0].Err != nil || st[0].State != want {
			t.Fatalf("round %d: state after SCRIPT FLUSH: %+v, %v; want %+v", round, st[0].State, st[0].Err, want)
		}
	}
}

// TestQueuedMatchesModel: checks and lease calls added to one pipeline
// after SCRIPT FLUSH are run again on their own (NOSCRIPT) and answer as
// the Model does; a call failing otherwise (its bucket is not a hash) is
// not rerun and fails alone, naming its key.
func TestQueuedMatchesModel(t *testing.T) {
	ctx, rdb, sc, m, now := manyRig(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "t", Class: "read"})
	bad := KeysFor(DefaultPrefix, quota.Key{Tenant: "bad", Class: "read"})
	if err := rdb.Set(ctx, bad.Bucket, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	r := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 3, Min: 1}
	qs := RunQueued(ctx, rdb, func(p redis.Pipeliner) []*Queued {
		return []*Queued{sc.QueueCheck(ctx, p, k, manyCommon, 2), sc.QueueAcquire(ctx, p, k, manyCommon, r), sc.QueueCheck(ctx, p, bad, manyCommon, 1),
			sc.QueueAcquire(ctx, p, bad, manyCommon, r)}
	})
	if cr, err := ParseCheck(qs[0]); err != nil || cr != m.Check(now, k, manyCommon, 2) {
		t.Fatalf("queued check: %+v, %v; want the Model's", cr, err)
	}
	if lr, err := ParseLease(qs[1]); err != nil || lr != m.Acquire(now, k, manyCommon, r) {
		t.Fatalf("queued acquire: %+v, %v; want the Model's", lr, err)
	}
	if _, err := ParseCheck(qs[2]); err == nil || qs[2].NoScript() || !strings.Contains(err.Error(), bad.Bucket) {
		t.Fatalf("queued check on a bucket that is not a hash: %v (NOSCRIPT %v), want its own error naming %s", err, qs[2].NoScript(), bad.Bucket)
	}
	if _, err := ParseLease(qs[3]); err == nil || !strings.Contains(err.Error(), bad.Bucket) {
		t.Fatalf("queued acquire on a bucket that is not a hash: %v, want its own error naming %s", err, bad.Bucket)
	}
}

// TestManyKeepsItsDataSetsGeneration: with the restart guard on, a batch
// reads its data set's born sentinel and generation once and writes each
// once, at its end (lib.lua, SENT). Every key's reply (the
// generation it left, whether it re-birthed the data set) and the stored
// state must still be the Model's for one call per key, in order: through
// a batch whose first call stamps a missing sentinel, one whose first call
// finds the generation gone back (a rolled-back Redis) and re-births the
// data set, and batches that only raise it.
func TestManyKeepsItsDataSetsGeneration(t *testing.T) {
	ctx, rdb, sc, _, now := manyRig(t)
	// The scripts' and the Model's views of the generations are their own
	// (each notes what its replies say), as two processes' would be.
	m := NewModel()
	guarded := manyCommon
	guarded.RestartWait = 2 * time.Second
	var keys []Keys
	for i := range BatchKeys + 7 {
		keys = append(keys, KeysFor(DefaultPrefix, quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "read"}))
	}
	gen := keys[0].Gen
	check := modelCheck(ctx, t, rdb, m)
	for round := range 4 {
		switch round {
		case 1:
			// Rolled back: the generation is below what both have seen.
			if err := rdb.Set(ctx, gen, "3", 0).Err(); err != nil {
				t.Fatal(err)
			}
			m.gen[gen] = 3
		case 2:
			// The sentinel lost: the first call that saves a bucket stamps it.
			if err := rdb.Del(ctx, keys[0].Born).Err(); err != nil {
				t.Fatal(err)
			}
			delete(m.born, keys[0].Born)
		}
		now += 1_300_000
		var want []SetRateResult
		want, now = installThenRead(ctx, rdb, sc, m, check, round, keys, guarded, now, func(i int) SetRateItem {
			return SetRateItem{Rate: float64(1 + i%5), Burst: float64(1 + i%9), ExpiryUS: now + 3_000_000, IssuedUS: now}
		})
		if round == 1 && !want[0].Reply.Reborn {
			t.Fatal("round 1: the Model's first call did not re-birth the rolled-back data set")
		}
	}
}

// TestManyHoldsTheClock: a batch's keys are read at one instant, its one
// reading of TIME (clock.lua, hold_clock), and the clock runs on after it.
func TestManyHoldsTheClock(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	sc := New()
	var reads []KeyCommon
	for i := range BatchKeys {
		reads = append(reads, KeyCommon{Keys: KeysFor(DefaultPrefix, quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "read"}), Common: manyCommon})
	}
	var last int64
	for round := range 3 {
		res := sc.StateMany(ctx, rdb, reads)
		for i, r := range res {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			if r.State.NowUS != res[0].State.NowUS {
				t.Fatalf("round %d: key %d read at %d µs, key 0 at %d µs: one batch, two instants", round, i, r.State.NowUS, res[0].State.NowUS)
			}
		}
		if res[0].State.NowUS < last {
			t.Fatalf("round %d: read at %d µs, before the batch before it (%d µs)", round, res[0].State.NowUS, last)
		}
		last = res[0].State.NowUS
		one, err := sc.State(ctx, rdb, reads[0].Keys, manyCommon)
		if err != nil {
			t.Fatal(err)
		}
		if one.NowUS < last {
			t.Fatalf("round %d: a call after the batch read %d µs, before the batch's %d µs", round, one.NowUS, last)
		}
	}
}
