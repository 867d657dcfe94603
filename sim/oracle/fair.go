package oracle

import "math"

// fairReference is the oracle's own weighted max-min fair division of rate
// over the regions' demands, with floors (MinShare·rate) and ceilings
// (MaxShare·rate), written into out. It shares no code with the allocator
// (pkg/hierarchy's WaterFill, which it judges) and is written to be
// obviously right rather than fast: each region wants clamp(demand, floor,
// ceiling); when the wants add up to at least rate, region i gets
// clamp(λ·w_i, floor_i, want_i) for the λ at which these add up to rate;
// otherwise every region gets its want and the rest is spread by weight
// into the room below the ceilings, min(μ·w_i, ceiling_i − want_i). Both
// sums are nondecreasing in λ (μ), so bisection finds the level to float
// precision.
func fairReference(rate float64, regs []Region, demand, out []float64) {
	n := len(regs)
	lo := make([]float64, n)
	want := make([]float64, n)
	room := make([]float64, n)
	var sumLo, sumWant, sumRoom float64
	for i, r := range regs {
		ceil := rate
		if r.MaxShare > 0 {
			ceil = r.MaxShare * rate
		}
		lo[i] = r.MinShare * rate
		want[i] = math.Min(math.Max(demand[i], lo[i]), ceil)
		room[i] = ceil - want[i]
		sumLo += lo[i]
		sumWant += want[i]
		sumRoom += room[i]
	}
	if sumWant >= rate {
		if sumLo >= rate {
			for i := range out {
				out[i] = lo[i] * rate / sumLo
			}
			return
		}
		at := func(l float64, i int) float64 { return math.Min(math.Max(l*regs[i].Weight, lo[i]), want[i]) }
		l := bisect(rate, n, at)
		for i := range out {
			out[i] = at(l, i)
		}
		return
	}
	spare := rate - sumWant
	if sumRoom <= spare {
		for i := range out {
			out[i] = want[i] + room[i]
		}
		return
	}
	at := func(m float64, i int) float64 { return math.Min(m*regs[i].Weight, room[i]) }
	m := bisect(spare, n, at)
	for i := range out {
		out[i] = want[i] + at(m, i)
	}
}

// bisect finds the level x ≥ 0 at which Σ_i at(x, i) reaches target, for
// at nondecreasing in x and reaching target for some finite x.
func bisect(target float64, n int, at func(x float64, i int) float64) float64 {
	sum := func(x float64) float64 {
		s := 0.0
		for i := 0; i < n; i++ {
			s += at(x, i)
		}
		return s
	}
	lo, hi := 0.0, 1.0
	for sum(hi) < target && hi < 1e300 {
		hi *= 2
	}
	for k := 0; k < 200 && lo < hi; k++ {
		mid := lo + (hi-lo)/2
		if mid == lo || mid == hi {
			break
		}
		if sum(mid) < target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}
