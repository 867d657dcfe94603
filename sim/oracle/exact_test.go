package oracle

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

func oneKey(t *testing.T, rate, burst float64, mod func(*Key)) *Oracle {
	t.Helper()
	k := Key{Key: quota.Key{Tenant: "t", Class: "c"}, Rate: rate, Burst: burst,
		StaticRate: []float64{rate}, StaticBurst: []float64{burst}}
	if mod != nil {
		mod(&k)
	}
	o, err := New(Setup{Regions: []Region{{Name: "a", Weight: 1}}, Keys: []Key{k},
		Epoch: time.Second, Duration: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// The example: rate 0.151/s, burst 1. A second token at t = 5 s is
// 0.245 token over b + r·t = 1.755; one at 6.6225 s exactly is within.
func TestRoundingSizedExcessIsAViolation(t *testing.T) {
	o := oneKey(t, 0.151, 1, nil)
	o.Decided(0, 0, 0, 1, SourceStrict)
	o.Decided(5*time.Second, 0, 0, 1, SourceStrict)
	if r := o.Finish(10 * time.Second); r.Conformance.Violations != 1 {
		t.Fatalf("second token at 5 s not flagged: %+v", r.Conformance)
	}
	// Exactly when the bucket holds one token again: 1/0.151 s (rounded
	// up to the nanosecond) conforms; 10 ns earlier (1.5 nanotokens
	// short) does not.
	at := time.Duration(math.Ceil(1e9 / 0.151))
	for _, c := range []struct {
		at   time.Duration
		want int
	}{{at, 0}, {at - 10*time.Nanosecond, 1}} {
		o := oneKey(t, 0.151, 1, nil)
		o.Decided(0, 0, 0, 1, SourceStrict)
		o.Decided(c.at, 0, 0, 1, SourceStrict)
		if r := o.Finish(20 * time.Second); r.Conformance.Violations != c.want {
			t.Fatalf("token at %v: %d violations, want %d (%+v)", c.at, r.Conformance.Violations, c.want, r.Conformance)
		}
	}
}

// A day at 2000/s admitted in 100 ms batches exactly at the rate conforms;
// one token more anywhere in it is a violation. The old float check
// allowed 0.001 + 1e-6·(b + r·t) tokens: over 170 tokens by the end.
func TestExactOverALongRun(t *testing.T) {
	const rate, burst = 2000, 4000
	run := func(extraAt, earlyAt int) *Result {
		o := oneKey(t, rate, burst, nil)
		o.Decided(0, 0, 0, burst, SourceLease)
		step := 100 * time.Millisecond
		for i := 1; i <= int(24*time.Hour/step); i++ {
			n := int64(rate * step.Seconds())
			at := time.Duration(i) * step
			if i == extraAt {
				n++
			}
			if i == earlyAt {
				at -= 50 * time.Microsecond // 0.1 token early
			}
			o.Decided(at, 0, 0, n, SourceLease)
		}
		return o.Finish(24 * time.Hour)
	}
	if r := run(-1, -1); r.Conformance.Violations != 0 || r.Conformance.MaxExcessRaw > 0 {
		t.Fatalf("a conforming day flagged: %+v", r.Conformance)
	}
	if r := run(800_000, -1); r.Conformance.Violations != 1 || math.Abs(r.Conformance.MaxExcess-1) > 1e-9 {
		t.Fatalf("one token over at 22 h not flagged as 1 token: %+v", r.Conformance)
	}
	// The old tolerance at 22 h was 0.16 token.
	if r := run(-1, 792_000); r.Conformance.Violations != 1 || math.Abs(r.Conformance.MaxExcess-0.1) > 1e-9 {
		t.Fatalf("0.1 token over at 22 h not flagged: %+v", r.Conformance)
	}
}

func TestExactRefillArithmetic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100000; i++ {
		r := math.Exp(rng.Float64()*30 - 15) // 3e-7 .. 3e6 tokens/s
		d := time.Duration(rng.Int64N(int64(48 * time.Hour)))
		got := exactRate(r).refill(d).float()
		want := r * float64(d) // nanotokens
		if got < want*(1-1e-12)-1 || got > want*(1+1e-12)+1 {
			t.Fatalf("refill(%v, %v) = %v nanotokens, want %v", r, d, got, want)
		}
	}
	if got := exactRate(1).refill(time.Second); got != tokensNT(1) {
		t.Fatalf("1/s over 1 s = %v", got)
	}
	if got := exactRate(0.1).refill(10 * time.Second); got != tokensNT(1).add(u128{0, 1}) {
		// 0.1 is slightly above a tenth as a float64 (by 5.6e-18): 1e10 ns
		// refill 1e9 + 5.6e-8 nanotokens, rounded up.
		t.Fatalf("0.1/s over 10 s = %v", got)
	}
}

// The oracle's fair shares come from its own reference; it must agree
// with the allocator's water-fill it judges on every input.
func TestFairReferenceMatchesWaterFill(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for it := 0; it < 20000; it++ {
		n := 1 + rng.IntN(6)
		regs := make([]Region, n)
		hregs := make([]hierarchy.Region, n)
		dem := make([]float64, n)
		floors := rng.Float64() * 0.9
		for i := range regs {
			regs[i] = Region{Name: string(rune('a' + i)), Weight: 0.1 + rng.Float64()*5}
			if rng.IntN(3) == 0 {
				regs[i].MinShare = floors / float64(n) * rng.Float64()
			}
			if rng.IntN(3) == 0 {
				regs[i].MaxShare = regs[i].MinShare + (1-regs[i].MinShare)*rng.Float64()
			}
			switch rng.IntN(4) {
			case 0:
				dem[i] = 0
			case 1:
				dem[i] = rng.Float64() * 10
			default:
				dem[i] = rng.Float64() * 1000
			}
			hregs[i] = hierarchy.Region{Name: regs[i].Name, Weight: regs[i].Weight, MinShare: regs[i].MinShare, MaxShare: regs[i].MaxShare}
		}
		if hierarchy.ValidateRegions(hregs) != nil {
			continue
		}
		rate := 1 + rng.Float64()*999
		got, want := make([]float64, n), make([]float64, n)
		fairReference(rate, regs, dem, got)
		if err := hierarchy.WaterFill(rate, hregs, dem, want); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if math.Abs(got[i]-want[i]) > 1e-9*rate {
				t.Fatalf("rate %v regions %+v demand %v: reference %v, water-fill %v", rate, regs, dem, got, want)
			}
		}
	}
}

func TestClosedClassAdmittingDegradedIsAViolation(t *testing.T) {
	o := oneKey(t, 1, 5, func(k *Key) { k.Closed = true })
	o.Decided(time.Second, 0, 0, 3, SourceDenied)
	if r := o.Finish(2 * time.Second); r.Conformance.Violations != 0 {
		t.Fatalf("denials flagged: %+v", r.Conformance)
	}
	o = oneKey(t, 1, 5, func(k *Key) { k.Closed = true })
	o.Decided(time.Second, 0, 0, 1, SourceDegraded)
	if r := o.Finish(2 * time.Second); r.Conformance.Violations != 1 || r.Conformance.ClosedAdmitted != 1 || r.Pass() {
		t.Fatalf("closed acting as open not flagged: %+v", r.Conformance)
	}
}

func TestBooksCatchADoubleCount(t *testing.T) {
	o := oneKey(t, 10, 20, nil)
	o.Decided(time.Second, 0, 0, 7, SourceLease)
	o.Decided(time.Second, 0, 0, 2, SourceDenied)
	o.BucketObserved(2*time.Second, 0, 0, Bucket{NowUS: 2e6, Tokens: 10, Cap: 20, Rate: 10, Admitted: 7, Denied: 2})
	// The bucket expires and a new one counts on: 3 more admitted.
	o.BucketGone(0, 0)
	o.Decided(3*time.Second, 0, 0, 3, SourceLease)
	o.BucketObserved(4*time.Second, 0, 0, Bucket{NowUS: 4e6, Cap: 20, Rate: 10, Admitted: 3})
	if r := o.Finish(5 * time.Second); r.Books.Violations != 0 || r.Books.Checks != 2 {
		t.Fatalf("exact books flagged: %+v", r.Books)
	}
	o = oneKey(t, 10, 20, nil)
	o.Decided(time.Second, 0, 0, 7, SourceLease)
	o.BucketObserved(2*time.Second, 0, 0, Bucket{NowUS: 2e6, Cap: 20, Rate: 10, Admitted: 14})
	if r := o.Finish(5 * time.Second); r.Books.Violations != 1 || r.Books.MaxOver != 7 || r.Pass() {
		t.Fatalf("a report applied twice not flagged: %+v", r.Books)
	}
	// A strict decision counted by the bucket before the instance hears
	// it is pending, not a double count.
	o = oneKey(t, 10, 20, nil)
	o.RegionPending(0, 0, 1)
	o.BucketObserved(time.Second, 0, 0, Bucket{NowUS: 1e6, Cap: 20, Rate: 10, Admitted: 1})
	o.RegionPending(0, 0, -1)
	o.Decided(time.Second, 0, 0, 1, SourceStrict)
	if r := o.Finish(5 * time.Second); r.Books.Violations != 0 {
		t.Fatalf("pending strict decision flagged: %+v", r.Books)
	}
}

func TestHoldingWithinCapAndRefill(t *testing.T) {
	o := oneKey(t, 10, 20, nil)
	o.BucketObserved(time.Second, 0, 0, Bucket{NowUS: 1e6, Tokens: 5, Outstanding: 10, Cap: 20, Rate: 10})
	// 0.5 s later: refill allows 5 more.
	o.BucketObserved(1500*time.Millisecond, 0, 0, Bucket{NowUS: 1.5e6, Tokens: 10, Outstanding: 10, Cap: 20, Rate: 10})
	// A smaller grant lowers the cap below what is leased: the bucket
	// empties, the leases stay.
	o.BucketObserved(1500*time.Millisecond, 0, 0, Bucket{NowUS: 1.5e6, Tokens: 0, Outstanding: 10, Cap: 4, Rate: 2})
	if r := o.Finish(5 * time.Second); r.Holding.Violations != 0 {
		t.Fatalf("legal holdings flagged: %+v", r.Holding)
	}
	o = oneKey(t, 10, 20, nil)
	o.BucketObserved(time.Second, 0, 0, Bucket{NowUS: 1e6, Tokens: 5, Outstanding: 10, Cap: 20, Rate: 10})
	// A return of 3 credited twice: leased 10 → 7, tokens 5 → 11.
	o.BucketObserved(time.Second, 0, 0, Bucket{NowUS: 1e6, Tokens: 11, Outstanding: 7, Cap: 20, Rate: 10})
	if r := o.Finish(5 * time.Second); r.Holding.Violations != 1 || math.Abs(r.Holding.MaxOver-3) > 1e-9 {
		t.Fatalf("tokens from nowhere not flagged: %+v", r.Holding)
	}
	o = oneKey(t, 10, 20, nil)
	o.BucketObserved(time.Second, 0, 0, Bucket{NowUS: 1e6, Tokens: 15, Outstanding: 10, Cap: 20, Rate: 10})
	if r := o.Finish(5 * time.Second); r.Holding.Violations != 1 {
		t.Fatalf("holding over the cap not flagged: %+v", r.Holding)
	}
}

func TestGrantOrder(t *testing.T) {
	o := oneKey(t, 10, 20, nil)
	o.GrantIssued(time.Second, 0, 0, 1000)
	o.GrantIssued(2*time.Second, 0, 0, 2000)
	o.GrantIssued(2*time.Second, 0, 0, 2000) // the same answer again
	if r := o.Finish(3 * time.Second); r.GrantOrder.Violations != 0 {
		t.Fatalf("ordered grants flagged: %+v", r.GrantOrder)
	}
	o = oneKey(t, 10, 20, nil)
	o.GrantIssued(time.Second, 0, 0, 2000)
	o.GrantIssued(2*time.Second, 0, 0, 1000)
	if r := o.Finish(3 * time.Second); r.GrantOrder.Violations != 1 || r.Pass() {
		t.Fatalf("an older grant applied after a newer one not flagged: %+v", r.GrantOrder)
	}
}
