package oracle

import (
	"math"
	"math/bits"
	"time"
)

// The conformance check runs in exact integer arithmetic: tokens in
// nanotokens (1e-9 token) as 128-bit integers, time in nanoseconds. A
// key's rate r is the float64 the system runs on, which is exactly
// M·2^E for integers M < 2^53 and E; the refill over Δ ns is r·Δ
// nanotokens, computed from M·Δ without rounding and rounded up once to
// a whole nanotoken. See gcraState for where that rounding can go.

// u128 is an unsigned 128-bit integer.
type u128 struct{ hi, lo uint64 }

func mul64(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

func (a u128) add(b u128) u128 {
	lo, c := bits.Add64(a.lo, b.lo, 0)
	hi, _ := bits.Add64(a.hi, b.hi, c)
	return u128{hi, lo}
}

// sub is a − b for a ≥ b.
func (a u128) sub(b u128) u128 {
	lo, c := bits.Sub64(a.lo, b.lo, 0)
	hi, _ := bits.Sub64(a.hi, b.hi, c)
	return u128{hi, lo}
}

func (a u128) less(b u128) bool { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo) }

func (a u128) float() float64 { return float64(a.hi)*0x1p64 + float64(a.lo) }

// maxU128 saturates refills too large to matter.
var maxU128 = u128{math.MaxUint64, math.MaxUint64}

// shrCeil is ⌈a / 2^s⌉.
func (a u128) shrCeil(s uint) u128 {
	switch {
	case s == 0:
		return a
	case s >= 128:
		if a == (u128{}) {
			return a
		}
		return u128{0, 1}
	}
	var q u128
	var rem bool
	if s >= 64 {
		q = u128{0, a.hi >> (s - 64)}
		rem = a.lo != 0 || a.hi&(1<<(s-64)-1) != 0
	} else {
		q = u128{a.hi >> s, a.lo>>s | a.hi<<(64-s)}
		rem = a.lo&(1<<s-1) != 0
	}
	if rem {
		q = q.add(u128{0, 1})
	}
	return q
}

// rateNT is a rate in exact form: r = m·2^e tokens/s.
type rateNT struct {
	m uint64
	e int
}

func exactRate(r float64) rateNT {
	frac, exp := math.Frexp(r) // r = frac·2^exp, frac in [0.5, 1)
	return rateNT{m: uint64(frac * (1 << 53)), e: exp - 53}
}

// refill is ⌈r·d⌉ nanotokens for d ≥ 0 ns (r tokens/s · d ns = r·d
// nanotokens).
func (r rateNT) refill(d time.Duration) u128 {
	if d <= 0 {
		return u128{}
	}
	p := mul64(r.m, uint64(d))
	if r.e > 0 {
		if r.e >= 64 || p.hi>>(64-uint(r.e)) != 0 {
			return maxU128
		}
		return u128{p.hi<<uint(r.e) | p.lo>>(64-uint(r.e)), p.lo << uint(r.e)}
	}
	return p.shrCeil(uint(-r.e))
}

const nanoPerToken = 1_000_000_000

// tokensNT is n whole tokens in nanotokens.
func tokensNT(n uint64) u128 { return mul64(n, nanoPerToken) }

// floatNT is x ≥ 0 tokens in nanotokens, rounded down.
func floatNT(x float64) u128 {
	if !(x > 0) {
		return u128{}
	}
	whole := math.Floor(x)
	if whole >= 0x1p63 {
		return maxU128
	}
	return tokensNT(uint64(whole)).add(u128{0, uint64(math.Floor((x - whole) * nanoPerToken))})
}

// gcraState is one key's virtual bucket in exact arithmetic: the tokens
// admitted since t0, the last instant the bucket was empty. Its level
// (debt) at t is admitted − ⌈r·(t − t0)⌉; the stream conforms to (r, b)
// exactly when the level right after every admission is at most b. The
// only rounding is that ceiling, taken once per segment (not per batch),
// so the level is never more than one nanotoken below the exact one: the
// check is lenient by less than 1e-9 token, whatever the run's length.
type gcraState struct {
	t0       time.Duration
	admitted u128
}

// admit adds tokens at t (t ≥ t0) and returns the level after them.
func (g *gcraState) admit(r rateNT, t time.Duration, tokens uint64) u128 {
	if t < g.t0 {
		t = g.t0
	}
	if drained := r.refill(t - g.t0); !drained.less(g.admitted) {
		// Empty at or before t: a new segment starts now.
		g.t0, g.admitted = t, u128{}
	}
	g.admitted = g.admitted.add(tokensNT(tokens))
	return g.admitted.sub(min128(g.admitted, r.refill(t-g.t0)))
}

func min128(a, b u128) u128 {
	if a.less(b) {
		return a
	}
	return b
}

// excessTokens is level − allowance in tokens (negative when below).
func excessTokens(level, allowance u128) float64 {
	if level.less(allowance) {
		return -allowance.sub(level).float() / nanoPerToken
	}
	return level.sub(allowance).float() / nanoPerToken
}
