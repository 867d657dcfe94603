package luascripts

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestRebirthDropsTheLeaseRecords: a call that finds its data set gone
// back in time (the generation it had seen is lost) re-births it and
// deletes the key's bucket with its lease records: the leases were issued
// from the lost history, so a report of one, even one that gives back its
// unspent tokens, puts nothing into the newly born bucket, which stays
// empty until the restart wait ends.
func TestRebirthDropsTheLeaseRecords(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 10, StaticBurst: 20, LeaseTTL: time.Second, Reclaim: true, ReapBudget: 8,
		RestartWait: 2 * time.Second, DemandWindow: 500 * time.Millisecond}
	w.check(k, c, 0) // stamps the data set; the bucket refills from the end of the wait
	w.at(w.now + 3_000_000)
	a := Report{Instance: "a", Incarnation: 1, Lease: 1, Seq: 1, Want: 5, Min: 1}
	if lr := w.acquire(k, c, a); lr.Granted != 5 {
		t.Fatalf("acquire: %+v, want 5 granted", lr)
	}
	w.at(w.now + 100_000)
	if err := w.rdb.Del(w.ctx, k.Gen).Err(); err != nil {
		t.Fatal(err)
	}
	delete(w.m.gen, k.Gen)
	a.Seq, a.Used, a.Returned, a.Want = 2, 1, 4, 0
	lr := w.sync(k, c, a)
	if !lr.Reborn || lr.Returned != 0 || lr.Remaining != 0 {
		t.Fatalf("report of a lease issued before the re-birth: %+v, want a re-birth, nothing given back, an empty bucket", lr)
	}
	if n := len(leaseRecords(w.ctx, t, w.rdb, k)); n != 0 {
		t.Fatalf("%d lease records left after the re-birth, want none", n)
	}
}
