package lease

import (
	"math"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestSizingMeasuresDemandOverAMinimumWindow: demand is measured over at
// least max(Refresh/20, 10ms), so a burst in a key's first milliseconds
// sizes its batch at that rate, not at an absurd one; a window that long
// is folded into the demand EWMA, a shorter one is not yet.
func TestSizingMeasuresDemandOverAMinimumWindow(t *testing.T) {
	kOpen := quota.Key{Tenant: "acme", Class: "open"}
	for _, tc := range []struct {
		refresh, after time.Duration
		want           int64   // the acquire's want: 1.5 refreshes at the measured rate
		rate           float64 // the demand EWMA afterwards
	}{
		{refresh: time.Second, after: 10 * time.Millisecond, want: 150},            // 5 tokens / 50ms
		{refresh: time.Second, after: 50 * time.Millisecond, want: 150, rate: 100}, // a whole window
		{refresh: 100 * time.Millisecond, after: 5 * time.Millisecond, want: 75},   // 5 tokens / 10ms
		{refresh: 100 * time.Millisecond, after: 10 * time.Millisecond, want: 75, rate: 500},
	} {
		tb := newTestTable(t, func(o *TableOptions) { o.Refresh = tc.refresh })
		// Five tokens of demand while the region was unreachable.
		if _, err := tb.Fallback(t0, kOpen, 5); err != nil {
			t.Fatal(err)
		}
		at := t0.Add(tc.after)
		if _, act := allow(t, tb, at, kOpen, 1); act != ActAcquire {
			t.Fatalf("action %v, want acquire", act)
		}
		b, _ := tb.PrepareAcquire(at, kOpen, 1)
		if got := b.Reports[0].Want; got != tc.want {
			t.Errorf("refresh %v, 5 tokens then an acquire %v later: want %d, expected %d", tc.refresh, tc.after, got, tc.want)
		}
		if got := state(t, tb, kOpen).Rate; got != tc.rate {
			t.Errorf("refresh %v, acquire %v later: demand EWMA %v, want %v", tc.refresh, tc.after, got, tc.rate)
		}
	}
}

// TestSizingEWMATimeConstant: the demand EWMA decays with a time constant
// of two refreshes: after an idle window of dt it keeps exp(−dt/2Refresh)
// of its value.
func TestSizingEWMATimeConstant(t *testing.T) {
	tb := newTestTable(t)
	allow(t, tb, t0, kW, 1)
	b, _ := tb.PrepareAcquire(t0, kW, 1000)
	if err := tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 1000)}); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		allow(t, tb, t0.Add(time.Duration(i)*time.Millisecond), kW, 1)
	}
	sync := func(at time.Time) float64 {
		t.Helper()
		syncs, _ := tb.PrepareSync(at)
		if err := tb.Apply(at, syncs[0], []*sluicev1.Grant{regionGrant(syncs[0].Reports[0], 0)}); err != nil {
			t.Fatal(err)
		}
		return state(t, tb, kW).Rate
	}
	if got := sync(t0.Add(time.Second)); got != 100 {
		t.Fatalf("100 tokens in the first second: rate %v, want 100", got)
	}
	for _, tc := range []struct {
		at   time.Duration
		want float64
	}{
		{2 * time.Second, 100 * math.Exp(-0.5)}, // idle for 1s
		{4 * time.Second, 100 * math.Exp(-1.5)}, // then idle for 2s
	} {
		if got := sync(t0.Add(tc.at)); math.Abs(got-tc.want) > 1e-9 {
			t.Fatalf("idle until %v: rate %v, want %v", tc.at, got, tc.want)
		}
	}
}

