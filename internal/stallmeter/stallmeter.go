// Package stallmeter measures how much wall time a test process was denied
// the CPU, so a test that judges the daemons it runs in its own process by
// a wall-clock bound can add the time they could not run to that bound: a
// timer that wakes every Tick notes how late each wake came, and the
// daemons' timers and goroutines were late by about as much. A quiet
// machine measures next to nothing, so the bound is judged as written
// there; a starved one is judged on the time the process had.
//
// A Meter is safe for concurrent use. Durations are wall time.
package stallmeter

import (
	"sync"
	"testing"
	"time"
)

// Tick is how often the meter wakes.
const Tick = 5 * time.Millisecond

// Meter measures stalls from Start until Stop (or the test's end).
type Meter struct {
	mu    sync.Mutex
	late  []stall // guarded by mu
	ended bool    // guarded by mu
	halt  chan struct{}
	done  chan struct{}
}

// stall is a wake that came late: the process lost (at-late, at].
type stall struct {
	at   time.Time
	late time.Duration
}

// Start starts a meter that stops when tb's test ends.
func Start(tb testing.TB) *Meter {
	m := &Meter{halt: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		last := time.Now()
		for {
			select {
			case <-m.halt:
				return
			case <-time.After(Tick):
			}
			now := time.Now()
			if late := now.Sub(last) - Tick; late > 0 {
				m.note(now, late)
			}
			last = now
		}
	}()
	tb.Cleanup(func() { m.Stop() })
	return m
}

func (m *Meter) note(at time.Time, late time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.late = append(m.late, stall{at, late})
}

// Since is the stall measured after from (the part of a stall before from
// is not counted).
func (m *Meter) Since(from time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var sum time.Duration
	for _, s := range m.late {
		if d := s.at.Sub(from); d > 0 {
			sum += min(s.late, d)
		}
	}
	return sum
}

// Total is the stall measured so far.
func (m *Meter) Total() time.Duration { return m.Since(time.Time{}) }

// Stop ends the measurement and returns the total; it may be called more
// than once.
func (m *Meter) Stop() time.Duration {
	m.mu.Lock()
	if !m.ended {
		m.ended = true
		close(m.halt)
	}
	m.mu.Unlock()
	<-m.done
	return m.Total()
}
