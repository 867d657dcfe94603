package hierarchy

import (
	"math"
	"slices"
)

// StaticBursts apportions a key's burst among regions in whole units (a
// class's largest cost; unit <= 0 or non-finite means 1 token) and writes
// each region's static burst cap into out (len(regions)).
//
// A cap below one unit can never admit a request of that cost, so
// splitting b·w_r/Σw fractionally would make a small burst unusable
// everywhere (b = 1 over weights 2:1:1 gives 0.5/0.25/0.25). Instead the
// n = ⌊b/unit⌋ whole units go by largest remainder: region r first gets
// ⌊n·w_r/Σw⌋ units, and the units left over go one each to the regions
// with the largest remainders (ties: larger weight, then smaller name).
// What is left of b below one unit goes to the first region in that line.
// Σ out = b exactly when b and unit are whole numbers below 2^53, and
// every region's cap is within one unit of b·w_r/Σw. The result does not
// depend on the order of regions. A region with no unit gets one from the
// global tier when it has demand (see Allocator).
//
// regions must pass ValidateRegions; burst must be finite and >= 0.
func StaticBursts(burst, unit float64, regions []Region, out []float64) {
	if !(unit > 0) || math.IsInf(unit, 0) {
		unit = 1
	}
	nr := len(regions)
	if nr == 0 {
		return
	}
	var buf [MaxRegions]int
	var order []int
	if nr <= MaxRegions {
		order = buf[:nr]
	} else {
		order = make([]int, nr)
	}
	for i := range order {
		order[i] = i
	}
	// The weight sum is added in name order, so every caller (the
	// allocator, each region) gets the same float and the same split.
	slices.SortFunc(order, func(x, y int) int {
		switch {
		case regions[x].Name < regions[y].Name:
			return -1
		case regions[x].Name > regions[y].Name:
			return 1
		}
		return 0
	})
	var sum float64
	for _, i := range order {
		sum += regions[i].Weight
	}
	n := math.Floor(burst / unit)
	var given float64
	for i, r := range regions {
		out[i] = math.Floor(n * r.Weight / sum)
		given += out[i]
	}
	rem := func(i int) float64 { q := n * regions[i].Weight / sum; return q - math.Floor(q) }
	// Rank regions by remainder (larger first), weight, then name; the
	// first left of them get one more unit each. left < nr: the
	// remainders add up to less than nr.
	slices.SortStableFunc(order, func(x, y int) int {
		if rx, ry := rem(x), rem(y); rx != ry {
			if rx > ry {
				return -1
			}
			return 1
		}
		if wx, wy := regions[x].Weight, regions[y].Weight; wx != wy {
			if wx > wy {
				return -1
			}
			return 1
		}
		return 0 // already in name order
	})
	left := int(max(0, min(n-given, float64(nr))))
	for j := 0; j < left; j++ {
		out[order[j]]++
	}
	for i := range out[:nr] {
		out[i] *= unit
	}
	out[order[0]] += burst - n*unit
}

