package luascripts

import (
	"context"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

var expiryCommon = Common{
	StaticRate: 100, StaticBurst: 1000, LeaseTTL: time.Second, Reclaim: true,
	ReapBudget: 2, DemandWindow: 500 * time.Millisecond,
}

// expiryLease opens (or renews) inst's lease on k: seq is the instance's
// report number, the lease number 1.
func expiryLease(inst string, seq uint64) Report {
	return Report{Instance: inst, Incarnation: 7, Lease: 1, Seq: seq, Want: 10, Min: 1}
}

// TestExpirySetOnlyBeyondFewLeases: a key keeps no expiry set while it has
// at most fewLeases leases and one holding every lease's expiry while it has
// more; leases are reaped oldest first (ties by id) either way, exactly as
// the Model reaps them, and the set goes when the leases fall back to few.
func TestExpirySetOnlyBeyondFewLeases(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	sc := newVirtual()
	m := NewModel()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	now := int64(1_800_000_000_000_000)
	check := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: reply differs\n lua:   %+v\n model: %+v", what, got, want)
		}
		rs, ms := snapshot(ctx, t, rdb), m.Snapshot()
		if !reflect.DeepEqual(rs, ms) {
			t.Fatalf("%s: state differs\n redis: %v\n model: %v", what, rs, ms)
		}
		recs := recordsOf(rs[k.Bucket])
		live := int64(len(recs))
		_, set := rs[k.Expiry]
		if set != (live > fewLeases) {
			t.Fatalf("%s: %d leases, expiry set present %v; want one only beyond %d leases", what, live, set, fewLeases)
		}
		if set && len(rs[k.Expiry]) != len(recs) {
			t.Fatalf("%s: expiry set %v does not index the leases %v", what, rs[k.Expiry], recs)
		}
	}
	at := func(us int64) { now = us; sc.setNow(now) }
	// Seven instances: three at one instant (expiring together, reaped by
	// id), four 100ms later; i-c and i-b renew at +50ms and +150ms.
	ids := []string{"i-c", "i-a", "i-b", "i-g", "i-e", "i-f", "i-d"}
	start := now
	for i, id := range ids {
		at(start + int64(i/3)*100_000)
		want := m.Acquire(now, k, expiryCommon, expiryLease(id, 1))
		got, err := sc.Acquire(ctx, rdb, k, expiryCommon, expiryLease(id, 1))
		if err != nil {
			t.Fatal(err)
		}
		check("acquire "+id, got, want)
	}
	for i, id := range []string{"i-c", "i-b"} {
		at(start + 50_000 + int64(i)*100_000)
		want := m.Sync(now, k, expiryCommon, expiryLease(id, 2))
		got, err := sc.Sync(ctx, rdb, k, expiryCommon, expiryLease(id, 2))
		if err != nil {
			t.Fatal(err)
		}
		check("renew "+id, got, want)
	}
	// Every lease has expired by +1.2s; each read reaps at most two.
	at(start + 1_200_000)
	for round := 0; round < 5; round++ {
		want := m.State(now, k, expiryCommon)
		got, err := sc.State(ctx, rdb, k, expiryCommon)
		if err != nil {
			t.Fatal(err)
		}
		check("state round "+strconv.Itoa(round), got, want)
	}
	if n := len(leaseRecords(ctx, t, rdb, k)); n != 0 {
		t.Fatalf("%d leases left after every one expired", n)
	}
}

// TestExpirySetFromOlderScripts: a Redis written by older scripts, which
// kept an expiry set however few the leases (and the lease records in a
// hash of their own, moved into the bucket by the first call that loads
// it: lib.lua, "Layouts"), is read correctly: a key with
// few leases and a full set is reaped from its records and loses the set
// at its next lease write; a key with many leases whose set misses some
// (older and newer scripts serving it side by side during a rolling
// upgrade) has its set rebuilt before it is read, so no expired lease is
// left holding tokens.
func TestExpirySetFromOlderScripts(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	sc := newVirtual()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "write"})
	now := int64(1_800_000_000_000_000)
	at := func(us int64) { now = us; sc.setNow(now) }
	acquire := func(id string, seq uint64) {
		t.Helper()
		if lr, err := sc.Sync(ctx, rdb, k, expiryCommon, expiryLease(id, seq)); err != nil || lr.Granted != 10 {
			t.Fatalf("lease %s: %+v, %v", id, lr, err)
		}
	}
	olderSet := func(ids ...string) {
		t.Helper()
		toOlderLayout(ctx, t, rdb, k)
		for _, id := range ids {
			rec, err := rdb.HGet(ctx, k.Leases, id).Result()
			if err != nil {
				t.Fatal(err)
			}
			l, err := ParseLeaseRecord(rec)
			if err != nil {
				t.Fatal(err)
			}
			if err := rdb.ZAdd(ctx, k.Expiry, redis.Z{Score: float64(l.ExpiryUS), Member: id}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	outstanding := func() int64 {
		t.Helper()
		st, err := sc.State(ctx, rdb, k, expiryCommon)
		if err != nil {
			t.Fatal(err)
		}
		return st.Outstanding
	}

	// Few leases, a full set: i-a expires first and is reaped from its
	// record; i-b's next lease write deletes the set.
	start := now
	at(start)
	acquire("i-a", 1)
	at(start + 500_000)
	acquire("i-b", 1)
	olderSet("i-a", "i-b")
	at(start + 1_100_000)
	if out := outstanding(); out != 10 {
		t.Fatalf("outstanding %d after i-a expired, want 10 (i-b's)", out)
	}
	if rdb.Exists(ctx, k.Leases).Val() != 0 {
		t.Fatal("the older lease hash outlived a call")
	}
	if leaseRecordOf(ctx, t, rdb, k, "i-a") != "" || leaseRecordOf(ctx, t, rdb, k, "i-b") == "" {
		t.Fatalf("records %v after i-a expired, want i-b's alone", leaseRecords(ctx, t, rdb, k))
	}
	acquire("i-b", 2)
	if rdb.Exists(ctx, k.Expiry).Val() != 0 {
		t.Fatal("the older set outlived a lease write on a key with few leases")
	}

	// Many leases, a set that misses the three that expire first.
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	start = now + 10_000_000
	ids := []string{"i-0", "i-1", "i-2", "i-3", "i-4", "i-5"}
	for i, id := range ids {
		at(start + int64(i/3)*500_000)
		acquire(id, 1)
	}
	if err := rdb.Del(ctx, k.Expiry).Err(); err != nil {
		t.Fatal(err)
	}
	olderSet("i-3", "i-4", "i-5")
	at(start + 1_100_000)
	// Two reads (reap budget 2) take the three expired leases back.
	outstanding()
	if out := outstanding(); out != 30 {
		t.Fatalf("outstanding %d after i-0..i-2 expired, want 30 (i-3..i-5's)", out)
	}
	if got := rdb.ZRange(ctx, k.Expiry, 0, -1).Val(); len(got) != 0 {
		t.Fatalf("expiry set %v left for three leases", got)
	}
	if n := len(leaseRecords(ctx, t, rdb, k)); n != 3 {
		t.Fatalf("%d leases left, want 3", n)
	}
}
