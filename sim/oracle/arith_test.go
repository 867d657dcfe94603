package oracle

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

func (a u128) big() *big.Int {
	v := new(big.Int).SetUint64(a.hi)
	v.Lsh(v, 64)
	return v.Or(v, new(big.Int).SetUint64(a.lo))
}

var two128 = new(big.Int).Lsh(big.NewInt(1), 128)

// TestU128Arithmetic pins the 128-bit operations on values whose high words
// differ from their low words' order.
func TestU128Arithmetic(t *testing.T) {
	small, big := u128{0, math.MaxUint64}, u128{1, 0}
	for _, c := range []struct {
		a, b u128
		less bool
	}{
		{small, big, true}, {big, small, false}, {big, big, false},
		{u128{1, 2}, u128{1, 3}, true}, {u128{1, 3}, u128{1, 2}, false},
		{u128{2, 0}, u128{1, math.MaxUint64}, false},
	} {
		if got := c.a.less(c.b); got != c.less {
			t.Errorf("%v < %v = %v, want %v", c.a, c.b, got, c.less)
		}
		want := c.a
		if !c.less {
			want = c.b
		}
		if got := min128(c.a, c.b); got != want {
			t.Errorf("min128(%v, %v) = %v, want %v", c.a, c.b, got, want)
		}
	}
	if got := small.add(u128{0, 1}); got != big {
		t.Errorf("carry: %v", got)
	}
	if got := big.sub(u128{0, 1}); got != small {
		t.Errorf("borrow: %v", got)
	}
	if got := big.float(); got != 0x1p64 {
		t.Errorf("float of 2^64 = %v", got)
	}
	for _, c := range []struct {
		level, allowance u128
		want             float64
	}{
		{tokensNT(5), tokensNT(3), 2},
		{tokensNT(3), tokensNT(5), -2},
		{tokensNT(3), tokensNT(3), 0},
		{tokensNT(3).add(u128{0, 1}), tokensNT(3), 1e-9},
	} {
		if got := excessTokens(c.level, c.allowance); got != c.want {
			t.Errorf("excessTokens(%v, %v) = %v, want %v", c.level, c.allowance, got, c.want)
		}
	}
}

// TestShrCeilMatchesBigInt: ⌈a / 2^s⌉ for every shift across the word
// boundaries, on values with bits just below and at the cut.
func TestShrCeilMatchesBigInt(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	vals := []u128{{}, {0, 1}, {1, 0}, {0, math.MaxUint64}, maxU128, {1 << 63, 0}, {0, 1 << 63}, {5, 0}, {0, 5}}
	for i := 0; i < 200; i++ {
		v := u128{rng.Uint64(), rng.Uint64()}
		vals = append(vals, v, u128{v.hi, 0}, u128{0, v.lo}, u128{v.hi &^ 0xff, 0}, u128{v.hi, v.lo &^ 0xffff})
	}
	for s := uint(0); s <= 140; s++ {
		for k := 0; k < 64 && s < 128; k++ {
			// Powers of two at and around the cut.
			var p u128
			if s+uint(k) < 64 {
				p = u128{0, 1 << (s + uint(k))}
			} else if s+uint(k) < 128 {
				p = u128{1 << (s + uint(k) - 64), 0}
			}
			vals = append(vals, p)
		}
		for _, a := range vals {
			q, r := new(big.Int).DivMod(a.big(), new(big.Int).Lsh(big.NewInt(1), s), new(big.Int))
			if r.Sign() != 0 {
				q.Add(q, big.NewInt(1))
			}
			if got := a.shrCeil(s); got.big().Cmp(q) != 0 {
				t.Fatalf("⌈%v / 2^%d⌉ = %v, want %v", a.big(), s, got.big(), q)
			}
		}
	}
}

// refillReference is ⌈m·2^e·d⌉ nanotokens, saturated when it does not fit
// in 128 bits or when e ≥ 64.
func refillReference(r rateNT, d time.Duration) *big.Int {
	if d <= 0 {
		return new(big.Int)
	}
	p := new(big.Int).Mul(new(big.Int).SetUint64(r.m), big.NewInt(int64(d)))
	if r.e > 0 {
		if r.e >= 64 {
			return maxU128.big()
		}
		p.Lsh(p, uint(r.e))
		if p.Cmp(two128) >= 0 {
			return maxU128.big()
		}
		return p
	}
	q, rem := new(big.Int).DivMod(p, new(big.Int).Lsh(big.NewInt(1), uint(-r.e)), new(big.Int))
	if rem.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q
}

