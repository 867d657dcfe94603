package lease

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

var (
	t0   = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	kW   = quota.Key{Tenant: "acme", Class: "write"}
	kR   = quota.Key{Tenant: "acme", Class: "read"}
	kExp = quota.Key{Tenant: "acme", Class: "export"}
)

const testTTL = 5 * time.Second

func newTestTable(t *testing.T, mod ...func(*TableOptions)) *Table {
	t.Helper()
	o := TableOptions{Refresh: time.Second, Classes: map[string]ClassPolicy{
		"export": {Mode: ModeStrict, OnFailure: PolicyClosed},
		"open":   {OnFailure: PolicyOpen},
	}}
	for _, f := range mod {
		f(&o)
	}
	tb, err := NewTable(o)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// regionGrant answers r the way the region would: granted tokens, a 5s
// TTL, a lone instance in a region of rate 1000/s and burst 10000.
func regionGrant(r *sluicev1.KeyReport, granted int64, mod ...func(*sluicev1.Grant)) *sluicev1.Grant {
	g := &sluicev1.Grant{
		Key: r.Key, Seq: r.Seq, Granted: granted, TtlMs: testTTL.Milliseconds(),
		RegionRate: 1000, RegionBurst: 10000, LiveInstances: 1, Limit: 10000,
		Mode: "lease", OnFailure: "local", Tier: "pro", ResetMs: 100,
	}
	for _, f := range mod {
		f(g)
	}
	return g
}

func allow(t *testing.T, tb *Table, now time.Time, key quota.Key, cost int64) (quota.Decision, Action) {
	t.Helper()
	d, act, err := tb.Allow(now, key, cost)
	if err != nil {
		t.Fatalf("Allow(%v, %s, %d): %v", now.Sub(t0), key, cost, err)
	}
	return d, act
}

// acquire runs a synchronous acquire for a request of cost tokens (asking
// for at least granted) sent at sent and answered at recv with granted
// tokens; it returns the report sent.
func acquire(t *testing.T, tb *Table, sent, recv time.Time, key quota.Key, cost, granted int64, mod ...func(*sluicev1.Grant)) *sluicev1.KeyReport {
	t.Helper()
	if _, act := allow(t, tb, sent, key, 1); act != ActAcquire {
		t.Fatalf("Allow before acquire: action %v, want acquire", act)
	}
	b, wait := tb.PrepareAcquire(sent, key, max(cost, granted))
	if b == nil || wait != nil {
		t.Fatalf("PrepareAcquire: batch %v wait %v", b, wait)
	}
	r := b.Reports[0]
	if err := tb.Apply(recv, b, []*sluicev1.Grant{regionGrant(r, granted, mod...)}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return r
}

func state(t *testing.T, tb *Table, key quota.Key) KeyState {
	t.Helper()
	st, ok := tb.State(key)
	if !ok {
		t.Fatalf("table does not hold %s", key)
	}
	return st
}

// The deadline counts from when the request was sent, not from when the
// grant arrived; a token is spendable strictly before it.
func TestDeadlineFromSendTime(t *testing.T) {
	tb := newTestTable(t)
	sent, recv := t0, t0.Add(300*time.Millisecond)
	acquire(t, tb, sent, recv, kW, 1, 1)
	// The first acquire asks for cost tokens; grant 10 more via a refill.
	st := state(t, tb, kW)
	if !st.Deadline.Equal(sent.Add(testTTL)) {
		t.Fatalf("deadline %v after send, want %v", st.Deadline.Sub(sent), testTTL)
	}
	for _, tc := range []struct {
		at      time.Duration
		wantAct Action
	}{
		{at: testTTL - time.Nanosecond, wantAct: ActRefill}, // last instant of the lease
		{at: testTTL, wantAct: ActAcquire},                  // at the deadline: expired
	} {
		tb := newTestTable(t)
		acquire(t, tb, sent, recv, kW, 1, 1)
		d, act := allow(t, tb, sent.Add(tc.at), kW, 1)
		if act != tc.wantAct {
			t.Errorf("at send+%v: action %v, want %v", tc.at, act, tc.wantAct)
		}
		if tc.wantAct == ActAcquire {
			if d.Allowed {
				t.Errorf("at send+%v: allowed from an expired lease", tc.at)
			}
			st := state(t, tb, kW)
			if st.Tokens != 0 || st.HasLease || st.ToReturn != 1 {
				t.Errorf("after expiry: tokens %d lease %v toReturn %d; want 0, false, 1", st.Tokens, st.HasLease, st.ToReturn)
			}
		}
	}
}

// A later grant extends the deadline only from its own send time, and an
// earlier-sent reply arriving late never shortens it.
func TestDeadlineTakesLatestSend(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0.Add(10*time.Millisecond), kW, 1, 1)
	syncs, _ := tb.PrepareSync(t0.Add(2 * time.Second))
	if err := tb.Apply(t0.Add(2500*time.Millisecond), syncs[0], []*sluicev1.Grant{regionGrant(syncs[0].Reports[0], 0)}); err != nil {
		t.Fatal(err)
	}
	if got := state(t, tb, kW).Deadline; !got.Equal(t0.Add(2*time.Second + testTTL)) {
		t.Fatalf("deadline %v, want send time of the Sync + ttl", got.Sub(t0))
	}
	// A retried report is answered with the lease's remaining validity.
	syncs, _ = tb.PrepareSync(t0.Add(3 * time.Second))
	short := regionGrant(syncs[0].Reports[0], 0, func(g *sluicev1.Grant) { g.TtlMs = 1000 })
	if err := tb.Apply(t0.Add(3100*time.Millisecond), syncs[0], []*sluicev1.Grant{short}); err != nil {
		t.Fatal(err)
	}
	if got := state(t, tb, kW).Deadline; !got.Equal(t0.Add(2*time.Second + testTTL)) {
		t.Fatalf("deadline moved to %v by a shorter grant", got.Sub(t0))
	}
}

// TestFastPathStopsAtTheDeadlineWhenTheOwnerIsLate: the owner never ran
// Expire (a process paused past its lease's deadline, resumed, and serving
// requests before the owner's overdue wake-up), so checkClock is unset. The
// lock-free path still serves nothing at or after the deadline on the
// caller's clock reading (DESIGN invariant 4): the region may have
// reclaimed those tokens and handed them to a peer. Allow then expires the
// pool rather than spending it.
func TestFastPathStopsAtTheDeadlineWhenTheOwnerIsLate(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0.Add(time.Millisecond), kW, 5, 5)
	deadline := t0.Add(testTTL)
	if state(t, tb, kW).CheckClock {
		t.Fatal("checkClock set without Expire")
	}
	if _, _, _, ok := tb.allowFast(kW, 1, tb.instant(deadline.Add(-time.Nanosecond))); !ok {
		t.Fatal("fast path refused a token just before the deadline")
	}
	for _, late := range []time.Duration{0, time.Nanosecond, testTTL, time.Hour} {
		if _, _, _, ok := tb.allowFast(kW, 1, tb.instant(deadline.Add(late))); ok {
			t.Fatalf("fast path spent a token %v after the deadline with the owner late", late)
		}
	}
	d, act := allow(t, tb, deadline.Add(time.Second), kW, 1)
	if d.Allowed || act != ActAcquire {
		t.Fatalf("clocked path after the deadline: %+v, action %v; want the pool expired and an acquire", d, act)
	}
	if got := state(t, tb, kW).Tokens; got != 0 {
		t.Fatalf("the expired pool still holds %d tokens", got)
	}
}