// TestSizingBatchCap: a lone instance's batch never exceeds the region's
// whole burst (one token of a burst below one), and each of n live
// instances gets at most burst/2n, however fast the region refills: the
// batches out (held, or spent and not reported yet) then fill at most
// half the region's cap, and its bucket keeps room to refill every
// instance at once. Fails on a cap of max(burst/n, rate × refresh / n),
// which gave each of four instances 3 of a cap of 10 refilled at 10/s.
func TestSizingBatchCap(t *testing.T) {
	for _, tc := range []struct {
		name        string
		burst, rate float64
		live        int64
		want        int64
	}{
		{"lone instance, burst 0.5", 0.5, 1000, 1, 1},
		{"two instances, burst 400", 400, 100, 2, 100},
		{"four instances, burst 10 at 10/s", 10, 10, 4, 1},
		{"four instances, burst 40 at 1000/s", 40, 1000, 4, 5},
		{"eight instances, burst 10: one token each", 10, 10, 8, 1},
		// A region that did not say how many instances are live (an
		// older server) counts as one: the whole burst.
		{"live instances not said, burst 400", 400, 100, 0, 300},
	} {
		tb := newTestTable(t)
		region := func(g *sluicev1.Grant) { g.RegionBurst, g.RegionRate, g.LiveInstances = tc.burst, tc.rate, tc.live }
		acquire(t, tb, t0, t0, kW, 10, 10, region)
		for range 10 {
			allow(t, tb, t0, kW, 1)
		}
		// 10 tokens in the first 10ms: 200/s, a batch of 300 uncapped.
		at := t0.Add(10 * time.Millisecond)
		allow(t, tb, at, kW, 1)
		b, _ := tb.PrepareAcquire(at, kW, 1)
		if got := b.Reports[0].Want; got != tc.want {
			t.Errorf("%s: want %d, expected the cap %d", tc.name, got, tc.want)
		}
	}
}

// TestSizingLowWaterLead: the low-water mark is the demand of
// max(2 × RTT, Refresh/4), so a refill started there arrives before the
// pool runs dry, but at most half the target batch; a mark of less than a
// token is one token.
func TestSizingLowWaterLead(t *testing.T) {
	for _, tc := range []struct {
		rtt    time.Duration
		tokens int // spent in 2 s
		want   int64
	}{
		{rtt: 0, tokens: 400, want: 50},                       // 200/s × 250ms
		{rtt: 300 * time.Millisecond, tokens: 400, want: 120}, // 200/s × 600ms
		{rtt: time.Second, tokens: 400, want: 150},            // 200/s × 2s, capped at 300/2
		{rtt: 0, tokens: 4, want: 1},                          // 2/s × 250ms = half a token; a target of 3
	} {
		tb := newTestTable(t)
		allow(t, tb, t0, kW, 1)
		b, _ := tb.PrepareAcquire(t0, kW, 1000)
		if err := tb.Apply(t0.Add(tc.rtt), b, []*sluicev1.Grant{regionGrant(b.Reports[0], 1000)}); err != nil {
			t.Fatal(err)
		}
		for i := range tc.tokens {
			allow(t, tb, t0.Add(tc.rtt+time.Duration(i*400/tc.tokens)*time.Millisecond), kW, 1)
		}
		// tokens in 2s: 400 are 200/s, a target batch of 300.
		at := t0.Add(2 * time.Second)
		syncs, _ := tb.PrepareSync(at)
		if err := tb.Apply(at.Add(tc.rtt), syncs[0], []*sluicev1.Grant{regionGrant(syncs[0].Reports[0], 0)}); err != nil {
			t.Fatal(err)
		}
		if st := state(t, tb, kW); st.LowWater != tc.want {
			t.Errorf("round trips of %v at %d tokens/s: low water %d, want %d", tc.rtt, tc.tokens/2, st.LowWater, tc.want)
		}
	}
}

// TestSizingCapHeldMark: after a grant that left the region's bucket and
// the pool filling the region's burst, the low-water mark sits the room
// the bucket had left below the pool (at least a sixteenth of the burst,
// at least one token); a bucket left empty (remaining 0) is such a grant
// too. A grant that left room for the whole pool, a region that did not
// say its burst or its remaining tokens (negative) keep the usual mark.
func TestSizingCapHeldMark(t *testing.T) {
	for _, tc := range []struct {
		name             string
		burst            float64
		remaining, grant int64
		want             int64
	}{
		{"burst 8, bucket emptied", 8, 0, 8, 7},
		{"burst 1000, bucket emptied", 1000, 0, 1000, 1000 - 62},
		{"burst 1000, room for the pool", 1000, 0, 10, 0},
		// A burst of one token (a cap the global tier lowered under a
		// pool it had filled): report after the first token spent.
		{"burst 1, pool above it", 1, 0, 3, 2},
		{"burst not said", 0, 0, 10, 0},
		{"remaining not said", 1000, -1, 1000, 0},
	} {
		tb := newTestTable(t)
		region := func(g *sluicev1.Grant) {
			g.RegionRate, g.RegionBurst, g.Limit, g.Remaining = 1000, tc.burst, 1000, tc.remaining
		}
		// The first acquire: no demand measured yet, so the usual mark is 0.
		acquire(t, tb, t0, t0, kW, tc.grant, tc.grant, region)
		if st := state(t, tb, kW); st.Tokens != tc.grant || st.LowWater != tc.want {
			t.Errorf("%s: pool %d, low water %d; want %d and %d", tc.name, st.Tokens, st.LowWater, tc.grant, tc.want)
		}
	}
}

