package hierarchy

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/sluicehq/sluice/pkg/quota"
)

// Region is one region as the global tier sees it. Values are plain data;
// a Region is safe to copy and share.
type Region struct {
	// Name is required: 1..128 bytes of [A-Za-z0-9._:@-], unique.
	Name string
	// Weight is required: > 0. Static shares and fair shares are
	// proportional to it.
	Weight float64
	// MinShare is optional: a floor on the region's allocation as a fraction
	// of the key's rate, in [0, 1]; default 0. The floors of all regions
	// must add up to at most 1.
	MinShare float64
	// MaxShare is optional: a ceiling as a fraction of the key's rate, in
	// [MinShare, 1]; 0 means 1. The ceilings must add up to at least 1, so
	// the whole rate can always be assigned.
	MaxShare float64
	// Drained is optional: the region's static share is its floor (see
	// KeyLimit.FloorShare), what it would have is re-divided among the
	// others, and it is granted no more than its floor.
	Drained bool
}

// MaxRegions is the most regions an Allocator takes: a bound that keeps
// the per-grant check free of allocation.
const MaxRegions = 64

// shareTolerance absorbs float rounding when checking that floors add up
// to at most 1 and ceilings to at least 1.
const shareTolerance = 1e-9

func (r Region) maxShare() float64 {
	if r.MaxShare == 0 {
		return 1
	}
	return r.MaxShare
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// ValidateRegions checks a region list: 1..MaxRegions regions with
// names, weights, floors and ceilings as described on Region. It returns an error wrapping
// quota.ErrInvalid naming the first bad field.
func ValidateRegions(regions []Region) error {
	if len(regions) == 0 {
		return fmt.Errorf("%w: no regions configured", quota.ErrInvalid)
	}
	if len(regions) > MaxRegions {
		return fmt.Errorf("%w: %d regions configured, at most %d are supported", quota.ErrInvalid, len(regions), MaxRegions)
	}
	seen := make(map[string]int, len(regions))
	var sumMin, sumMax float64
	for i, r := range regions {
		if err := quota.ValidateID(fmt.Sprintf("regions[%d].name", i), r.Name); err != nil {
			return err
		}
		if j, dup := seen[r.Name]; dup {
			return fmt.Errorf("%w: regions[%d].name %q duplicates regions[%d]", quota.ErrInvalid, i, r.Name, j)
		}
		seen[r.Name] = i
		if !finite(r.Weight) || r.Weight <= 0 {
			return fmt.Errorf("%w: region %q weight %v must be a finite number > 0", quota.ErrInvalid, r.Name, r.Weight)
		}
		if !finite(r.MinShare) || r.MinShare < 0 || r.MinShare > 1 {
			return fmt.Errorf("%w: region %q min share %v must be in [0, 1]", quota.ErrInvalid, r.Name, r.MinShare)
		}
		if !finite(r.MaxShare) || r.MaxShare < 0 || r.MaxShare > 1 {
			return fmt.Errorf("%w: region %q max share %v must be in [0, 1] (0 means 1)", quota.ErrInvalid, r.Name, r.MaxShare)
		}
		if r.MinShare > r.maxShare() {
			return fmt.Errorf("%w: region %q min share %v exceeds its max share %v", quota.ErrInvalid, r.Name, r.MinShare, r.maxShare())
		}
		sumMin += r.MinShare
		sumMax += r.maxShare()
	}
	if sumMin > 1+shareTolerance {
		return fmt.Errorf("%w: region min shares add up to %v, more than 1", quota.ErrInvalid, sumMin)
	}
	if sumMax < 1-shareTolerance {
		return fmt.Errorf("%w: region max shares add up to %v, less than 1: part of every limit could never be assigned", quota.ErrInvalid, sumMax)
	}
	return nil
}

// StaticShares writes total·w_i/Σw into out for every region: the share a
// region uses when it holds no valid grant. It is used for rates
// (total = r) and bursts (total = b) alike. out must have len(regions).
func StaticShares(total float64, regions []Region, out []float64) {
	var sum float64
	for _, r := range regions {
		sum += r.Weight
	}
	for i, r := range regions {
		out[i] = total * r.Weight / sum
	}
}

// WaterFill divides rate among regions by weighted max-min fairness over
// their demands, honouring floors (MinShare·rate) and ceilings
// (MaxShare·rate), and writes the allocations into out (len(regions)).
//
// Each region first wants clamp(demand, floor, ceiling). When the wants add
// up to at least rate, the allocation is the unique weighted max-min fair
// one: a_i = clamp(λ·w_i, floor_i, want_i) with λ chosen so Σa = rate. When
// they add up to less, every region gets its want and the remainder (the
// capacity nobody demands) is water-filled by weight into the room each
// region has below its ceiling, so no capacity is left unassigned.
//
// The result is exact up to float rounding and deterministic; the cost is
// O(R log R). Demands are tokens/s and must be finite and >= 0; rate must
// be finite and > 0; regions must pass ValidateRegions.
func WaterFill(rate float64, regions []Region, demand []float64, out []float64) error {
	if !finite(rate) || rate <= 0 {
		return fmt.Errorf("%w: rate %v must be a finite number > 0", quota.ErrInvalid, rate)
	}
	if err := ValidateRegions(regions); err != nil {
		return err
	}
	if len(demand) != len(regions) || len(out) != len(regions) {
		return fmt.Errorf("%w: %d regions but %d demands and %d outputs", quota.ErrInvalid, len(regions), len(demand), len(out))
	}
	for i, d := range demand {
		if !finite(d) || d < 0 {
			return fmt.Errorf("%w: region %q demand %v must be a finite number >= 0", quota.ErrInvalid, regions[i].Name, d)
		}
	}
	n := len(regions)
	w := make([]float64, n)
	lo := make([]float64, n)
	hi := make([]float64, n)
	for i, r := range regions {
		w[i] = r.Weight
		lo[i] = r.MinShare * rate
		hi[i] = r.maxShare() * rate
	}
	var fs fillScratch
	fairShare(rate, w, lo, hi, demand, out, &fs)
	return nil
}

// fairShare is WaterFill on pre-scaled inputs: weights w, floors lo and
// ceilings hi in the same unit as capacity. It needs lo <= hi; it writes
// out and uses fs as scratch. Inputs are trusted.
func fairShare(capacity float64, w, lo, hi, demand, out []float64, fs *fillScratch) {
	n := len(w)
	ensure(&fs.want, n)
	ensure(&fs.room, n)
	ensure(&fs.zero, n) // only ever zeros
	want, room, zero := fs.want[:n], fs.room[:n], fs.zero[:n]
	lo, hi, demand, out = lo[:n], hi[:n], demand[:n], out[:n]
	var sumWant float64
	for i := range want {
		want[i] = clamp(demand[i], lo[i], hi[i])
		sumWant += want[i]
	}
	if sumWant >= capacity {
		waterLevel(capacity, w, lo, want, out, fs)
		return
	}
	for i := range room {
		room[i] = hi[i] - want[i]
	}
	waterLevel(capacity-sumWant, w, zero, room, out, fs)
	for i := range out {
		out[i] += want[i]
	}
}

// clamp is min(max(x, lo), hi) to the bit, NaNs and signed zeros
// included, without their general handling when x lies strictly between
// the bounds (then both give x).
func clamp(x, lo, hi float64) float64 {
	if lo < x && x < hi {
		return x
	}
	return min(max(x, lo), hi)
}

// ensure makes *s hold at least n elements (len = cap), storing to *s
// only when it must grow: the scratch of a hot loop, sliced to the
// length each use needs. Every scratch slice keeps len = cap, so an index
// below any n it was ensured for is in range: a scratch resliced shorter
// and kept would fail the next user that indexes it directly after the
// regions grow back within its capacity.
func ensure[T any](s *[]T, n int) {
	if cap(*s) < n {
		*s = make([]T, n)
	}
}

// fillScratch holds buffers reused across calls so the allocation loop
// does not allocate per key.
type fillScratch struct {
	want, room, zero []float64
	// The water levels where each region starts to rise (its floor is
	// reached) and stops (its ceiling is), and the regions in the order
	// of each.
	startAt, stopAt []float64
	starts, stops   []int32
}

// sortByLevel fills order with 0..n-1 sorted by level, ties by index.
func sortByLevel(level []float64, order []int32) {
	n := len(order)
	if n <= 16 {
		for j := range order {
			order[j] = int32(j)
			for i := j; i > 0 && level[order[i]] < level[order[i-1]]; i-- {
				order[i], order[i-1] = order[i-1], order[i]
			}
		}
		return
	}
	for j := range order {
		order[j] = int32(j)
	}
	slices.SortFunc(order, func(x, y int32) int {
		if c := cmpFloat(level[x], level[y]); c != 0 {
			return c
		}
		return cmp.Compare(x, y)
	})
}

// waterLevel finds λ with Σ clamp(λ·w_i, lo_i, hi_i) = capacity and writes
// the clamped allocations. When the ceilings cannot absorb capacity, every
// region gets hi; when the floors alone exceed it, floors are scaled down
// in proportion (only reachable from the allocator's internal use, where a
// silent region's fixed share may crowd out the others' floors).
func waterLevel(capacity float64, w, lo, hi, out []float64, fs *fillScratch) {
	n := len(w)
	lo, hi, out = lo[:n], hi[:n], out[:n]
	var sumLo, sumHi float64
	for i := range lo {
		sumLo += lo[i]
		sumHi += hi[i]
	}
	if sumHi <= capacity {
		copy(out, hi[:n])
		return
	}
	if sumLo >= capacity {
		scale := 0.0
		if sumLo > 0 {
			scale = capacity / sumLo
		}
		for i := 0; i < n; i++ {
			out[i] = lo[i] * scale
		}
		return
	}
	// The sweep visits the events (a region starting or stopping to rise
	// with the water) by level, then region, a start before a stop: the
	// starts and the stops sorted apart, then merged.
	ensure(&fs.startAt, n)
	ensure(&fs.stopAt, n)
	ensure(&fs.starts, n)
	ensure(&fs.stops, n)
	startAt, stopAt, starts, stops := fs.startAt[:n], fs.stopAt[:n], fs.starts[:n], fs.stops[:n]
	for i := range startAt {
		startAt[i] = lo[i] // lo/w when lo is ±0 (w > 0), without dividing
		if lo[i] != 0 {
			startAt[i] = lo[i] / w[i]
		}
		stopAt[i] = hi[i] / w[i]
	}
	sortByLevel(startAt, starts)
	sortByLevel(stopAt, stops)
	// Below the first event every region sits at its floor. Between events
	// the filled amount is fixed + λ·slope.
	fixed, slope := sumLo, 0.0
	level := -1.0
	for si, ei := 0, 0; si < n || ei < n; {
		start := ei == n
		if !start && si < n {
			s, e := starts[si], stops[ei]
			start = startAt[s] < stopAt[e] || startAt[s] == stopAt[e] && s <= e
		}
		var r int32
		var at float64
		if start {
			r = starts[si]
			at = startAt[r]
			si++
		} else {
			r = stops[ei]
			at = stopAt[r]
			ei++
		}
		if slope > 0 && fixed+slope*at >= capacity {
			level = (capacity - fixed) / slope
			break
		}
		if start {
			fixed -= lo[r]
			slope += w[r]
		} else {
			fixed += hi[r]
			slope -= w[r]
		}
	}
	if level < 0 {
		// Rounding kept the sweep from crossing capacity although Σhi >
		// capacity; the last segment is the one that reaches it.
		copy(out, hi[:n])
		return
	}
	for i := range out {
		out[i] = clamp(level*w[i], lo[i], hi[i])
	}
}
