package regional

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regional/reply"
)

// Script deadlines. A replica chooses each key's static share (or floor)
// from its estimate of Redis time for a script that runs within its bound
// on Redis; the static lease's margin covers that bound. A script that
// waits longer in Redis (a paused or overloaded server runs what queued
// up when it resumes, long after every caller gave up) must not act on
// that choice: every script carries a deadline in Redis time
// (luascripts.Common.DeadlineUS) and changes nothing when it runs after
// it.
//
// The deadline is a lower estimate of Redis time at the choice plus the
// bound (reply.DeadlineUS), so it can only come early, never late.
// lowClock keeps the estimate: Redis read the time a reply carries (a
// script's NowUS, TIME) before the reply reached this process, so that
// time minus the local time the reply was received underestimates the
// offset between Redis's clock and the local monotonic clock, and the
// offset plus the local time now underestimates Redis time now. Of the
// readings of the last lowWindow the largest offset is the closest
// underestimate (the one whose reply came back fastest); older ones give
// way to any newer one, so the estimate stays an underestimate up to the
// two clocks' rate difference over a second (StaticMargin covers drift
// as it does for the upper estimate), and a Redis clock stepped back makes
// deadlines late by at most the step, for at most lowWindow. A clock
// stepped forward only makes deadlines early: a call answered too late
// brings the new time back with it.

// lowWindow is how long the closest reading is kept over newer ones.
const lowWindow = time.Second

// lowClock is the replica's lower estimate of Redis time. Safe for
// concurrent use.
type lowClock struct {
	base time.Time // the local monotonic origin of offsets
	// cur is the reading in force (nil before the first).
	cur atomic.Pointer[lowReading]
	// reading is closed when the first reading in flight ends (nil: none
	// in flight; Server.readLowClock); mu guards it.
	mu      sync.Mutex
	reading chan struct{}
}

// lowReading is one reading: off is Redis time (µs) minus the local
// monotonic time since base (µs) it was received at, at.
type lowReading struct{ off, at int64 }

func newLowClock() *lowClock { return &lowClock{base: time.Now()} }

// note records a reading: Redis time redisUS, carried by a reply received
// at local time recv (read after the reply arrived). It replaces the
// reading in force unless that one is closer (a larger offset) and less
// than lowWindow older.
func (c *lowClock) note(redisUS int64, recv time.Time) {
	if recv.Before(c.base) {
		return // not this clock (see foreign)
	}
	// Rounding the local time up keeps the offset an underestimate.
	local := (recv.Sub(c.base) + time.Microsecond - 1).Microseconds()
	r := &lowReading{off: redisUS - local, at: local}
	for {
		cur := c.cur.Load()
		if cur != nil && cur.off >= r.off && r.at-cur.at < lowWindow.Microseconds() {
			return
		}
		if c.cur.CompareAndSwap(cur, r) {
			return
		}
	}
}

// foreign reports whether now cannot be a reading of the clock the
// offsets are measured on: a local monotonic time before the clock's
// origin, which only a test's fake clock (a synctest bubble calling a
// server made outside it) gives.
func (c *lowClock) foreign(now time.Time) bool { return now.Before(c.base) }

// estimate is the lower estimate of Redis time at local time now; false
// before any reading.
func (c *lowClock) estimate(now time.Time) (int64, bool) {
	r := c.cur.Load()
	if r == nil {
		return 0, false
	}
	return r.off + now.Sub(c.base).Microseconds(), true
}

// errNoRedisTime: the replica has no reading of Redis time yet, and could
// not take one, so it cannot bound a script in Redis time.
var errNoRedisTime = errors.New("no reading of redis time yet")

// deadline is the DeadlineUS of a script whose settings are chosen at
// local time now under cfg: the lower estimate of Redis time then plus
// the bound (reply.DeadlineUS). With no reading yet it takes one first
// (one TIME round trip, bounded by RedisTimeout; once per process).
func (s *Server) deadline(cfg *config.Config, now time.Time) (int64, error) {
	if s.low.foreign(now) {
		// No Redis time can be derived from a fake clock: the script runs
		// unbounded, as before deadlines (never in production).
		return 0, nil
	}
	est, ok := s.low.estimate(now)
	if !ok {
		if err := s.readLowClock(); err != nil {
			return 0, err
		}
		now = time.Now()
		est, _ = s.low.estimate(now)
	}
	return reply.DeadlineUS(est, s.opts.RedisTimeout, time.Duration(cfg.Epoch)), nil
}

// readLowClock takes the first reading of Redis time: one call reads, the
// calls that come meanwhile wait for it; none waits longer than
// RedisTimeout.
func (s *Server) readLowClock() error {
	c := s.low
	c.mu.Lock()
	if c.cur.Load() != nil {
		c.mu.Unlock()
		return nil
	}
	ch, owner := c.reading, false
	if ch == nil {
		ch, owner = make(chan struct{}), true
		c.reading = ch
	}
	c.mu.Unlock()
	if !owner {
		t := time.NewTimer(s.opts.RedisTimeout)
		defer t.Stop()
		select {
		case <-ch:
		case <-t.C:
		}
		if c.cur.Load() == nil {
			return fmt.Errorf("%w: another call's reading did not end in time", errNoRedisTime)
		}
		return nil
	}
	defer func() {
		c.mu.Lock()
		c.reading = nil
		c.mu.Unlock()
		close(ch)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RedisTimeout)
	defer cancel()
	t, err := s.opts.Redis.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("%w: %v", errNoRedisTime, err)
	}
	c.note(t.UnixMicro(), time.Now())
	return nil
}

// noteNow records the Redis time a script's answer carries (0: none).
func (s *Server) noteNow(nowUS int64, recv time.Time) {
	if nowUS > 0 {
		s.low.note(nowUS, recv)
	}
}
