package live

import (
	"sync"
	"time"

	"github.com/sluicehq/sluice/sim/oracle"
)

// recorder serialises observations into the oracle in scenario time: wall
// time since the start times the scale, read under the lock so calls reach
// the oracle in non-decreasing order. Safe for concurrent use.
type recorder struct {
	mu    sync.Mutex // guards orc and last
	orc   *oracle.Oracle
	start time.Time
	scale float64
	last  time.Duration
}

// now is the scenario time; the caller holds mu.
func (r *recorder) nowLocked() time.Duration {
	t := time.Duration(float64(time.Since(r.start)) * r.scale)
	r.last = max(r.last, t)
	return r.last
}

// virtual converts a wall-clock instant into scenario time.
func (r *recorder) virtual(at time.Time) time.Duration {
	return time.Duration(float64(at.Sub(r.start)) * r.scale)
}

func (r *recorder) do(f func(o *oracle.Oracle, now time.Duration)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r.orc, r.nowLocked())
}
