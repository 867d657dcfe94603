package luascripts

import (
	"context"
	"math/big"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// bound is b + r·t in exact arithmetic: b tokens, r tokens/s (the float's
// exact value), t in µs.
func bound(b, r float64, tUS int64) *big.Rat {
	x := new(big.Rat).SetFloat64(r)
	x.Mul(x, new(big.Rat).SetFrac64(tUS, 1000000))
	return x.Add(x, new(big.Rat).SetFloat64(b))
}

// above says whether n tokens exceed the exact bound.
func above(n int64, lim *big.Rat) bool { return new(big.Rat).SetInt64(n).Cmp(lim) > 0 }

// TestRefillIsExactOnHotKey is issue 12's §1.3 example on real Redis: a
// strict key refilling at 0.151 tokens/s and checked every 10 µs of Redis
// time. Each call earns 1.51 micro-tokens; storage at 1e-6 used to round
// that to 2 and drop the rest, so the bucket refilled a third too fast and
// admitted a second token where b + r·t was still below 2. The run starts
// with an idle stretch that leaves the exact bucket just short of a token,
// so a thousand hot calls show what half a million would from a full start.
// Admitted must never exceed b + r·t, and the second token must come as
// soon as the bound allows it.
func TestRefillIsExactOnHotKey(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sc := newVirtual()
	m := NewModel()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "hot", Class: "strict"})
	c := Common{StaticRate: 0.151, StaticBurst: 1, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}

	t0 := int64(1_700_000_000_000_000)
	check := func(now int64) bool {
		t.Helper()
		sc.setNow(now)
		got, err := sc.Check(ctx, rdb, k, c, 1)
		if err != nil {
			t.Fatalf("check at +%dµs: %v", now-t0, err)
		}
		if want := m.Check(now, k, c, 1); got != want {
			t.Fatalf("check at +%dµs: lua %+v, model %+v", now-t0, got, want)
		}
		return got.Allowed
	}
	if !check(t0) {
		t.Fatal("a new bucket of burst 1 did not admit its token")
	}
	admitted := int64(1)
	// 0.9985 tokens' worth of idle time, then a call every 10µs.
	now := t0 + 6_612_583
	for i := 0; i < 2000 && admitted < 2; i++ {
		if check(now) {
			admitted++
			if lim := bound(c.StaticBurst, c.StaticRate, now-t0); above(admitted, lim) {
				f, _ := lim.Float64()
				t.Fatalf("admitted %d at t = %.6fs where b + r·t = %.7f", admitted, float64(now-t0)/1e6, f)
			}
		}
		now += 10
	}
	if admitted != 2 {
		t.Fatalf("admitted %d, want the second token once b + r·t reached 2 (t = %.6fs)", admitted, 1/c.StaticRate)
	}
	// The first instant the exact bound allows the second token.
	if first := t0 + 6_622_517; now-10 > first+10 {
		t.Errorf("second token at +%dµs, want it within 10µs after +%dµs", now-10-t0, first-t0)
	}
}

// TestAccrueIsExactFloor checks accrue against exact arithmetic on
// products whose rounded value is a whole number just above the exact one
// (the case that needs the error-free product), and on plain ones.
func TestAccrueIsExactFloor(t *testing.T) {
	cases := []struct{ dt, r, rm float64 }{
		{10_000_000, 0.7, 0}, {10, 0.151, 0}, {10, 0.151, 0.49}, {1_000_000, 1, 0},
		{3, 1.0 / 3, 0}, {6_612_583, 0.151, 0}, {1, 5e-324, 0.999}, {1e15, 7.999999999999999, 0.5},
		{999, 66.666666666, 0.3333333333333333}, {4e6, 0.1, 0},
	}
	for _, tc := range cases {
		n, rest := accrue(tc.dt, tc.r, tc.rm)
		exact := new(big.Rat).SetFloat64(tc.dt)
		exact.Mul(exact, new(big.Rat).SetFloat64(tc.r))
		exact.Add(exact, new(big.Rat).SetFloat64(tc.rm))
		fl := new(big.Int).Quo(exact.Num(), exact.Denom()) // floor: exact >= 0
		if new(big.Rat).SetFloat64(n).Cmp(new(big.Rat).SetInt(fl)) != 0 {
			t.Errorf("accrue(%v, %v, %v) = %v, want floor %v", tc.dt, tc.r, tc.rm, n, fl)
		}
		sum := new(big.Rat).Add(new(big.Rat).SetFloat64(n), new(big.Rat).SetFloat64(rest))
		if sum.Cmp(exact) > 0 || rest < 0 || rest >= 1 {
			t.Errorf("accrue(%v, %v, %v): carries %v, above the exact rest or outside [0, 1)", tc.dt, tc.r, tc.rm, rest)
		}
	}
}