// splitUnits divides a key's burst pool among n reporting regions in whole
// units, near the split in proportion to weight (their target rates), and
// writes each region's burst target into out.
//
// A grant's rate and burst share one validity, so a region must not be a
// donor of one and a recipient of the other (its grant would have to end
// before the donors' and could not, since falling back to its static share
// would take back what it gave): a region whose rate is above its static
// share (role > 0) gets at least its static cap sb, one below it (role < 0)
// at most its static units, one at its static share exactly its static
// cap. Within those bounds regions with demand but no unit come first,
// then the largest remainders; a region with demand and still no unit may
// take one from a region without demand, or with more than one. Σ out <= pool up to float
// rounding, except when the static caps the roles keep add up to more than
// the pool (a silent region counted above its static cap): then they are
// kept and the caller's fence bounds what is granted. Ties go by index, so
// the result is deterministic.
func splitUnits(pool, unit float64, weight, sb, demand []float64, role []int8, out []float64, us *unitScratch) {
	n := len(out)
	if n == 0 {
		return
	}
	// Whole static units, each region's quota of the pool and its bounds,
	// computed once: every comparison below reads them.
	us.grow(n)
	whole, quota, lower, upper, order := us.whole[:n], us.quota[:n], us.lower[:n], us.upper[:n], us.order[:n]
	weight, sb, demand, role = weight[:n], sb[:n], demand[:n], role[:n]
	// Recipients and regions at their share keep the fraction of a unit
	// their static cap may carry; donors give it up.
	var kept float64
	for j := range n {
		whole[j] = math.Floor(sb[j] / unit)
		if role[j] >= 0 {
			kept += sb[j] - whole[j]*unit
		}
	}
	units := math.Floor(max(0, pool-kept) / unit)
	var sumW float64
	for _, w := range weight[:n] {
		sumW += w
	}
	var given float64
	for j := range n {
		if sumW > 0 {
			quota[j] = units * weight[j] / sumW
		} else {
			quota[j] = units / float64(n)
		}
		lower[j], upper[j] = 0, units
		if role[j] >= 0 {
			lower[j] = whole[j]
		}
		if role[j] <= 0 {
			upper[j] = whole[j]
		}
		out[j] = clamp(math.Floor(quota[j]), lower[j], upper[j])
		given += out[j]
	}
	// The regions are sorted stably (by insertion: n is small), ties by
	// index, on each region's remainder quota-out (rem) and, when a unit
	// is short, whether it has demand and no unit (need).
	rem, need := us.rem[:n], us.need[:n]
	// Too many: take from the most over-served first (down to their lower
	// bound, then, when other regions hold more than the pool leaves,
	// below it).
	for pass := 0; given > units && pass < 2; pass++ {
		for j := range n {
			rem[j] = quota[j] - out[j]
		}
		sortLeastRem(order, rem)
		for progress := true; given > units && progress; {
			progress = false
			for _, j := range order {
				if given <= units {
					break
				}
				if out[j] > 0 && (pass == 1 || out[j] > lower[j]) {
					out[j]--
					given--
					progress = true
				}
			}
		}
	}
	// Too few: regions with demand and no unit first (most demand first),
	// then the largest remainders. The order also says who takes a unit
	// from a donor below; it is needed only when a unit is left to give
	// or some region with demand has none (the order is the same whether
	// it is set here or there: nothing changes out in between).
	needOrder := given < units
	for j := 0; j < n && !needOrder; j++ {
		needOrder = demand[j] > 0 && out[j] == 0 && upper[j] >= 1
	}
	if !needOrder {
		scaleUnits(unit, sb, whole, role, out)
		return
	}
	for j := range n {
		rem[j] = quota[j] - out[j]
		need[j] = demand[j] > 0 && out[j] == 0
	}
	sortNeedFirst(order, need, demand[:n], rem)
	for progress := true; given < units && progress; {
		progress = false
		for _, j := range order {
			if given >= units {
				break
			}
			if out[j] < upper[j] {
				out[j]++
				given++
				progress = true
			}
		}
	}
	// A region with demand and still no unit takes one from a region
	// above its lower bound that has no demand, or else more than one unit
	// (the most first).
	for _, j := range order {
		if !(demand[j] > 0) || out[j] > 0 || upper[j] < 1 {
			continue
		}
		donor := -1
		better := func(d int) bool {
			if donor < 0 {
				return true
			}
			if (demand[d] == 0) != (demand[donor] == 0) {
				return demand[d] == 0
			}
			return out[d] > out[donor]
		}
		for d := range n {
			keep := lower[d]
			if demand[d] > 0 {
				keep = max(keep, 1)
			}
			if out[d] > keep && better(d) {
				donor = d
			}
		}
		if donor < 0 {
			break
		}
		out[donor]--
		out[j]++
	}
	scaleUnits(unit, sb, whole, role, out)
}

// sortLeastRem fills order with 0..n-1 sorted stably (by insertion) by
// rem, smallest first.
func sortLeastRem(order []int32, rem []float64) {
	rem = rem[:len(order)]
	for j := range order {
		order[j] = int32(j)
		for i := j; i > 0; i-- {
			x, y := order[i], order[i-1]
			if !(rem[x] < rem[y]) {
				break
			}
			order[i], order[i-1] = y, x
		}
	}
}

// sortNeedFirst fills order with 0..n-1 sorted stably (by insertion):
// regions in need first, most demand first among them, then by rem,
// largest first.
func sortNeedFirst(order []int32, need []bool, demand, rem []float64) {
	n := len(order)
	need, demand, rem = need[:n], demand[:n], rem[:n]
	for j := range order {
		order[j] = int32(j)
		for i := j; i > 0; i-- {
			x, y := order[i], order[i-1]
			var before bool
			switch hx := need[x]; {
			case hx != need[y]:
				before = hx
			case hx && demand[x] != demand[y]:
				before = demand[x] > demand[y]
			default:
				before = rem[x] > rem[y]
			}
			if !before {
				break
			}
			order[i], order[i-1] = y, x
		}
	}
}

// scaleUnits turns splitUnits' counts of units into bursts: recipients
// and regions at their share that keep their static units also keep the
// fraction of a unit their static cap carries.
func scaleUnits(unit float64, sb, whole []float64, role []int8, out []float64) {
	for j := range out {
		out[j] *= unit
		if role[j] >= 0 && out[j] >= whole[j]*unit {
			out[j] += sb[j] - whole[j]*unit
		}
	}
}

// unitScratch holds splitUnits' per-region buffers, reused across calls.
type unitScratch struct {
	whole, quota, lower, upper, rem []float64
	need                            []bool
	order                           []int32
}

func (us *unitScratch) grow(n int) {
	if cap(us.order) < n {
		us.whole, us.quota = make([]float64, n), make([]float64, n)
		us.lower, us.upper = make([]float64, n), make([]float64, n)
		us.order = make([]int32, n)
		us.rem, us.need = make([]float64, n), make([]bool, n)
	}
}

func cmpFloat(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}