// The pool is emptied at the deadline by Expire, and the clock-free path
// refuses the key from deadline − guard on.
func TestExpireEnforcesDeadline(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0.Add(time.Millisecond), kW, 5, 5)
	guardAt := t0.Add(testTTL / 2)
	if next := tb.Expire(t0.Add(time.Second)); !next.Equal(guardAt) {
		t.Fatalf("Expire asks to run next at %v, want deadline - ttl/2 = %v", next.Sub(t0), guardAt.Sub(t0))
	}
	if _, _, _, ok := tb.allowFast(kW, 1, tb.instant(t0.Add(time.Second))); !ok {
		t.Fatal("fast path refused a key far from its deadline")
	}
	if next := tb.Expire(guardAt); !next.Equal(t0.Add(testTTL)) {
		t.Fatalf("after guard: next %v, want the deadline", next.Sub(t0))
	}
	if !state(t, tb, kW).CheckClock {
		t.Fatal("checkClock not set at deadline - guard")
	}
	if _, _, _, ok := tb.allowFast(kW, 1, tb.instant(guardAt)); ok {
		t.Fatal("fast path served a key within its guard time")
	}
	if _, act := allow(t, tb, t0.Add(testTTL-time.Millisecond), kW, 1); act != ActNone && act != ActRefill {
		t.Fatalf("clocked path refused a valid token: %v", act)
	}
	if next := tb.Expire(t0.Add(testTTL)); !next.IsZero() {
		t.Fatalf("after expiry: next %v, want none", next)
	}
	st := state(t, tb, kW)
	if st.Tokens != 0 || st.HasLease || st.ToReturn != 3 {
		t.Fatalf("after Expire at deadline: tokens %d lease %v toReturn %d; want 0 false 3", st.Tokens, st.HasLease, st.ToReturn)
	}
}

// A grant whose deadline passed before it arrived is not credited.
func TestLateGrantNotCredited(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0.Add(testTTL+time.Millisecond), kW, 3, 3)
	st := state(t, tb, kW)
	if st.Tokens != 0 || st.HasLease || st.ToReturn != 3 {
		t.Fatalf("tokens %d lease %v toReturn %d; want 0 false 3", st.Tokens, st.HasLease, st.ToReturn)
	}
	syncs, _ := tb.PrepareSync(t0.Add(6 * time.Second))
	if got := syncs[0].Reports[0].Returned; got != 3 {
		t.Fatalf("next report returns %d, want 3", got)
	}
}

