package luascripts

import (
	"math"
	"time"
)

// The refill arithmetic shared by Model and lib.lua (accrue there): exact
// over any call pattern. Every product and sum below is rounded to float64
// on its own (explicit conversions keep the compiler from fusing them), as
// Lua computes them.

const (
	two53 = 1 << 53
	// shave is the relative amount a carried fraction is rounded down by.
	shave = 0x1p-50
	// split is Veltkamp's constant for doubles, 2^27 + 1.
	split = 134217729
	// maxMS bounds every TTL and wait the scripts compute (ms; 2^43, 278
	// years): PEXPIRE accepts it and it fits a time.Duration. A longer
	// wait is "never".
	maxMS = 1 << 43
)

// WireMS renders a script's wait (RetryAfter, Reset) for the wire: whole
// milliseconds, or -1 for "never" (the scripts' -1: what is asked exceeds
// what the bucket can ever hold at its current cap, or the rate is zero).
func WireMS(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

// twoProd returns p = a·b rounded and e with p + e = a·b exactly (Dekker).
func twoProd(a, b float64) (p, e float64) {
	p = float64(a * b)
	c := float64(split * a)
	ah := c - (c - a)
	al := a - ah
	c = float64(split * b)
	bh := c - (c - b)
	bl := b - bh
	e = float64(float64(float64(float64(ah*bh)-p)+float64(ah*bl))+float64(al*bh)) + float64(al*bl)
	return p, e
}

// twoSum returns s = a + b rounded and g with s + g = a + b exactly (Knuth).
func twoSum(a, b float64) (s, g float64) {
	s = a + b
	bb := s - a
	return s, (a - (s - bb)) + (b - bb)
}

// accrue returns the whole micro-tokens in dt·r + rm (dt in µs, r in
// tokens/s, rm the fraction carried; the exact floor) and the fraction to
// carry next, never above the exact rest. A product of 2^53 micro-tokens
// or more fills any cap the config accepts and comes back whole.
func accrue(dt, r, rm float64) (n, rest float64) {
	p, e := twoProd(dt, r)
	if !(p < two53) {
		return p, 0
	}
	x, g := twoSum(p, rm)
	d := g + e
	n = math.Floor(x)
	if n == x && d < 0 {
		n = n - 1
	}
	y := float64(x-n) + d
	y = y - float64(y*shave)
	if y < 0 {
		y = 0
	}
	return n, y
}
