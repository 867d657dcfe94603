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
	mu    sync.Mutex // guards orc, last and done
	orc   *oracle.Oracle
	start time.Time
	scale float64
	last  time.Duration
	// done is set by finish: the daemons keep running (and applying
	// grants) until the deployment is closed, but once the oracle has
	// finished the outcome reads it without the lock, so nothing may
	// reach it any more.
	done bool
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

// do hands f the oracle and the scenario time, unless the run finished.
func (r *recorder) do(f func(o *oracle.Oracle, now time.Duration)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	f(r.orc, r.nowLocked())
}

// finish runs f as the last call that reaches the oracle.
func (r *recorder) finish(f func(o *oracle.Oracle, now time.Duration)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		f(r.orc, r.nowLocked())
		r.done = true
	}
}
