package lease

import "time"

// maxBuiltUS bounds a report's build time (exact in the region's Lua
// numbers; the region refuses more).
const maxBuiltUS = 1 << 53

// builtUS is now on the table's own clock, for a report built at now: µs
// since the first report the table built, plus 1 (0 on the wire means not
// given). With the clock readings the client passes (time.Now) it is
// monotonic; reports of one lease are built in seq order, so their times
// never decrease.
func (t *Table) builtUS(now time.Time) int64 {
	t.originOnce.Do(func() { t.origin = now })
	return min(max(now.Sub(t.origin).Microseconds(), 0)+1, maxBuiltUS)
}

// at is now as the owner side stores it per key: the time since the first
// instant the table stored (a duration is a third of a time.Time). The
// difference of two is the difference of the instants, on the monotonic
// clock when both readings carry it, as time.Time.Sub is.
func (t *Table) at(now time.Time) time.Duration {
	t.zeroOnce.Do(func() { t.zero = now })
	return now.Sub(t.zero)
}

// instant is now as keyInfo stores it (see at).
func (t *Table) instant(now time.Time) instant { return instant(t.at(now)) }

// timeOf is the time an instant was made of (time.Time{} for never). Its
// wall reading is the table's zero's plus the instant, so it equals the
// original's where the two clocks agree.
func (t *Table) timeOf(i instant) time.Time {
	if i == never {
		return time.Time{}
	}
	return t.zero.Add(time.Duration(i))
}
