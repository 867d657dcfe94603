package luascripts

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestFewLeasesReapTiesByID: a key with few leases (no expiry set) reaps
// its expired leases from their records in the order the set would give,
// ties of expiry by instance id byte by byte, whatever order the records
// were written in: with a reap budget of one, of two leases opened at the
// same instant (i-b's record first), i-a is reaped first and i-b only by
// the next call, in the scripts and the Model alike.
func TestFewLeasesReapTiesByID(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 100, StaticBurst: 1000, LeaseTTL: time.Second, Reclaim: true, ReapBudget: 1,
		DemandWindow: 500 * time.Millisecond}
	for _, id := range []string{"i-b", "i-a"} {
		if r := w.sync(k, c, Report{Instance: id, Incarnation: 7, Lease: 1, Seq: 1, Want: 10, Min: 1}); r.Granted != 10 {
			t.Fatalf("lease of %s: %+v, want 10 granted", id, r)
		}
	}
	w.at(w.now + 1_000_000)
	w.state(k, c)
	if recs := leaseRecords(w.ctx, t, w.rdb, k); recs["i-a"] != "" || recs["i-b"] == "" {
		t.Fatalf("after one lease reaped the records are %v; want i-a reaped first, i-b left", recs)
	}
	w.state(k, c)
	if n := len(leaseRecords(w.ctx, t, w.rdb, k)); n != 0 {
		t.Fatalf("%d leases left after the second reap, want 0", n)
	}
}

// TestReapOfAnExpiryWithoutARecordRenewsTheKeys: a read that drops an
// expiry-set member with no lease record (left by older scripts, in a set
// of as many members as records, which is not rebuilt) wrote the expiry
// set, so it saves the bucket (the lease records with it) and renews the
// expiry set's TTL with the bucket's, as any call that writes them does,
// even with no token out in the leases.
func TestReapOfAnExpiryWithoutARecordRenewsTheKeys(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	for i := 0; i <= fewLeases; i++ {
		w.sync(k, expiryCommon, expiryLease("i-"+itoa(int64(i)), 1))
	}
	for i := 0; i <= fewLeases; i++ {
		r := expiryLease("i-"+itoa(int64(i)), 2)
		r.Used, r.Want = 10, 0
		w.sync(k, expiryCommon, r)
	}
	// A set of as many members as records is trusted: one record's expiry
	// missing, a member without a record in its place.
	if err := w.rdb.ZRem(w.ctx, k.Expiry, "i-0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := w.rdb.ZAdd(w.ctx, k.Expiry, redisZ(w.now-1, "gone")).Err(); err != nil {
		t.Fatal(err)
	}
	w.at(w.now + 1000)
	var st State
	got := w.pexpires(func() {
		var err error
		if st, err = w.sc.State(w.ctx, w.rdb, k, expiryCommon); err != nil {
			t.Fatalf("a state read over an expiry without a record: %v", err)
		}
	})
	if st.Outstanding != 0 {
		t.Fatalf("outstanding %d, want 0 (every lease spent)", st.Outstanding)
	}
	if w.rdb.ZScore(w.ctx, k.Expiry, "gone").Err() == nil {
		t.Fatal("the expiry without a record is still in the set")
	}
	ttl := got[k.Bucket]
	if ttl <= 0 || got[k.Expiry] != ttl {
		t.Fatalf("TTLs set by the read %v; want the bucket's and the expiry set's alike", got)
	}
}