// TestSizingEarlyReportOnlyWhenDrainingTheRegion: at the cap-held mark an
// early report goes out only when this instance's demand since its batch
// came, times the key's live instances, reaches the region's rate (equal
// counts; a region rate not said counts as not drained).
func TestSizingEarlyReportOnlyWhenDrainingTheRegion(t *testing.T) {
	const fast = 1500 * time.Microsecond // 667 tokens/s
	for _, tc := range []struct {
		rate  float64
		live  int64
		every time.Duration
		early bool
	}{
		{rate: 1000, live: 1, every: fast, early: false},
		{rate: 1000, live: 2, every: fast, early: true},
		{rate: 1, live: 1, every: fast, early: true},
		{rate: 0, live: 1, every: fast, early: false},
		{rate: 500, live: 1, every: 2 * time.Millisecond, early: true}, // exactly 500/s
		// A region that did not say how many instances are live counts as one.
		{rate: 1000, live: 0, every: fast, early: false},
		{rate: 600, live: 0, every: fast, early: true},
	} {
		tb := newTestTable(t)
		region := func(remaining int64) func(*sluicev1.Grant) {
			return func(g *sluicev1.Grant) {
				g.RegionRate, g.RegionBurst, g.Limit, g.LiveInstances, g.Remaining = tc.rate, 2000, 2000, tc.live, remaining
			}
		}
		acquire(t, tb, t0, t0, kW, 1, 100, region(1900))
		for i := range 100 {
			allow(t, tb, t0.Add(time.Duration(i)*500*time.Microsecond), kW, 1)
		}
		now := t0.Add(50 * time.Millisecond)
		// The bucket keeps 1100 and the pool gets 900: they fill the burst,
		// so the mark is a sixteenth of it (125) below the pool.
		acquire(t, tb, now, now, kW, 1, 900, region(1100))
		if st := state(t, tb, kW); st.LowWater != 900-125 {
			t.Fatalf("rate %v live %d: low water %d, want %d", tc.rate, tc.live, st.LowWater, 900-125)
		}
		for range 125 {
			now = now.Add(tc.every)
			allow(t, tb, now, kW, 1)
		}
		b := tb.PrepareRefill(now)
		if got := b != nil; got != tc.early {
			t.Errorf("region rate %v, %d live, a token every %v here: early report %v, want %v", tc.rate, tc.live, tc.every, got, tc.early)
		}
	}
}

// TestSizingSyncGivesBackAPoolAboveTheBatchCap: a pool above the batch
// cap (a request's need granted beyond it, or a batch sized before more
// instances were live) is brought back to the target at the next Sync,
// even below twice the target, so the batches out stay within half the
// region's cap.
func TestSizingSyncGivesBackAPoolAboveTheBatchCap(t *testing.T) {
	tb := newTestTable(t)
	// Burst 40 over four live instances: a batch cap of 5.
	region := func(g *sluicev1.Grant) { g.RegionBurst, g.RegionRate, g.LiveInstances = 40, 1000, 4 }
	acquire(t, tb, t0, t0, kW, 12, 12, region)
	for i := range 4 {
		if d, _ := allow(t, tb, t0.Add(time.Duration(i)*250*time.Millisecond), kW, 1); !d.Allowed {
			t.Fatalf("token %d of a pool of 12: %+v", i, d)
		}
	}
	at := t0.Add(time.Second)
	syncs, _ := tb.PrepareSync(at)
	r := syncs[0].Reports[0]
	if r.Returned != 3 || r.Want != 0 || state(t, tb, kW).Tokens != 5 {
		t.Fatalf("a pool of 8 at a batch cap of 5, demand 4/s: returned %d, want %d, pool %d; expected 3 returned, 0 wanted, 5 kept",
			r.Returned, r.Want, state(t, tb, kW).Tokens)
	}
}