// TestRefillExactAtEveryScale: the refill is exact (rounded up once) for
// rates from below a nanotoken per century to above 2^53 tokens/s, where
// the mantissa is shifted left, and saturates once it cannot be held.
func TestRefillExactAtEveryScale(t *testing.T) {
	rates := []float64{1e-30, 1e-12, 0.1, 1, 3, 0x1p52, 0x1p52 * 1.5, 0x1p53, 0x1p54 * 1.75, 0x1p60, 3 * 0x1p58,
		0x1p100, 0x1p100 * 1.9, 0x1p115, 0x1p116, 0x1p120}
	durs := []time.Duration{-time.Second, -1, 0, 1, 2, 3, 1 << 12, 1<<12 + 1, 1 << 20, 1<<20 + 1, time.Second,
		1 << 27, 1<<27 + 1, 1 << 28, 1<<28 - 1, 48 * time.Hour, math.MaxInt64}
	for _, x := range rates {
		r := exactRate(x)
		if float64(r.m)*math.Pow(2, float64(r.e)) != x {
			t.Fatalf("exactRate(%v) = %v", x, r)
		}
		for _, d := range durs {
			if got, want := r.refill(d).big(), refillReference(r, d); got.Cmp(want) != 0 {
				t.Errorf("refill(%v/s, %dns) = %v, want %v", x, d, got, want)
			}
		}
	}
	// The cases above hit each path; spot-check a few values by hand.
	for _, c := range []struct {
		rate float64
		d    time.Duration
		want u128
	}{
		{1, 1, u128{0, 1}},
		{1e-30, time.Hour, u128{0, 1}},
		{0x1p53, 1, u128{0, 1 << 53}},
		{0x1p60, 1 << 20, u128{1 << 16, 0}},
		{0x1p100, 1 << 27, u128{1 << 63, 0}},
		{0x1p100, 1 << 28, maxU128},
		{0x1p115, 1, u128{1 << 51, 0}},
		{0x1p116, 1, maxU128},
	} {
		if got := exactRate(c.rate).refill(c.d); got != c.want {
			t.Errorf("refill(%v/s, %dns) = %v, want %v", c.rate, c.d, got, c.want)
		}
	}
}

// TestFloatNT: tokens to nanotokens rounds down, maps what is not
// positive to zero and saturates from 2^63 tokens on.
func TestFloatNT(t *testing.T) {
	for _, c := range []struct {
		x    float64
		want u128
	}{
		{0, u128{}},
		{-1, u128{}},
		{-0.5, u128{}},
		{math.NaN(), u128{}},
		{math.Inf(-1), u128{}},
		{1.5, u128{0, 1_500_000_000}},
		{0.25, u128{0, 250_000_000}},
		{1.0000000005, u128{0, 1_000_000_000}}, // half a nanotoken, rounded down
		{2.9999999999, u128{0, 2_999_999_999}},
		{0x1p63 - 1024, mul64(1<<63-1024, nanoPerToken)},
		{0x1p63, maxU128},
		{math.Inf(1), maxU128},
	} {
		if got := floatNT(c.x); got != c.want {
			t.Errorf("floatNT(%v) = %v, want %v", c.x, got, c.want)
		}
	}
}

// TestConformanceCountsFromTheLastEmptyInstant: the virtual bucket's
// refill counts from the last instant it was empty, not from the start of
// the run: a full burst after a long idle conforms and one token more does
// not; a run whose first admission comes late is judged from then.
func TestConformanceCountsFromTheLastEmptyInstant(t *testing.T) {
	for _, c := range []struct {
		name   string
		at     []time.Duration
		tokens []int64
		excess float64 // beyond b; 0: conforms
	}{
		{"burst after an idle stretch", []time.Duration{10 * sec, 100 * sec}, []int64{200, 200}, 0},
		{"burst and a token after an idle stretch", []time.Duration{10 * sec, 100 * sec}, []int64{200, 201}, 1},
		{"refill from a late first admission", []time.Duration{sec, 1500 * time.Millisecond}, []int64{200, 50}, 0},
		{"a token over the refill from a late first admission", []time.Duration{sec, 1500 * time.Millisecond}, []int64{200, 51}, 1},
		{"bucket emptied exactly at the next admission", []time.Duration{sec, 3 * sec, 3 * sec}, []int64{200, 200, 1}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := oneKey(t, 100, 200, nil)
			for i, at := range c.at {
				o.Decided(at, 0, 0, c.tokens[i], SourceLease)
			}
			cf := o.Finish(200 * sec).Conformance
			if c.excess == 0 {
				if cf.Violations != 0 || cf.MaxExcessRaw != 0 || cf.MaxExcess != 0 {
					t.Fatalf("conforming run flagged: %+v", cf)
				}
				return
			}
			if cf.Violations != 1 || cf.MaxExcess != c.excess || cf.MaxExcessRaw != c.excess {
				t.Fatalf("want one violation of %v token: %+v", c.excess, cf)
			}
		})
	}
}

// TestFairReferenceScalesOverbookedFloors: floors adding up to more than
// the rate are scaled down to it in proportion, whatever the demand; a
// spare rate goes by weight into the room below each ceiling.
func TestFairReferenceScalesOverbookedFloors(t *testing.T) {
	for _, c := range []struct {
		name   string
		regs   []Region
		demand []float64
		want   []float64
	}{
		{"floors of 80% and 40%", []Region{{Weight: 1, MinShare: 0.8}, {Weight: 3, MinShare: 0.4}}, []float64{0, 500},
			[]float64{100 * 0.8 / 1.2, 100 * 0.4 / 1.2}},
		{"floors adding up to the rate", []Region{{Weight: 1, MinShare: 0.75}, {Weight: 1, MinShare: 0.25}}, []float64{500, 500},
			[]float64{75, 25}},
		{"spare by weight below ceilings", []Region{{Weight: 1, MaxShare: 0.5}, {Weight: 3, MaxShare: 0.6}}, []float64{10, 20},
			[]float64{40, 60}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := make([]float64, len(c.regs))
			fairReference(100, c.regs, c.demand, got)
			for i := range got {
				if math.Abs(got[i]-c.want[i]) > 1e-9 {
					t.Fatalf("fair shares %v, want %v", got, c.want)
				}
			}
		})
	}
}