// A report that got no answer is resent unchanged; usage after it waits
// for the next seq; after the ack the next report carries that usage.
func TestRetryResendsSameReport(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0.Add(time.Millisecond), kW, 10, 10)
	for i := 0; i < 4; i++ {
		allow(t, tb, t0.Add(100*time.Millisecond), kW, 1)
	}
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	first := syncs[0].Reports[0]
	sent := proto.Clone(first).(*sluicev1.KeyReport)
	if sent.Used != 4 {
		t.Fatalf("report used %d, want 4", sent.Used)
	}
	tb.Failed(t0.Add(1500*time.Millisecond), syncs[0])

	allow(t, tb, t0.Add(1600*time.Millisecond), kW, 2) // newer usage
	for _, prep := range []func() *Batch{
		func() *Batch { s, _ := tb.PrepareSync(t0.Add(2 * time.Second)); return s[0] },
		func() *Batch { return tb.PrepareRefill(t0.Add(2 * time.Second)) },
	} {
		b := prep()
		if b == nil {
			// PrepareRefill only picks keys at low water; force it below.
			continue
		}
		if !proto.Equal(b.Reports[0], sent) {
			t.Fatalf("resent report %v, want unchanged %v", b.Reports[0], sent)
		}
		tb.Failed(t0.Add(2*time.Second), b)
	}
	// An acquire resends it too (it carries no returned tokens).
	b, _ := tb.PrepareAcquire(t0.Add(2*time.Second), kW, 100)
	if !proto.Equal(b.Reports[0], sent) {
		t.Fatalf("acquire resent %v, want %v", b.Reports[0], sent)
	}
	if err := tb.Apply(t0.Add(2100*time.Millisecond), b, []*sluicev1.Grant{regionGrant(b.Reports[0], 0)}); err != nil {
		t.Fatal(err)
	}
	syncs, _ = tb.PrepareSync(t0.Add(3 * time.Second))
	next := syncs[0].Reports[0]
	if next.Seq <= sent.Seq || next.Used != sent.Used+2 {
		t.Fatalf("after ack: seq %d used %d; want seq > %d and used %d (cumulative)", next.Seq, next.Used, sent.Seq, sent.Used+2)
	}
}

// Tokens given back leave the pool before the report exists, so they can
// never be spent and returned both.
func TestReturnedTokensRemovedBeforeSend(t *testing.T) {
	tb := newTestTable(t)
	b, _ := tb.PrepareAcquire(t0, kW, 1) // creates nothing: key unknown
	if b != nil {
		t.Fatal("PrepareAcquire on an unknown key built a batch")
	}
	allow(t, tb, t0, kW, 1)
	b, _ = tb.PrepareAcquire(t0, kW, 500)
	if err := tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 500)}); err != nil {
		t.Fatal(err)
	}
	// One token of demand over the first second: target 2, far below 500.
	allow(t, tb, t0.Add(500*time.Millisecond), kW, 1)
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	r := syncs[0].Reports[0]
	st := state(t, tb, kW)
	if r.Returned == 0 || r.Want != 0 {
		t.Fatalf("report returned %d want %d; expected excess returned, nothing wanted", r.Returned, r.Want)
	}
	if st.Tokens+r.Returned != 499 {
		t.Fatalf("pool %d + returned %d != 499 held before", st.Tokens, r.Returned)
	}
	if st.Tokens != 2 {
		t.Fatalf("pool kept %d tokens, want target 2 (1 token/s × 1.5 refresh)", st.Tokens)
	}
	// Spending more than the pool now holds fails even though the report
	// is only in flight.
	if _, act := allow(t, tb, t0.Add(1100*time.Millisecond), kW, 3); act != ActAcquire {
		t.Fatalf("spent returned tokens: action %v", act)
	}
	// Acquire reports never carry returned tokens; a pending one that does
	// must go out as a Sync.
	tb.Failed(t0.Add(1200*time.Millisecond), syncs[0])
	b, _ = tb.PrepareAcquire(t0.Add(1300*time.Millisecond), kW, 3)
	if !b.UseSync() || b.Reports[0] != r {
		t.Fatalf("acquire resending a returning report: useSync %v same %v", b.UseSync(), b.Reports[0] == r)
	}
}

