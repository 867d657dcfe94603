package luascripts

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestReleaseOfAManyDigitIncarnation: the incarnation is compared as the
// decimal text the lease record holds, so a release from the process that
// opened the lease hands back its unspent tokens whatever the number's
// digits, and one from another incarnation is a conflict that hands back
// nothing.
func TestReleaseOfAManyDigitIncarnation(t *testing.T) {
	c := Common{StaticRate: 1, StaticBurst: 100, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8,
		DemandWindow: 500 * time.Millisecond}
	for _, tc := range []struct {
		name             string
		opened, released uint64
		returned         int64
		conflict         bool
	}{
		{"same incarnation of two digits", 12, 12, 7, false},
		{"same incarnation near 2^64", 18446744073709551615, 18446744073709551615, 7, false},
		{"another incarnation", 12, 13, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newTwin(t)
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
			if r := w.acquire(k, c, Report{Instance: "i-a", Incarnation: tc.opened, Lease: 1, Seq: 1, Want: 10, Min: 1}); r.Granted != 10 {
				t.Fatalf("acquire: %+v, want 10 granted", r)
			}
			w.at(w.now + 1000)
			r := w.release(k, c, Report{Instance: "i-a", Incarnation: tc.released, Lease: 1, Seq: 2, Used: 3})
			if r.Returned != tc.returned || r.Conflict != tc.conflict {
				t.Fatalf("release: %+v, want returned %d, conflict %v", r, tc.returned, tc.conflict)
			}
		})
	}
}

// TestReportWantingNothingOnAnEmptyBucketWaitsForNothing: a lease's report
// that asks for no tokens is answered without a wait even when the bucket
// is empty; only a report wanting tokens it cannot have gets one.
func TestReportWantingNothingOnAnEmptyBucketWaitsForNothing(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8,
		DemandWindow: 500 * time.Millisecond}
	if r := w.sync(k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 10, Min: 1}); r.Granted != 10 || r.Remaining != 0 {
		t.Fatalf("first sync: %+v, want the whole burst of 10 granted", r)
	}
	r := w.sync(k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 1})
	if r.Granted != 0 || r.RetryAfter != 0 {
		t.Fatalf("a report wanting nothing: %+v, want nothing granted and no wait", r)
	}
	r = w.sync(k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 3, Used: 1, Want: 1, Min: 1})
	if r.Granted != 0 || r.RetryAfter != time.Second {
		t.Fatalf("a report wanting one token: %+v, want nothing granted and a wait of 1s (one token at 1/s)", r)
	}
}

// TestLeaseCallAtAGrantsExpiryOpensNoMarkWindow: a grant is over at its
// expiry instant, so a lease call then on a key without strict demand or
// lease demand leaves the candidate mark window unopened (no cw field), as
// a call on any undemanded key does.
func TestLeaseCallAtAGrantsExpiryOpensNoMarkWindow(t *testing.T) {
	w, k, c, end := withGrantEndingInASecond(t)
	w.at(end)
	if r := w.sync(k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 5, Min: 1}); r.Granted != 5 {
		t.Fatalf("sync at the grant's expiry: %+v, want 5 granted", r)
	}
	if n := w.rdb.HExists(w.ctx, k.Bucket, "cw").Val(); n {
		t.Fatalf("mark window opened by a call at the grant's expiry without demand: %v", w.rdb.HGetAll(w.ctx, k.Bucket).Val())
	}
}
