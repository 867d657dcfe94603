package hierarchy

import "math"

// Floor is what a region may run a key on once its static lease has
// lapsed (or while it is drained): share (in [0, 1]; out of range is
// clamped, NaN is 0) of its static rate, and share of its static burst
// rounded down to whole units (unit <= 0 or non-finite means 1 token), so
// the floor's burst never exceeds the static burst and still admits a
// request of the largest cost when it is not zero. Share 1 returns the
// static rate and burst unchanged. Both sides of the static lease (the
// global tier reserving a lapsed region's floor, the region running on
// it) use this one function, so they agree to the bit.
func Floor(staticRate, staticBurst, share, unit float64) (rate, burst float64) {
	if !(share > 0) {
		return 0, 0
	}
	if share >= 1 {
		return staticRate, staticBurst
	}
	if !(unit > 0) || math.IsInf(unit, 0) {
		unit = 1
	}
	return share * staticRate, math.Floor(share*staticBurst/unit) * unit
}
