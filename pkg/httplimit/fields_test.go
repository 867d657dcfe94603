package httplimit

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestComputeFieldsEdges pins computeFields at its bounds: negative Limit
// and Cap count as 0, a Cap above a positive Limit is cut to it (a Limit
// of 0 or 1 included), Remaining is clamped to the limit, the policy is
// never below the limit shown, a denial is retried at least 1 s after
// Date also when the clock is on a whole second and the limiter says
// "now", and an admitted request with RetryNever (shadow mode) keeps its
// reset time.
func TestComputeFieldsEdges(t *testing.T) {
	whole := time.Unix(1_700_000_000, 0)
	quarter := whole.Add(250 * time.Millisecond)
	const date = 1_700_000_000
	cases := []struct {
		name string
		d    quota.Decision
		now  time.Time
		want fields
	}{
		{"negative limit", quota.Decision{Allowed: true, Limit: -5, Remaining: 3}, quarter,
			fields{policy: 0, limit: 0, remaining: 0, date: date}},
		{"positive limit, no cap", quota.Decision{Allowed: true, Limit: 5, Remaining: 9}, quarter,
			fields{policy: 5, limit: 5, remaining: 5, date: date}},
		{"negative cap", quota.Decision{Allowed: true, Limit: 5, Cap: -3, CapKnown: true, Remaining: 2}, quarter,
			fields{policy: 5, limit: 0, remaining: 0, date: date}},
		{"cap above the limit", quota.Decision{Allowed: true, Limit: 5, Cap: 7, CapKnown: true, Remaining: 6}, quarter,
			fields{policy: 5, limit: 5, remaining: 5, date: date}},
		{"cap above a limit of 1", quota.Decision{Allowed: true, Limit: 1, Cap: 7, CapKnown: true, Remaining: 6}, quarter,
			fields{policy: 1, limit: 1, remaining: 1, date: date}},
		{"cap without a limit", quota.Decision{Allowed: true, Limit: 0, Cap: 7, CapKnown: true, Remaining: 6}, quarter,
			fields{policy: 7, limit: 7, remaining: 6, date: date}},
		{"denied now, on a whole second", quota.Decision{Limit: 5, RetryAfter: 0}, whole,
			fields{policy: 5, limit: 5, date: date, reset: 1, denied: true, retryAfter: 1}},
		{"denied 1s from a whole second", quota.Decision{Limit: 5, RetryAfter: time.Second}, whole,
			fields{policy: 5, limit: 5, date: date, reset: 1, denied: true, retryAfter: 1}},
		{"shadow with RetryNever", quota.Decision{Allowed: true, WouldDeny: true, RetryNever: true, Limit: 5, ResetAt: quarter.Add(2 * time.Second)}, quarter,
			fields{policy: 5, limit: 5, date: date, reset: 3}},
	}
	for _, c := range cases {
		if got := computeFields(c.d, c.now); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestCeilSecondsEdges: a window rounds up to whole seconds; a nanosecond
// is 1 s, nothing or less is 0.
func TestCeilSecondsEdges(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{
		{-2 * time.Second, 0}, {-1500 * time.Millisecond, 0}, {0, 0}, {time.Nanosecond, 1},
		{time.Second, 1}, {time.Second + time.Nanosecond, 2},
	} {
		if got := ceilSeconds(c.d); got != c.want {
			t.Errorf("ceilSeconds(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}