// spendWindow spends demand tokens of kW over the second from *now
// (asking the region whenever the pool runs dry), then sends the periodic
// Sync at its end, granted what it wants by a region as region says, and
// moves *now there. It returns the Sync's report.
func spendWindow(t *testing.T, tb *Table, now *time.Time, demand int64, region func(*sluicev1.Grant)) *sluicev1.KeyReport {
	t.Helper()
	for i := range demand {
		at := now.Add(time.Duration(i) * time.Second / time.Duration(demand))
		if _, act := allow(t, tb, at, kW, 1); act == ActAcquire {
			b, _ := tb.PrepareAcquire(at, kW, 1)
			if err := tb.Apply(at, b, []*sluicev1.Grant{regionGrant(b.Reports[0], b.Reports[0].Want, region)}); err != nil {
				t.Fatal(err)
			}
			allow(t, tb, at, kW, 1)
		}
	}
	*now = now.Add(time.Second)
	return syncAt(t, tb, *now, region)
}

// syncAt runs kW's periodic Sync at at, the region granting what it asks,
// and returns its report.
func syncAt(t *testing.T, tb *Table, at time.Time, region func(*sluicev1.Grant)) *sluicev1.KeyReport {
	t.Helper()
	syncs, _ := tb.PrepareSync(at)
	r := syncs[0].Reports[0]
	if err := tb.Apply(at, syncs[0], []*sluicev1.Grant{regionGrant(r, r.Want, region)}); err != nil {
		t.Fatal(err)
	}
	return r
}

// steadyLease is a table whose lease of kW has run two one-second windows
// at perSecond requests a second, and the time after them.
func steadyLease(t *testing.T, perSecond int64, region func(*sluicev1.Grant)) (*Table, time.Time) {
	t.Helper()
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 1, region)
	now := t0
	spendWindow(t, tb, &now, perSecond, region)
	spendWindow(t, tb, &now, perSecond, region)
	return tb, now
}

// TestLoneInstanceBelowItsRegionsRateLeavesHalfTheBurst: a lone instance
// holds the region's whole burst only while its demand drains the region
// (at least the region's rate); below it, half, so the rest stays in the
// bucket, where a grant that lowers the region's cap clips it and the
// global tier may move it (docs/architecture.md, "Burst transfer"). The
// test of draining reads the window just measured, not the sizing rate,
// which falls only gradually: the first Sync after demand fell gives the
// pool back down to half the burst.
func TestLoneInstanceBelowItsRegionsRateLeavesHalfTheBurst(t *testing.T) {
	region := func(g *sluicev1.Grant) { g.RegionRate, g.RegionBurst, g.LiveInstances = 100, 400, 1 }
	tb, now := steadyLease(t, 300, region)
	if st := state(t, tb, kW); st.Tokens != 400 {
		t.Fatalf("at 300/s on a region of 100/s: pool %d, want the whole burst 400", st.Tokens)
	}
	r := spendWindow(t, tb, &now, 50, region)
	st := state(t, tb, kW)
	if st.Rate <= 100 {
		t.Fatalf("demand EWMA %v after one window at 50/s; the test needs it still above the region's rate", st.Rate)
	}
	if st.Tokens > 200 || r.Returned == 0 {
		t.Fatalf("after demand fell to 50/s: pool %d, report returned %d; want the pool given back to half the burst (200)", st.Tokens, r.Returned)
	}
}

// TestHalfBurstBatchSetsItsOwnLowWater: the answer to a Sync that sized
// a lone instance's batch at half the burst (its demand just fell below
// the region's rate, its sizing rate not yet) sets the low-water mark
// from that batch, not from the whole burst: a mark at the pool itself
// would send an early refill at once after every answer.
func TestHalfBurstBatchSetsItsOwnLowWater(t *testing.T) {
	region := func(g *sluicev1.Grant) { g.RegionRate, g.RegionBurst, g.LiveInstances = 1000, 200, 1 }
	tb, now := steadyLease(t, 1500, region)
	spendWindow(t, tb, &now, 900, region)
	st := state(t, tb, kW)
	if st.Rate <= 1000 || st.Tokens > 100 {
		t.Fatalf("after 900/s on a region of 1000/s: EWMA %v, pool %d; the test needs the EWMA above the region's rate and the pool at half the burst (100)", st.Rate, st.Tokens)
	}
	if st.LowWater >= st.Tokens {
		t.Errorf("low water %d with a pool of %d: the mark of a whole-burst batch", st.LowWater, st.Tokens)
	}
	if b := tb.PrepareRefill(now); b != nil {
		t.Errorf("early refill right after the answer: %v, want none", b.Reports)
	}
}
