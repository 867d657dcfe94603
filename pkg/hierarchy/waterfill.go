package hierarchy

import (
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
	fs.want = growFloats(fs.want, n)
	fs.room = growFloats(fs.room, n)
	fs.zero = growFloats(fs.zero, n)
	want, room, zero := fs.want, fs.room, fs.zero
	var sumWant float64
	for i := 0; i < n; i++ {
		want[i] = min(max(demand[i], lo[i]), hi[i])
		sumWant += want[i]
		zero[i] = 0
	}
	if sumWant >= capacity {
		waterLevel(capacity, w, lo, want, out, fs)
		return
	}
	for i := 0; i < n; i++ {
		room[i] = hi[i] - want[i]
	}
	waterLevel(capacity-sumWant, w, zero, room, out, fs)
	for i := 0; i < n; i++ {
		out[i] += want[i]
	}
}

func growFloats(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}

// fillScratch holds buffers reused across calls so the allocation loop
// does not allocate per key.
type fillScratch struct {
	want, room, zero []float64
	ev               []levelEvent
}

// levelEvent is a point on the water level λ where one region starts to
// rise with the water (its floor is reached) or stops (its ceiling is).
type levelEvent struct {
	level  float64
	region int32
	start  bool
}

func eventLess(a, b levelEvent) bool {
	if a.level != b.level {
		return a.level < b.level
	}
	if a.region != b.region {
		return a.region < b.region
	}
	return a.start && !b.start
}

// waterLevel finds λ with Σ clamp(λ·w_i, lo_i, hi_i) = capacity and writes
// the clamped allocations. When the ceilings cannot absorb capacity, every
// region gets hi; when the floors alone exceed it, floors are scaled down
// in proportion (only reachable from the allocator's internal use, where a
// silent region's fixed share may crowd out the others' floors).
func waterLevel(capacity float64, w, lo, hi, out []float64, fs *fillScratch) {
	n := len(w)
	var sumLo, sumHi float64
	for i := 0; i < n; i++ {
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
	ev := fs.ev[:0]
	for i := 0; i < n; i++ {
		ev = append(ev,
			levelEvent{level: lo[i] / w[i], region: int32(i), start: true},
			levelEvent{level: hi[i] / w[i], region: int32(i), start: false})
	}
	fs.ev = ev
	if len(ev) <= 24 {
		for i := 1; i < len(ev); i++ {
			for j := i; j > 0 && eventLess(ev[j], ev[j-1]); j-- {
				ev[j], ev[j-1] = ev[j-1], ev[j]
			}
		}
	} else {
		slices.SortFunc(ev, func(a, b levelEvent) int {
			if eventLess(a, b) {
				return -1
			}
			if eventLess(b, a) {
				return 1
			}
			return 0
		})
	}
	// Below the first event every region sits at its floor. Between events
	// the filled amount is fixed + λ·slope.
	fixed, slope := sumLo, 0.0
	level := -1.0
	for _, e := range ev {
		if slope > 0 && fixed+slope*e.level >= capacity {
			level = (capacity - fixed) / slope
			break
		}
		if e.start {
			fixed -= lo[e.region]
			slope += w[e.region]
		} else {
			fixed += hi[e.region]
			slope -= w[e.region]
		}
	}
	if level < 0 {
		// Rounding kept the sweep from crossing capacity although Σhi >
		// capacity; the last segment is the one that reaches it.
		copy(out, hi[:n])
		return
	}
	for i := 0; i < n; i++ {
		out[i] = min(max(level*w[i], lo[i]), hi[i])
	}
}