// Sizing follows demand: the first window sets the rate, a rise is seen at
// once, a fall decays; batches never exceed the instance's fair share.
func TestSizingFollowsDemand(t *testing.T) {
	tb := newTestTable(t, func(o *TableOptions) { o.IdleTimeout = time.Hour })
	allow(t, tb, t0, kW, 1)
	b, _ := tb.PrepareAcquire(t0, kW, 1000)
	tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 1000)})

	now := t0
	window := func(demand int64) *sluicev1.KeyReport {
		t.Helper()
		for i := int64(0); i < demand; i++ {
			if _, act := allow(t, tb, now.Add(time.Duration(i)*time.Microsecond), kW, 1); act == ActAcquire {
				t.Fatalf("pool ran dry at %d of %d", i, demand)
			}
		}
		now = now.Add(time.Second)
		syncs, _ := tb.PrepareSync(now)
		r := syncs[0].Reports[0]
		// Grant exactly what was wanted so the pool sits at target.
		if err := tb.Apply(now, syncs[0], []*sluicev1.Grant{regionGrant(r, r.Want)}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	window(100)
	if st := state(t, tb, kW); st.Rate != 100 || st.Tokens != 150 {
		t.Fatalf("after 100 tokens in 1s: rate %v pool %d; want 100/s and 150 (1.5 refreshes)", st.Rate, st.Tokens)
	}
	window(140)
	if st := state(t, tb, kW); st.Tokens != 210 {
		t.Fatalf("rise to 140/s: pool %d, want 210 at once", st.Tokens)
	}
	prev := state(t, tb, kW).Rate
	for i := 0; i < 3; i++ {
		window(0)
		st := state(t, tb, kW)
		if !(st.Rate < prev && st.Rate > 0) {
			t.Fatalf("idle window %d: rate %v, want a decay below %v", i, st.Rate, prev)
		}
		prev = st.Rate
	}
	// Excess is returned only beyond twice the target (hysteresis).
	if st := state(t, tb, kW); st.Tokens > 2*int64(math.Ceil(st.Rate*1.5)) {
		t.Fatalf("after decay: pool %d above 2 × ceil(1.5 × %v)", st.Tokens, st.Rate)
	}
	for i := 0; i < 10; i++ {
		window(0)
	}
	if st := state(t, tb, kW); st.Tokens > 2 {
		t.Fatalf("after 13 idle refreshes the pool still holds %d tokens", st.Tokens)
	}
}

func TestBatchCap(t *testing.T) {
	tb := newTestTable(t)
	for _, tc := range []struct {
		name        string
		demand      float64 // the instance's demand rate
		rate, burst float64 // the region's
		live        int32
		want        int64
	}{
		{"nothing learned", 0, 0, 0, 0, quota.MaxWant},
		{"lone instance that drains the region gets the burst", 100, 100, 400, 1, 400},
		{"lone instance below the region's rate: half the burst", 99, 100, 400, 1, 200},
		{"lone instance, region rate not learned: half the burst", 99, 0, 400, 1, 200},
		{"half a fair share of the burst", 100, 100, 400, 4, 50},
		{"not raised by a refresh of rate larger than the burst", 1000, 1000, 400, 4, 50},
		{"two instances, however fast the refill", 10000, 10000, 400, 2, 100},
		{"more instances than half the burst: one each", 100, 100, 400, 1000, 1},
		{"fractional burst still allows one", 0.5, 0.5, 0.5, 3, 1},
		{"fractional burst, lone and below the rate: one", 0.1, 0.5, 0.5, 1, 1},
	} {
		got := tb.batchCap(&keyInfo{regionRate: tc.rate, regionBurst: tc.burst, live: tc.live}, tc.demand)
		if got != tc.want {
			t.Errorf("%s: cap %d, want %d", tc.name, got, tc.want)
		}
	}
}

// A grant of nothing with retry_after makes the key deny locally until
// then, without asking the region; shadow mode admits but says WouldDeny.
func TestNegativeCache(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		tb := newTestTable(t)
		acquire(t, tb, t0, t0.Add(10*time.Millisecond), kW, 1, 0, func(g *sluicev1.Grant) {
			g.RetryAfterMs = 300
			g.Shadow = shadow
		})
		d, act := allow(t, tb, t0.Add(110*time.Millisecond), kW, 1)
		if act != ActNone || !d.WouldDeny || d.Allowed != shadow || d.RetryAfter != 200*time.Millisecond {
			t.Fatalf("shadow=%v: decision %+v action %v; want WouldDeny, Allowed=%v, RetryAfter 200ms", shadow, d, act, shadow)
		}
		if _, act := allow(t, tb, t0.Add(310*time.Millisecond), kW, 1); act != ActAcquire {
			t.Fatalf("shadow=%v: after retry_after: action %v, want acquire", shadow, act)
		}
		if shadow {
			if b := tb.PrepareRefill(t0.Add(100 * time.Millisecond)); b != nil {
				t.Fatal("refill of a negative-cached key")
			}
		}
		result := ResultDenied
		if shadow {
			result = ResultShadowDenied
		}
		if c := tb.Counts(); len(c) != 1 || c[0].Result != result || c[0].N != 1 || c[0].Tier != "pro" {
			t.Fatalf("shadow=%v: counts %+v", shadow, c)
		}
		// Denied demand is reported.
		syncs, _ := tb.PrepareSync(t0.Add(time.Second))
		if got := syncs[0].Reports[0].Denied; got != 1 {
			t.Fatalf("report denied %d, want 1", got)
		}
	}
}

