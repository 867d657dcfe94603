package engine

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Time is virtual time: nanoseconds since the start of the run.
type Time int64

// Add returns t+d.
func (t Time) Add(d time.Duration) Time { return t + Time(d) }

// Sub returns t-u as a duration.
func (t Time) Sub(u Time) time.Duration { return time.Duration(t - u) }

// Seconds returns t in seconds.
func (t Time) Seconds() float64 { return float64(t) / 1e9 }

// String renders t as a duration since the start ("1m30.5s").
func (t Time) String() string { return time.Duration(t).String() }

// At converts a duration since the start into a Time.
func At(d time.Duration) Time { return Time(d) }

type event struct {
	at  Time
	seq uint64
	fn  func()
}

// Engine runs events in virtual time. It is not safe for concurrent use:
// the whole simulation runs on the goroutine that calls Run.
type Engine struct {
	now    Time
	seq    uint64
	queue  []event // binary min-heap on (at, seq)
	seed   uint64
	events uint64
	// stopped ends RunUntil before its next event (Stop): the one field
	// another goroutine may touch.
	stopped atomic.Bool
}

// New returns an engine at time 0 whose random streams derive from seed.
func New(seed uint64) *Engine { return &Engine{seed: seed} }

// Now is the current virtual time.
func (e *Engine) Now() Time { return e.now }

// Seed is the run's seed.
func (e *Engine) Seed() uint64 { return e.seed }

// Events is how many events have run.
func (e *Engine) Events() uint64 { return e.events }

// Pending is how many events are queued.
func (e *Engine) Pending() int { return len(e.queue) }

// At schedules fn at t, which must not be before Now.
func (e *Engine) At(t Time, fn func()) {
	if t < e.now {
		panic(fmt.Sprintf("engine: event scheduled at %v, before now %v", t, e.now))
	}
	e.seq++
	e.queue = append(e.queue, event{at: t, seq: e.seq, fn: fn})
	e.up(len(e.queue) - 1)
}

// After schedules fn d after Now (d < 0 counts as 0).
func (e *Engine) After(d time.Duration, fn func()) {
	if d < 0 {
		d = 0
	}
	e.At(e.now+Time(d), fn)
}

// RunUntil runs every event scheduled at or before end, in order, and
// leaves the clock at end. Events scheduled meanwhile run too if they fall
// within end.
func (e *Engine) RunUntil(end Time) {
	for len(e.queue) > 0 && e.queue[0].at <= end {
		if e.stopped.Load() {
			return
		}
		ev := e.pop()
		e.now = ev.at
		e.events++
		ev.fn()
	}
	if end > e.now {
		e.now = end
	}
}

// Stop makes RunUntil return before its next event, the clock left where
// it is (an interrupted run). Safe to call from any goroutine, and more
// than once.
func (e *Engine) Stop() { e.stopped.Store(true) }

// Stopped reports whether Stop was called.
func (e *Engine) Stopped() bool { return e.stopped.Load() }

// Stream returns a random source derived from the seed and name: the same
// (seed, name) always gives the same sequence.
func (e *Engine) Stream(name string) *rand.Rand { return NewStream(e.seed, name) }

// NewStream is Engine.Stream without an engine.
func NewStream(seed uint64, name string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

func less(a, b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (e *Engine) up(i int) {
	q := e.queue
	for i > 0 {
		p := (i - 1) / 2
		if !less(&q[i], &q[p]) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (e *Engine) pop() event {
	q := e.queue
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q[last] = event{}
	q = q[:last]
	e.queue = q
	i := 0
	for {
		l := 2*i + 1
		if l >= len(q) {
			break
		}
		m := l
		if r := l + 1; r < len(q) && less(&q[r], &q[l]) {
			m = r
		}
		if !less(&q[m], &q[i]) {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	return top
}