// TestFullBucketCarriesNoFraction: a bucket that refills to its cap
// exactly drops the fraction of a micro-token it earned on the way, as one
// that would pass the cap does: earned while full, it was never earned.
// Carried, it was credited after the next spend, so a bucket spent empty
// held a micro-token more than r·t a second later (found by
// FuzzScriptsMatchModel; once per filling, so unbounded over a key's
// life). A key of burst 2 at 1/3 token/s: a lease of one token leaves the
// new bucket at its cap (1 of room 2 − 1); a check 3 µs later earns
// 3 × 1/3 micro-tokens there (a hair under one: floor 0, the rest
// carried) and spends the token.
func TestFullBucketCarriesNoFraction(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "full", Class: "read"})
	c := Common{StaticRate: 1.0 / 3, StaticBurst: 2, LeaseTTL: time.Minute, DemandWindow: time.Millisecond}
	t0 := w.now
	if got := w.acquire(k, c, Report{Instance: "i-1", Seq: 1, Want: 1, Min: 1}); got.Granted != 1 || got.Remaining != 1 {
		t.Fatalf("acquire: %+v, want 1 granted and 1 remaining", got)
	}
	w.at(t0 + 3)
	if d := w.check(k, c, 1); !d.Allowed {
		t.Fatalf("a bucket at its cap denied its token: %+v", d)
	}
	if rm := w.rdb.HGet(w.ctx, k.Bucket, "rm").Val(); rm != "0" && rm != "" {
		t.Fatalf("the bucket spent from at its cap carries a fraction rm=%q, want 0 (or none stored)", rm)
	}
	const second = 1_000_000
	w.at(t0 + 3 + second)
	w.check(k, c, 1) // denied: refills and stores the bucket
	tk := ratS(t, bucketField(w.rdb.HGetAll(w.ctx, k.Bucket).Val(), "t"))
	if lim := bound(0, c.StaticRate, second); tk.Cmp(lim) > 0 {
		t.Fatalf("a bucket spent empty holds %s tokens a second later, above r·t = %s", tk.FloatString(9), lim.FloatString(9))
	}
}

// TestOlderGrantNeverReplacesNewer: grants reach a region's Redis out of
// order (a paused former region leader resumes and installs the grant it
// holds from before the new leader's). The newer grant must stay in force,
// in the script and in its twin, even when the older one expires later.
func TestOlderGrantNeverReplacesNewer(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sc := newVirtual()
	m := NewModel()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	now := int64(1_700_000_000_000_000)

	setRate := func(rate, burst float64, exp, issued int64) SetRateReply {
		t.Helper()
		sc.setNow(now)
		got, err := sc.SetRate(ctx, rdb, k, c, rate, burst, exp, issued, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := m.SetRate(now, k, c, rate, burst, exp, issued, 0); got != want {
			t.Fatalf("set_rate: lua %+v, model %+v", got, want)
		}
		return got
	}
	// The new leader's grant, for a report sent at now-1s.
	if r := setRate(50, 40, now+10_000_000, now-1_000_000); !r.Applied {
		t.Fatal("the first grant was not applied")
	}
	now += 100_000
	// The old leader's grant answers a report sent at now-3s; it would run
	// longer and at a lower rate.
	if r := setRate(2, 4, now+20_000_000, now-3_000_000); r.Applied {
		t.Error("an older grant was applied over a newer one")
	}
	sc.setNow(now)
	st, err := sc.State(ctx, rdb, k, c)
	if err != nil {
		t.Fatal(err)
	}
	if want := m.State(now, k, c); st != want {
		t.Fatalf("state: lua %+v, model %+v", st, want)
	}
	if st.Rate != 50 || st.Cap != 40 || st.GrantExpiryUS != now-100_000+10_000_000 {
		t.Errorf("in force: rate %v cap %v expiry +%dµs, want the newer grant (50, 40, +%dµs)",
			st.Rate, st.Cap, st.GrantExpiryUS-now, 10_000_000-100_000)
	}
	gs, err := rdb.HGet(ctx, k.Bucket, "gs").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.FormatInt(now-100_000-1_000_000, 10); gs != want {
		t.Errorf("stored issue time %s, want the newer grant's %s", gs, want)
	}
}