// Crossing the low-water mark asks for a background refill, which picks
// exactly the keys at or below their mark.
func TestLowWaterTriggersRefill(t *testing.T) {
	tb := newTestTable(t)
	allow(t, tb, t0, kW, 1)
	b, _ := tb.PrepareAcquire(t0, kW, 1000)
	tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 1000)})
	allow(t, tb, t0, kR, 1)
	b, _ = tb.PrepareAcquire(t0, kR, 1000)
	tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 1000)})
	// 400 tokens/s of demand on write: low water = 400 × refresh/4 = 100.
	for i := 0; i < 400; i++ {
		allow(t, tb, t0.Add(time.Duration(i)*time.Millisecond), kW, 1)
	}
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	for _, s := range syncs {
		var gs []*sluicev1.Grant
		for _, r := range s.Reports {
			gs = append(gs, regionGrant(r, 0))
		}
		tb.Apply(t0.Add(time.Second), s, gs)
	}
	st := state(t, tb, kW)
	if st.LowWater != 100 || st.Tokens != 600 {
		t.Fatalf("low water %d pool %d; want 100 and 600", st.LowWater, st.Tokens)
	}
	if b := tb.PrepareRefill(t0.Add(time.Second)); b != nil {
		t.Fatalf("refill above low water: %v", b.Keys())
	}
	// 500 tokens over the next second: the pool crosses 100 once.
	var crossed int
	for i := 0; i < 500; i++ {
		if _, act := allow(t, tb, t0.Add(time.Second+time.Duration(i)*2*time.Millisecond), kW, 1); act == ActRefill {
			crossed++
		}
	}
	if crossed != 1 {
		t.Fatalf("crossing reported %d times, want once", crossed)
	}
	b = tb.PrepareRefill(t0.Add(2 * time.Second))
	if b == nil || len(b.Reports) != 1 || b.Keys()[0] != kW || b.Reports[0].Want != 750-100 {
		t.Fatalf("refill batch %+v; want write alone, topping 100 up to 1.5 s of 500/s", b)
	}
	if b2 := tb.PrepareRefill(t0.Add(2 * time.Second)); b2 != nil {
		t.Fatal("second refill while the first is in flight")
	}
}

// The on_failure policies, and degraded bookkeeping.
func TestFallbackPolicies(t *testing.T) {
	tb := newTestTable(t, func(o *TableOptions) { o.FallbackLimit = quota.Limit{Rate: 1, Burst: 2} })
	// Nothing learned: FallbackLimit (burst 2, then 1/s).
	var got []bool
	for i := 0; i < 3; i++ {
		d, err := tb.Fallback(t0, kW, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Degraded || d.WouldDeny == d.Allowed {
			t.Fatalf("decision %+v not marked degraded / consistent", d)
		}
		got = append(got, d.Allowed)
	}
	if !got[0] || !got[1] || got[2] {
		t.Fatalf("fallback limit burst 2: %v", got)
	}
	if d, _ := tb.Fallback(t0.Add(time.Second), kW, 1); !d.Allowed {
		t.Fatal("fallback limit did not refill at 1/s")
	}
	if tb.DegradedKeys() != 1 || !state(t, tb, kW).Degraded {
		t.Fatalf("degraded keys %d", tb.DegradedKeys())
	}

	// Learned: region 40/s burst 80 over 4 instances → 10/s burst 20 here.
	acquire(t, tb, t0.Add(2*time.Second), t0.Add(2*time.Second), kR, 1, 0, func(g *sluicev1.Grant) {
		g.RegionRate, g.RegionBurst, g.LiveInstances, g.RetryAfterMs = 40, 80, 4, 0
	})
	n := 0
	for {
		d, _ := tb.Fallback(t0.Add(3*time.Second), kR, 1)
		if !d.Allowed {
			if d.RetryAfter != 100*time.Millisecond {
				t.Fatalf("local retry after %v, want 100ms at 10/s", d.RetryAfter)
			}
			break
		}
		n++
	}
	if n != 20 {
		t.Fatalf("local policy admitted %d, want burst 80/4 = 20", n)
	}

	if d, _ := tb.Fallback(t0, quota.Key{Tenant: "acme", Class: "open"}, 5); !d.Allowed || !d.Degraded {
		t.Fatalf("open policy: %+v", d)
	}
	if d, _ := tb.Fallback(t0, kExp, 1); d.Allowed || !d.Degraded || d.RetryAfter <= 0 {
		t.Fatalf("closed policy: %+v", d)
	}
	if tb.DegradedKeys() != 4 {
		t.Fatalf("degraded keys %d, want 4", tb.DegradedKeys())
	}
	// An answer from the region ends degraded mode for that key.
	syncs, _ := tb.PrepareSync(t0.Add(4 * time.Second))
	for _, s := range syncs {
		var gs []*sluicev1.Grant
		for _, r := range s.Reports {
			gs = append(gs, regionGrant(r, r.Want))
		}
		if err := tb.Apply(t0.Add(4*time.Second), s, gs); err != nil {
			t.Fatal(err)
		}
	}
	if tb.DegradedKeys() != 0 {
		t.Fatalf("degraded keys %d after the region answered all", tb.DegradedKeys())
	}
	var degraded uint64
	for _, c := range tb.Counts() {
		if c.Degraded {
			degraded += c.N
		}
	}
	if degraded != 4+21+2 {
		t.Fatalf("degraded decisions counted %d, want 27", degraded)
	}
}

func TestInvalidInputChangesNothing(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 5, func(g *sluicev1.Grant) { g.Limit = 10 })
	before := state(t, tb, kW)
	for _, tc := range []struct {
		name string
		key  quota.Key
		cost int64
	}{
		{"empty tenant", quota.Key{Class: "write"}, 1},
		{"bad byte", quota.Key{Tenant: "a b", Class: "write"}, 1},
		{"zero cost", kW, 0},
		{"negative cost", kW, -3},
		{"cost above MaxCost", kW, quota.MaxCost + 1},
		{"cost above the key's burst", kW, 11},
	} {
		for _, call := range []func() error{
			func() error { _, _, err := tb.Allow(t0, tc.key, tc.cost); return err },
			func() error { _, err := tb.Fallback(t0, tc.key, tc.cost); return err },
		} {
			if err := call(); !errors.Is(err, quota.ErrInvalid) {
				t.Errorf("%s: err %v, want quota.ErrInvalid", tc.name, err)
			}
		}
		if _, _, _, ok := tb.allowFast(tc.key, tc.cost, tb.instant(t0)); ok {
			t.Errorf("%s: fast path accepted it", tc.name)
		}
	}
	if tb.Len() != 1 {
		t.Fatalf("table holds %d keys, want 1", tb.Len())
	}
	if after := state(t, tb, kW); after.Tokens != before.Tokens || after.Pending != before.Pending {
		t.Fatalf("state changed: %+v -> %+v", before, after)
	}
}

