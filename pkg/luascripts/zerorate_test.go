package luascripts

import (
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// keyTTLs requires every Redis key of k that exists (bucket, expiry set;
// only those of only, when given) to carry want: exactly in
// the Model (LastTTL), and on the server as PTTL, which counts down in
// real time (a second of slack). It returns the names it checked.
func (w *twin) keyTTLs(k Keys, want time.Duration, only ...string) []string {
	w.t.Helper()
	if len(only) == 0 {
		only = []string{k.Bucket, k.Expiry}
	}
	var names []string
	for _, name := range only {
		n, err := w.rdb.Exists(w.ctx, name).Result()
		if err != nil {
			w.t.Fatal(err)
		}
		if n == 0 {
			continue
		}
		names = append(names, name)
		if m, ok := w.m.LastTTL(name); !ok || m != want {
			w.t.Fatalf("%s: model TTL %v (exists %v), want %v", name, m, ok, want)
		}
		got, err := w.rdb.PTTL(w.ctx, name).Result()
		if err != nil || got > want || got < want-time.Second {
			w.t.Fatalf("%s: PTTL %v (%v), want %v", name, got, err, want)
		}
	}
	sort.Strings(names)
	return names
}

// TestZeroStaticRateKeysExpire: a key used while its region's static rate
// is 0 (a floor of 0: drained, or off the static lease at partition_share
// 0) holds nothing without a grant and never refills, so a bucket
// recreated later is what the old one would be (empty at the floor; at a
// share come back, as full as the old one would be once it is older than
// twice the share's fill time). Its keys get a finite TTL: twice the
// share's fill time (Common.ShareFill) when the caller knows it, at least
// 2 x lease TTL, plus a second, plus the remaining validity of a grant in
// force; never the largest TTL (2^43 ms) a division by the zero rate
// gave, which kept every key a drained region served for good.
func TestZeroStaticRateKeysExpire(t *testing.T) {
	const lease = 2 * time.Second
	floor := Common{StaticRate: 0, StaticBurst: 0, LeaseTTL: lease, Reclaim: true, ReapBudget: 8,
		DemandWindow: 500 * time.Millisecond, MarkEvery: 250 * time.Millisecond}
	least := 2*lease + time.Second // every lease dead, plus a second

	t.Run("floor", func(t *testing.T) {
		w := newTwin(t)
		k := KeysFor(DefaultPrefix, quota.Key{Tenant: "drained", Class: "read"})
		t0 := w.now
		r := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 5, Min: 1}
		if g := w.acquire(k, floor, r); g.Granted != 0 || g.RetryAfter != -1 {
			t.Fatalf("acquire at a floor of 0: %+v, want nothing granted, never", g)
		}
		if c := w.check(k, floor, 1); c.Allowed {
			t.Fatalf("check at a floor of 0: %+v", c)
		}
		w.state(k, floor)
		if got := w.keyTTLs(k, least); !reflect.DeepEqual(got, []string{k.Bucket}) {
			t.Fatalf("keys written %v, want the bucket (holding the lease record)", got)
		}
		if leaseRecordOf(w.ctx, t, w.rdb, k, "i-a") == "" {
			t.Fatal("no lease record in the bucket")
		}
		// Nothing goes a microsecond early; everything of the key goes at
		// its deadline (the lease ended a lease TTL before).
		w.at(t0 + least.Microseconds() - 1)
		if gone := w.expire(); len(gone) != 0 {
			t.Fatalf("expired %v before the deadline", gone)
		}
		w.at(t0 + least.Microseconds())
		if gone := w.expire(); !reflect.DeepEqual(gone, []string{k.Bucket}) {
			t.Fatalf("at the deadline expired %v, want the key's bucket and its lease record", gone)
		}
		// Recreated at the floor it is empty, as the old bucket was.
		if st := w.state(k, floor); st.Tokens != 0 || st.Cap != 0 {
			t.Fatalf("the key read again at the floor: %+v, want empty at a cap of 0", st)
		}
	})

	t.Run("grant in force", func(t *testing.T) {
		// A returning region climbs from its floor of 0 through grants:
		// the keys stay while the grant runs, then as at the floor.
		w := newTwin(t)
		k := KeysFor(DefaultPrefix, quota.Key{Tenant: "returning", Class: "read"})
		t0 := w.now
		end := t0 + 30_000_000
		w.setRate(k, floor, 10, 20, end, t0)
		w.at(t0 + 1_000_000)
		r := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 5, Min: 1}
		if g := w.acquire(k, floor, r); g.Granted != 5 {
			t.Fatalf("acquire under the grant: %+v, want 5", g)
		}
		// 29s of the grant left: the keys stay until it ends (and every
		// lease is dead), plus a second.
		w.keyTTLs(k, max(29*time.Second, 2*lease)+time.Second)
		w.at(end - 1_000_000)
		r.Seq, r.Used = 2, 5
		if g := w.sync(k, floor, r); g.Granted != 5 {
			t.Fatalf("sync a second before the grant's end: %+v, want 5", g)
		}
		// A second left: the lease just renewed (until end + 1s) ends
		// before its keys.
		w.keyTTLs(k, least)
		// Once it expired, a read reaps it (its tokens, at a cap of 0,
		// come back as nothing): the floor's TTL.
		w.at(end + 1_000_000)
		if st := w.state(k, floor); st.Outstanding != 0 || st.Tokens != 0 || st.Cap != 0 {
			t.Fatalf("read at the grant's end: %+v, want nothing held at a cap of 0", st)
		}
		if got := w.keyTTLs(k, least); !reflect.DeepEqual(got, []string{k.Bucket}) {
			t.Fatalf("keys after the last lease was reaped %v, want the bucket alone", got)
		}
		w.at(end + 1_000_000 + least.Microseconds() - 1)
		if gone := w.expire(); len(gone) != 0 {
			t.Fatalf("expired %v before the deadline", gone)
		}
		w.at(end + 1_000_000 + least.Microseconds())
		if gone := w.expire(); !reflect.DeepEqual(gone, []string{k.Bucket}) {
			t.Fatalf("after the grant expired %v, want the bucket", gone)
		}
	})

	t.Run("fill time known", func(t *testing.T) {
		// A class of 100 an hour, burst 100: its share, wherever it comes
		// back, refills within an hour; the keys live two hours, plus the
		// grant's remaining validity, as at the share itself.
		hourly := floor
		hourly.ShareFill = time.Hour
		w := newTwin(t)
		k := KeysFor(DefaultPrefix, quota.Key{Tenant: "drained", Class: "hourly"})
		t0 := w.now
		r := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 5, Min: 1}
		w.acquire(k, hourly, r)
		w.check(k, hourly, 1)
		w.keyTTLs(k, 2*time.Hour+time.Second)
		// A grant renews the bucket's TTL, its lease record's with it.
		w.setRate(k, hourly, 10, 20, t0+30_000_000, t0)
		w.keyTTLs(k, 30*time.Second+2*time.Hour+time.Second, k.Bucket)
		// A floor with a rate but no whole unit of the burst holds nothing
		// either: the same bound, not 2 x lease TTL.
		unit := hourly
		unit.StaticRate = 100.0 / 3600 / 2
		u := KeysFor(DefaultPrefix, quota.Key{Tenant: "halved", Class: "hourly"})
		w.check(u, unit, 1)
		w.keyTTLs(u, 2*time.Hour+time.Second)
		unit.ShareFill = 0
		w.at(t0 + 1)
		w.check(u, unit, 1)
		w.keyTTLs(u, least)
	})
}
