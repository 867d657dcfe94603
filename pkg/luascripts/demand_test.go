package luascripts

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// demandT0 is the virtual Redis time (µs) the demand tests start at.
const demandT0 = int64(1_800_000_000_000_000)

// demandKey is one key with a half-second demand window.
func demandKey() (Keys, Common) {
	c := Common{StaticRate: 1000, StaticBurst: 2000, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8,
		DemandWindow: 500 * time.Millisecond}
	return KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"}), c
}

// TestLeaseDemandReading follows the per-lease demand windows on a real
// redis-server: a window closes at the first report at least DemandWindow
// after it opened, the key's reading is the sum of its leases' last rates,
// retries change nothing, and a lease's rate leaves the sum when the lease
// is released or reaped. The strict path counts into its own counter.
func TestLeaseDemandReading(t *testing.T) {
	w := newTwin(t)
	k, c := demandKey()
	rdb, sc, ctx := w.rdb, w.sc, w.ctx
	at := func(d time.Duration) { w.at(demandT0 + d.Microseconds()) }
	seq := map[string]uint64{}
	totals := map[string][2]int64{}
	// report adds used and denied to the instance's cumulative totals.
	report := func(inst string, used, denied int64) Report {
		seq[inst]++
		tot := totals[inst]
		tot[0] += used
		tot[1] += denied
		totals[inst] = tot
		return Report{Instance: inst, Incarnation: 42, Lease: 1, Seq: seq[inst], Used: tot[0], Denied: tot[1], Want: 100, Min: 1}
	}
	// Until the older record below, the Model is driven alongside and
	// must read the same.
	reading := func(want float64, strict int64) {
		t.Helper()
		if st := w.state(k, c); st.LeaseDemand != want || st.StrictDemand != strict {
			t.Fatalf("lease demand %v/s, strict %d; want %v/s, %d", st.LeaseDemand, st.StrictDemand, want, strict)
		}
	}

	at(0)
	w.acquire(k, c, report("i-a", 0, 0))
	w.acquire(k, c, report("i-b", 7, 0)) // what a first report brings covers no known window
	reading(0, 0)

	at(time.Second)
	w.sync(k, c, report("i-a", 80, 20))
	w.sync(k, c, report("i-b", 50, 0))
	reading(150, 0)

	// A refill 200ms into the next window is too soon to close it: its
	// usage waits for the next report.
	at(1200 * time.Millisecond)
	refill := report("i-a", 30, 0)
	w.acquire(k, c, refill)
	reading(150, 0)
	w.acquire(k, c, refill) // a retry books nothing
	at(1600 * time.Millisecond)
	w.acquire(k, c, refill)
	reading(150, 0)

	at(2 * time.Second)
	w.sync(k, c, report("i-a", 50, 0))
	reading(80+50, 0) // i-a: 80 tokens over 1s; i-b unchanged

	// i-b's window opened at 1s: 3 tokens over 1.75s, kept to a thousandth.
	at(2750 * time.Millisecond)
	w.sync(k, c, report("i-b", 1, 2))
	reading(81.714, 0)

	w.check(k, c, 5)
	w.check(k, c, 3000) // denied, still demand
	reading(81.714, 3005)

	w.release(k, c, report("i-b", 0, 0))
	reading(80, 3005)

	// i-a's lease expires 5s after its last grant (at 2s) and is reaped.
	at(7*time.Second + time.Microsecond)
	reading(0, 3005)

	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	reading = func(want float64, strict int64) {
		t.Helper()
		st, err := sc.State(ctx, rdb, k, c)
		if err != nil {
			t.Fatal(err)
		}
		if st.LeaseDemand != want || st.StrictDemand != strict {
			t.Fatalf("lease demand %v/s, strict %d; want %v/s, %d", st.LeaseDemand, st.StrictDemand, want, strict)
		}
	}
	// A lease record written by older scripts (six fields, in the lease
	// hash of their layout) has no fingerprint: a report on it is a
	// conflict and forfeits it; the next report opens a lease, and a
	// window, of its own.
	at(8 * time.Second)
	exp := demandT0 + (12 * time.Second).Microseconds()
	toOlderLayout(ctx, t, rdb, k)
	if err := rdb.HSet(ctx, k.Leases, "i-old", "10 0 0 1 "+itoa(exp)+" 10").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, k.Expiry, redisZ(exp, "i-old")).Err(); err != nil {
		t.Fatal(err)
	}
	seq["i-old"] = 1
	at(9 * time.Second)
	if lr, err := sc.Sync(ctx, rdb, k, c, report("i-old", 10, 0)); err != nil || !lr.Conflict || lr.Granted != 0 {
		t.Fatalf("report on an older record: %+v, %v; want a conflict granting nothing", lr, err)
	}
	if st, err := sc.State(ctx, rdb, k, c); err != nil || st.Outstanding != 0 {
		t.Fatalf("forfeited record still outstanding: %+v, %v", st, err)
	}
	must(sc.Sync(ctx, rdb, k, c, report("i-old", 10, 0)))
	reading(0, 3005)
	rec, err := rdb.HGet(ctx, k.Bucket, leaseField("i-old")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if l, err := ParseLeaseRecord(rec); err != nil || !l.Fingerprint || l.WindowStartUS != demandT0+(9*time.Second).Microseconds() {
		t.Fatalf("new record %q (%+v, %v): want a fingerprint and the window opened at the report", rec, l, err)
	}
	at(10 * time.Second)
	must(sc.Sync(ctx, rdb, k, c, report("i-old", 25, 0)))
	reading(25, 3005)
}