func TestStrictClasses(t *testing.T) {
	one, half := 1.0, 0.5
	tb := newTestTable(t)
	if _, act := allow(t, tb, t0, kExp, 1); act != ActCheck {
		t.Fatalf("strict class from options: action %v", act)
	}
	for _, tc := range []struct {
		resp          *sluicev1.CheckResponse
		allowed, deny bool
		result        Result
	}{
		{&sluicev1.CheckResponse{Allowed: true, Limit: 5, Remaining: 4}, true, false, ResultAllowed},
		{&sluicev1.CheckResponse{Limit: 5, RetryAfterMs: 250}, false, true, ResultDenied},
		{&sluicev1.CheckResponse{Limit: 5, Shadow: true}, true, true, ResultShadowDenied},
		// An unleased region whose static share of the key holds no
		// whole token: no wait can cure it.
		{&sluicev1.CheckResponse{Limit: 5, RetryAfterMs: -1, Unleased: true, RegionRate: &one, RegionBurst: &half}, false, true, ResultDenied},
	} {
		d, err := tb.ApplyCheck(t0, kExp, 1, tc.resp)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != tc.allowed || d.WouldDeny != tc.deny || d.Limit != 5 {
			t.Errorf("check %+v: decision %+v", tc.resp, d)
		}
		if never := tc.resp.RetryAfterMs < 0; d.RetryNever != never {
			t.Errorf("check %+v: RetryNever %v, want %v", tc.resp, d.RetryNever, never)
		}
		if !tc.allowed && !d.RetryNever && d.RetryAfter != 250*time.Millisecond {
			t.Errorf("retry after %v, want 250ms", d.RetryAfter)
		}
	}
	if _, _, err := tb.Allow(t0, kExp, 6); !errors.Is(err, quota.ErrInvalid) {
		t.Fatalf("cost above the strict key's limit: %v", err)
	}
	// A lease key the region says is strict drops its tokens.
	acquire(t, tb, t0, t0, kW, 1, 1)
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	for _, s := range syncs {
		var gs []*sluicev1.Grant
		for _, r := range s.Reports {
			if r.Key.Class == "export" && r.Want != 0 {
				t.Fatalf("strict key wants %d tokens", r.Want)
			}
			gs = append(gs, regionGrant(r, 0, func(g *sluicev1.Grant) { g.Mode = "strict"; g.TtlMs = 0 }))
		}
		tb.Apply(t0.Add(time.Second), s, gs)
	}
	if _, act := allow(t, tb, t0.Add(time.Second), kW, 1); act != ActCheck {
		t.Fatalf("after mode change: action %v, want check", act)
	}
	if st := state(t, tb, kW); st.Tokens != 0 || st.ToReturn != 1 || st.HasLease {
		t.Fatalf("tokens %d toReturn %d lease %v after becoming strict; want 0, 1, no lease", st.Tokens, st.ToReturn, st.HasLease)
	}
}

