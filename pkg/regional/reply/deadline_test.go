package reply

import (
	"testing"
	"time"
)

// TestDeadlineIsTheCallersBoundWithinTheStaticMargin: a script's deadline
// is the lower estimate of Redis time at the choice plus the caller's
// bound on Redis, but never more than the static lease's margin (an
// epoch), the time a chosen static share may still be used.
func TestDeadlineIsTheCallersBoundWithinTheStaticMargin(t *testing.T) {
	const now = int64(1_700_000_000_000_000)
	for _, tc := range []struct {
		name                string
		redisTimeout, epoch time.Duration
		want                int64
	}{
		{"the bound within the margin", 500 * time.Millisecond, time.Second, now + 500_000},
		{"the bound equal to the margin", time.Second, time.Second, now + 1_000_000},
		{"the margin below the bound", time.Second, 50 * time.Millisecond, now + 50_000},
		{"no bound", 0, time.Second, now},
	} {
		if got := DeadlineUS(now, tc.redisTimeout, tc.epoch); got != tc.want {
			t.Errorf("%s: DeadlineUS(now, %v, %v) = now%+d, want now%+d", tc.name, tc.redisTimeout, tc.epoch, got-now, tc.want-now)
		}
	}
}