// TestDemandReadingCarriesAcrossANewLease: an instance that starts a new
// lease on a key while the region still holds its earlier one (the earlier
// lease's final report never arrived) keeps its demand in the key's
// reading. The superseded record is forfeited, and the new lease starts
// from its rate until its own first window closes; before, the reading
// fell to nothing for that window, and the region reported the key idle.
func TestDemandReadingCarriesAcrossANewLease(t *testing.T) {
	w := newTwin(t)
	k, c := demandKey()
	at := func(d time.Duration) { w.at(demandT0 + d.Microseconds()) }
	sync := func(r Report) LeaseReply {
		t.Helper()
		lr := w.sync(k, c, r)
		if lr.Conflict {
			t.Fatalf("sync %+v: %+v", r, lr)
		}
		return lr
	}
	rep := func(inst string, lease, seq uint64, used, denied int64) Report {
		return Report{Instance: inst, Incarnation: 42, Lease: lease, Seq: seq, Used: used, Denied: denied, Want: 100, Min: 1}
	}

	at(0)
	sync(rep("i-a", 1, 1, 0, 0))
	sync(rep("i-b", 2, 2, 0, 0))
	at(time.Second)
	sync(rep("i-a", 1, 3, 90, 10))
	sync(rep("i-b", 2, 4, 20, 0))
	if st := w.state(k, c); st.LeaseDemand != 120 {
		t.Fatalf("reading %v/s, want 120", st.LeaseDemand)
	}

	// i-a starts lease 5 while the region still holds lease 1 (200 tokens
	// out, of which 90 spent): lease 1 is forfeited (its 110 unspent tokens
	// never return to the bucket) and its 100/s stays in the reading.
	at(1200 * time.Millisecond)
	if lr := sync(rep("i-a", 5, 5, 0, 0)); lr.Granted != 100 {
		t.Fatalf("new lease granted %d, want 100", lr.Granted)
	}
	if st := w.state(k, c); st.LeaseDemand != 120 || st.Outstanding != 280 {
		t.Fatalf("after the new lease: reading %v/s, outstanding %d; want 120/s, 280 (i-b's 180 and the new lease's 100)",
			st.LeaseDemand, st.Outstanding)
	}
	// Its first window (opened at 1.2s) closes and replaces the carried rate.
	at(2200 * time.Millisecond)
	sync(rep("i-a", 5, 6, 30, 0))
	if st := w.state(k, c); st.LeaseDemand != 50 {
		t.Fatalf("after the new lease's first window: reading %v/s, want 30 + 20", st.LeaseDemand)
	}
	// Its rate leaves the reading when it is released.
	w.release(k, c, rep("i-a", 5, 7, 30, 0))
	if st := w.state(k, c); st.LeaseDemand != 20 {
		t.Fatalf("after the release: reading %v/s, want 20", st.LeaseDemand)
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func redisZ(score int64, member string) redis.Z {
	return redis.Z{Score: float64(score), Member: member}
}

func TestParseLeaseRecord(t *testing.T) {
	l, err := ParseLeaseRecord("120 70 10 4 1800000005000000 30 1800000004000000 12 81714")
	if err != nil {
		t.Fatal(err)
	}
	want := LeaseRecord{Granted: 120, Used: 70, Returned: 10, Seq: 4, ExpiryUS: 1800000005000000, LastGrant: 30,
		WindowStartUS: 1800000004000000, WindowDemand: 12, DemandRate: 81.714}
	if l != want || l.Unspent() != 40 {
		t.Fatalf("got %+v (unspent %v), want %+v", l, l.Unspent(), want)
	}
	l, err = ParseLeaseRecord("120 70 10 4 1800000005000000 30 1800000004000000 12 81714 75 3 10 2 18446744073709551615")
	if err != nil || !l.Fingerprint || l.AppliedUsed != 75 || l.AppliedDenied != 3 || l.AppliedReturned != 10 || l.Lease != 2 ||
		l.Incarnation != "18446744073709551615" {
		t.Fatalf("fourteen-field record: %+v %v", l, err)
	}
	if l, err := ParseLeaseRecord("10 0 0 1 99 10"); err != nil || l.Granted != 10 || l.WindowStartUS != 0 || l.DemandRate != 0 {
		t.Fatalf("six-field record: %+v %v", l, err)
	}
	for _, bad := range []string{"", "1 2 3", "1 2 3 4 5 x", "1 2 3 4 5 6 7"} {
		if _, err := ParseLeaseRecord(bad); !errors.Is(err, ErrReply) {
			t.Errorf("%q: got %v, want ErrReply", bad, err)
		}
	}
}

// TestLeaseDemandOnBuildTimes: a lease's demand windows are measured on
// the times the instance built its reports, not on their arrival. An
// instance decides 100 tokens each 100ms of its own time; its reports
// arrive after transit delays of 10ms, 400ms, 20ms and 10ms. Measured at
// arrival, the report built 100ms after its predecessor but arriving
// 480ms after it would read as 100 tokens over 480ms (208/s), and the next
// as 100 over 20ms (5000/s); on the build times every window reads 1000/s.
// The Go model agrees.
func TestLeaseDemandOnBuildTimes(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sc := newVirtual()
	m := NewModel()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 100000, StaticBurst: 100000, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8,
		DemandWindow: 50 * time.Millisecond}
	t0 := int64(1_800_000_000_000_000)
	delays := []time.Duration{10 * time.Millisecond, 400 * time.Millisecond, 20 * time.Millisecond, 10 * time.Millisecond}
	for i, delay := range delays {
		built := time.Duration(i) * 100 * time.Millisecond
		arrive := t0 + (built + delay).Microseconds()
		sc.setNow(arrive)
		r := Report{Instance: "i-a", Incarnation: 7, Lease: 1, Seq: uint64(i + 1), Used: int64(i) * 100, Want: 100, Min: 1,
			BuiltUS: built.Microseconds() + 1}
		if _, err := sc.Sync(ctx, rdb, k, c, r); err != nil {
			t.Fatal(err)
		}
		m.Sync(arrive, k, c, r)
		st, err := sc.State(ctx, rdb, k, c)
		if err != nil {
			t.Fatal(err)
		}
		mst := m.State(arrive, k, c)
		want := 1000.0
		if i == 0 {
			want = 0 // the first report opens the window
		}
		if st.LeaseDemand != want || mst.LeaseDemand != want {
			t.Fatalf("report %d (built at %v, arrived %v later): lease demand %v/s (model %v/s), want %v/s",
				i, built, delay, st.LeaseDemand, mst.LeaseDemand, want)
		}
	}
}