// Keys without demand for IdleTimeout are forgotten with a final report;
// a key used again gets seqs above its forgotten ones.
func TestIdleKeysForgotten(t *testing.T) {
	tb := newTestTable(t, func(o *TableOptions) { o.IdleTimeout = 3 * time.Second })
	r := acquire(t, tb, t0, t0, kW, 2, 6)
	allow(t, tb, t0, kW, 2)
	var lastSeq uint64
	var release *Batch
	s := 1
	for ; s <= 5 && release == nil; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		var syncs []*Batch
		syncs, release = tb.PrepareSync(now)
		for _, b := range syncs {
			lastSeq = b.Reports[0].Seq
			tb.Apply(now, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 0)})
		}
	}
	if release == nil || tb.Len() != 0 {
		t.Fatalf("idle key not forgotten (len %d)", tb.Len())
	}
	// The Sync at 1s saw the demand; the one at 4s, exactly IdleTimeout
	// later, forgets the key.
	if s-1 != 4 {
		t.Fatalf("idle key forgotten by the Sync at %ds, want 4s", s-1)
	}
	fr := release.Reports[0]
	if fr.Want != 0 || fr.Returned != 4 || fr.Seq <= lastSeq || fr.Seq <= r.Seq {
		t.Fatalf("final report %v; want want=0, returned=4, seq above %d", fr, lastSeq)
	}
	allow(t, tb, t0.Add(10*time.Second), kW, 1)
	b, _ := tb.PrepareAcquire(t0.Add(10*time.Second), kW, 1)
	if b.Reports[0].Seq <= fr.Seq {
		t.Fatalf("new seq %d not above the forgotten key's %d", b.Reports[0].Seq, fr.Seq)
	}
}

func TestApplyRefusesMismatchedGrants(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*sluicev1.Grant)
	}{
		{"other key", func(g *sluicev1.Grant) { g.Key = &sluicev1.QuotaKey{Tenant: "other", Class: "write"} }},
		{"other seq", func(g *sluicev1.Grant) { g.Seq++ }},
		{"more than wanted", func(g *sluicev1.Grant) { g.Granted = 1 << 20 }},
		{"negative", func(g *sluicev1.Grant) { g.Granted = -1 }},
	} {
		tb := newTestTable(t)
		allow(t, tb, t0, kW, 1)
		b, _ := tb.PrepareAcquire(t0, kW, 1)
		if err := tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 1, tc.mod)}); err == nil {
			t.Errorf("%s: applied", tc.name)
		}
		st := state(t, tb, kW)
		if st.Tokens != 0 || st.Pending != b.Reports[0] || st.InFlight {
			t.Errorf("%s: state %+v; want no tokens, report still pending, not in flight", tc.name, st)
		}
	}
	tb := newTestTable(t)
	allow(t, tb, t0, kW, 1)
	b, _ := tb.PrepareAcquire(t0, kW, 1)
	if err := tb.Apply(t0, b, nil); err == nil {
		t.Error("applied zero grants to one report")
	}
	// A grant that names no seq (0) answers the report it comes with.
	tb = newTestTable(t)
	allow(t, tb, t0, kW, 1)
	b, _ = tb.PrepareAcquire(t0, kW, 1)
	if err := tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(b.Reports[0], 1, func(g *sluicev1.Grant) { g.Seq = 0 })}); err != nil {
		t.Errorf("grant without a seq: %v", err)
	}
	if st := state(t, tb, kW); st.Tokens != 1 || st.Pending != nil {
		t.Errorf("after a grant without a seq: pool %d pending %v; want 1 and none", st.Tokens, st.Pending)
	}
}

// Release: every pool drained, final reports return all, the table is
// closed to new keys and to credit.
func TestPrepareRelease(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 10)
	allow(t, tb, t0, kW, 3)
	allow(t, tb, t0, kExp, 1) // strict: no lease record, no final report
	inflight, _ := tb.PrepareAcquire(t0, kR, 1)
	if inflight != nil {
		t.Fatal("unexpected batch for an unknown key")
	}
	b := tb.PrepareRelease(t0.Add(time.Second))
	if b == nil || len(b.Reports) != 1 {
		t.Fatalf("release batch %+v, want one report", b)
	}
	r := b.Reports[0]
	if r.Used != 3 || r.Returned != 7 || r.Want != 0 {
		t.Fatalf("final report %v; want used 3 returned 7 want 0", r)
	}
	if tb.Len() != 0 || tb.HeldTokens() != 0 {
		t.Fatalf("after release: %d keys, %d tokens", tb.Len(), tb.HeldTokens())
	}
	if _, _, err := tb.Allow(t0, kR, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Allow on a released table: %v", err)
	}
}

// Drain empties pools at once; a grant that arrives afterwards is
// returned, not credited.
func TestDrainBlocksCredit(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 4)
	allow(t, tb, t0, kW, 5) // ActAcquire: pool 4 < 5
	b, _ := tb.PrepareAcquire(t0, kW, 5)
	tb.Drain()
	if _, act := allow(t, tb, t0, kW, 1); act == ActNone || act == ActRefill {
		t.Fatal("spent after Drain")
	}
	// A drained table acquires nothing and has the caller wait for nothing.
	if b2, wait := tb.PrepareAcquire(t0, kW, 1); b2 != nil || wait != nil {
		t.Fatalf("acquire after Drain: batch %v wait %v, want neither", b2, wait)
	}
	tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(b.Reports[0], b.Reports[0].Want)})
	st := state(t, tb, kW)
	if st.Tokens != 0 || st.ToReturn != 4+b.Reports[0].Want {
		t.Fatalf("after grant post-Drain: tokens %d toReturn %d", st.Tokens, st.ToReturn)
	}
}

func TestCountsByLabel(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 3)
	for i := 0; i < 3; i++ {
		allow(t, tb, t0, kW, 1)
	}
	tb.Fallback(t0, kR, 1)
	want := []DecisionCount{
		{Class: "read", Tier: "unknown", Result: ResultAllowed, Degraded: true, N: 1},
		{Class: "write", Tier: "pro", Result: ResultAllowed, N: 3},
	}
	if got := tb.Counts(); !slices.Equal(got, want) {
		t.Fatalf("counts %+v, want %+v", got, want)
	}
	// Forgetting a key keeps its counts.
	tb.PrepareRelease(t0)
	if got := tb.Counts(); len(got) != 2 || got[1].N != 3 {
		t.Fatalf("counts after release %+v", got)
	}
}

// TestCountsUseTheGivenTierUntilTheRegionNamesOne: TableOptions.Tier names
// the tier a key's decisions are counted under while the region has not
// named one (the on_failure policy's, with no answer yet); the region's
// tier wins once it names one, and a "" from Tier leaves the tier unknown.
func TestCountsUseTheGivenTierUntilTheRegionNamesOne(t *testing.T) {
	tb := newTestTable(t, func(o *TableOptions) {
		o.Tier = func(k quota.Key) string {
			if k.Class == "export" {
				return ""
			}
			return "configured"
		}
	})
	acquire(t, tb, t0, t0, kW, 1, 3) // the region names tier pro
	allow(t, tb, t0, kW, 1)
	tb.Fallback(t0, kR, 1)
	tb.Fallback(t0, kExp, 1)
	want := []DecisionCount{
		{Class: "export", Tier: "unknown", Result: ResultDenied, Degraded: true, N: 1},
		{Class: "read", Tier: "configured", Result: ResultAllowed, Degraded: true, N: 1},
		{Class: "write", Tier: "pro", Result: ResultAllowed, N: 1},
	}
	if got := tb.Counts(); !slices.Equal(got, want) {
		t.Fatalf("counts %+v, want %+v", got, want)
	}
}

func TestTableOptionsValidation(t *testing.T) {
	for _, o := range []TableOptions{
		{},
		{Refresh: -time.Second},
		{Refresh: time.Second, IdleTimeout: -1},
		{Refresh: time.Second, FallbackLimit: quota.Limit{Rate: 0, Burst: 3}},
		{Refresh: time.Second, Classes: map[string]ClassPolicy{"bad class": {}}},
		{Refresh: time.Second, MaxReportsPerSync: -1},
	} {
		if _, err := NewTable(o); !errors.Is(err, quota.ErrInvalid) {
			t.Errorf("NewTable(%+v): %v, want quota.ErrInvalid", o, err)
		}
	}
}

func TestSyncBatchesAreCapped(t *testing.T) {
	tb := newTestTable(t, func(o *TableOptions) { o.MaxReportsPerSync = 3 })
	for i := 0; i < 7; i++ {
		allow(t, tb, t0, quota.Key{Tenant: "t" + string(rune('a'+i)), Class: "write"}, 1)
	}
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	var sizes []int
	seen := map[quota.Key]bool{}
	for _, b := range syncs {
		sizes = append(sizes, len(b.Reports))
		for _, k := range b.Keys() {
			seen[k] = true
		}
	}
	if len(syncs) != 3 || len(seen) != 7 || sizes[0] != 3 || sizes[2] != 1 {
		t.Fatalf("batch sizes %v covering %d keys; want [3 3 1] over 7", sizes, len(seen))
	}
}

// TestOrderedScansBatchKeysInKeyOrder: with OrderedScans, the Sync
// batches hold the keys in key order (tenant, then class), so which keys
// share a batch follows from the keys, not from a map's random order; a
// key stored after a walk is in its place at the next.
func TestOrderedScansBatchKeysInKeyOrder(t *testing.T) {
	tb := newTestTable(t, func(o *TableOptions) { o.MaxReportsPerSync = 3; o.OrderedScans = true })
	for _, k := range []quota.Key{{Tenant: "te", Class: "write"}, {Tenant: "tb", Class: "write"}, {Tenant: "tg", Class: "write"}, {Tenant: "ta", Class: "write"}} {
		allow(t, tb, t0, k, 1)
	}
	tb.HeldTokens() // a walk before more keys come
	for _, k := range []quota.Key{{Tenant: "tf", Class: "write"}, {Tenant: "tb", Class: "read"}, {Tenant: "tc", Class: "write"}} {
		allow(t, tb, t0, k, 1)
	}
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	var got [][]quota.Key
	for _, b := range syncs {
		got = append(got, b.Keys())
	}
	want := [][]quota.Key{
		{{Tenant: "ta", Class: "write"}, {Tenant: "tb", Class: "read"}, {Tenant: "tb", Class: "write"}},
		{{Tenant: "tc", Class: "write"}, {Tenant: "te", Class: "write"}, {Tenant: "tf", Class: "write"}},
		{{Tenant: "tg", Class: "write"}},
	}
	if !slices.EqualFunc(got, want, slices.Equal[[]quota.Key]) {
		t.Fatalf("batches %v, want %v", got, want)
	}
}
