package envoyrls

import (
	"math"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

func TestPerUnit(t *testing.T) {
	const (
		sec  = rlsv3.RateLimitResponse_RateLimit_SECOND
		min_ = rlsv3.RateLimitResponse_RateLimit_MINUTE
		hour = rlsv3.RateLimitResponse_RateLimit_HOUR
		day  = rlsv3.RateLimitResponse_RateLimit_DAY
	)
	parse := func(s string) float64 {
		r, err := config.ParseRate(s)
		if err != nil {
			t.Fatal(err)
		}
		return float64(r)
	}
	cases := []struct {
		rate float64
		n    uint32
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{parse("100/s"), 100, sec},
		{parse("6/m"), 6, min_},
		{parse("1000/h"), 1000, hour},
		{parse("7/h"), 7, hour},
		{parse("2.5/s"), 150, min_},
		{0.5, 30, min_},
		{1.0 / 3, 20, min_},
		{7.0 / 86400, 7, day},
		{parse("50000.5/s"), 3000030, min_},
		{math.Pi, 271434, day},        // whole in no unit: rounded per day
		{1e-9, 1, day},                // below one per day: at least 1
		{123456.789, 444444440, hour}, // hours still fit in 32 bits
		{1e8 + 0.5, 100000001, sec},   // only seconds fit in 32 bits
		{5e9, math.MaxUint32, sec},    // beyond 32 bits: clamped
		{0, 0, rlsv3.RateLimitResponse_RateLimit_UNKNOWN},
	}
	for _, c := range cases {
		n, unit := perUnit(c.rate)
		if n != c.n || unit != c.unit {
			t.Errorf("perUnit(%v) = %d per %v, want %d per %v", c.rate, n, unit, c.n, c.unit)
		}
	}
}

func TestRefillWindow(t *testing.T) {
	cases := []struct {
		l    quota.Limit
		want int64
	}{
		{quota.Limit{Rate: 100, Burst: 100}, 1},
		{quota.Limit{Rate: 2, Burst: 5}, 3},
		{quota.Limit{Rate: 1.0 / 60, Burst: 3}, 180},
		{quota.Limit{Rate: 2000, Burst: 10}, 1},
		{quota.Limit{Rate: 1e-12, Burst: 1 << 40}, math.MaxInt32},
		{quota.Limit{}, 1},
	}
	for _, c := range cases {
		if got := refillWindow(c.l); got != c.want {
			t.Errorf("refillWindow(%+v) = %d, want %d", c.l, got, c.want)
		}
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		d      quota.Decision
		shadow bool
		want   result
	}{
		{quota.Decision{Allowed: true}, false, resultOK},
		{quota.Decision{Allowed: true, WouldDeny: true}, false, resultShadowDenied},
		{quota.Decision{WouldDeny: true}, false, resultOverLimit},
		{quota.Decision{}, false, resultOverLimit},
		// The config says shadow: a denial from a failure policy passes too.
		{quota.Decision{Degraded: true}, true, resultShadowDenied},
		{quota.Decision{Allowed: true}, true, resultOK},
	}
	for _, c := range cases {
		if got := classify(c.d, c.shadow); got != c.want {
			t.Errorf("classify(%+v, shadow %v) = %v, want %v", c.d, c.shadow, got, c.want)
		}
	}
}

func TestNewDecided(t *testing.T) {
	now := time.Unix(1000, 0)
	lim := quota.Limit{Rate: 10, Burst: 20}
	d := newDecided(now, lim, resultOverLimit, quota.Decision{Remaining: -3, ResetAt: now.Add(300 * time.Millisecond), RetryAfter: 2 * time.Second})
	if d.remaining != 0 || d.retry != 2*time.Second || d.reset != 2*time.Second {
		t.Errorf("over limit: %+v; want remaining 0, retry 2s, reset raised to the retry", d)
	}
	d = newDecided(now, lim, resultOK, quota.Decision{Allowed: true, Remaining: 1 << 40, ResetAt: now.Add(-time.Second), RetryAfter: time.Second})
	if d.remaining != 20 || d.cap != 20 || d.retry != 0 || d.reset != 0 {
		t.Errorf("allowed: %+v; want remaining clamped to the burst, no retry, a past reset as 0", d)
	}
	// The region's cap (what this caller can expect) bounds Remaining.
	d = newDecided(now, lim, resultOK, quota.Decision{Allowed: true, Remaining: 15, Cap: 7, CapKnown: true})
	if d.cap != 7 || d.remaining != 7 {
		t.Errorf("region cap 7: %+v; want cap 7 and remaining 7", d)
	}
	if d := newDecided(now, lim, resultOK, quota.Decision{Allowed: true, Remaining: 1 << 40, Cap: 1 << 40, CapKnown: true}); d.cap != 20 || d.remaining != 20 {
		t.Errorf("cap above the burst: %+v; want both at the burst", d)
	}
	if d := newDecided(now, lim, resultOK, quota.Decision{Allowed: true}); d.reset != 0 {
		t.Errorf("no reset time: reset %v, want 0", d.reset)
	}
}

func TestHeaders(t *testing.T) {
	over := decided{limit: quota.Limit{Rate: 2, Burst: 5}, cap: 3, result: resultOverLimit, remaining: 0, reset: 1500 * time.Millisecond, retry: 400 * time.Millisecond}
	ok := decided{limit: quota.Limit{Rate: 100, Burst: 100}, result: resultOK, remaining: 0, reset: 0}
	if !closerToExhaustion(over, ok) || closerToExhaustion(ok, over) {
		t.Error("an over-limit descriptor must be shown before an allowed one")
	}
	fewer := decided{result: resultOK, remaining: 3}
	more := decided{result: resultOK, remaining: 4}
	if !closerToExhaustion(fewer, more) || closerToExhaustion(more, fewer) || closerToExhaustion(fewer, fewer) {
		t.Error("among allowed descriptors the one with fewer tokens left is shown, the first on ties")
	}
	got := map[string]string{}
	for _, h := range headers(over, "write", true, false, 400*time.Millisecond) {
		got[h.GetKey()] = h.GetValue()
	}
	// The region's cap 3 first, then the policy (burst 5 refilled in 3 s);
	// every time field is the retry delay rounded up.
	want := map[string]string{
		HeaderLimit: "3, 5;w=3", HeaderRemaining: "0", HeaderReset: "1", HeaderRetryAfter: "1",
		HeaderRateLimitPolicy: `"write";q=5;w=3`, HeaderRateLimit: `"write";r=0;t=1`,
	}
	if len(got) != len(want) {
		t.Errorf("headers %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for _, h := range headers(ok, "read", false, false, 0) {
		if h.GetKey() == HeaderRetryAfter {
			t.Error("retry-after on an allowed request")
		}
	}
}

// TestNeverPromisesNoTime: an over-limit descriptor no wait can cure
// (Decision.RetryNever) gets no duration_until_reset, and the response no
// retry-after (nor an x-ratelimit-reset for it), even beside a descriptor
// that could pass after a wait.
func TestNeverPromisesNoTime(t *testing.T) {
	now := time.Unix(1000, 0)
	lim := quota.Limit{Rate: 0.1, Burst: 1}
	never := newDecided(now, lim, resultOverLimit, quota.Decision{Limit: 1, ResetAt: now.Add(5 * time.Second), RetryNever: true})
	if !never.never || never.retry != 0 || never.reset != 0 {
		t.Errorf("never: %+v; want never, no retry, no reset", never)
	}
	if st := never.status("export"); st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetDurationUntilReset() != nil {
		t.Errorf("never status %v: want OVER_LIMIT without duration_until_reset", st)
	}
	wait := newDecided(now, lim, resultOverLimit, quota.Decision{Limit: 1, RetryAfter: 3 * time.Second})
	if st := wait.status("export"); st.GetDurationUntilReset().AsDuration() != 3*time.Second {
		t.Errorf("waiting status %v: want duration_until_reset 3s", st)
	}
	for _, h := range headers(never, "export", true, true, wait.retry) {
		if k := h.GetKey(); k == HeaderRetryAfter || k == HeaderReset || (k == HeaderRateLimit && strings.Contains(h.GetValue(), "t=")) {
			t.Errorf("%s = %q on a never answer", k, h.GetValue())
		}
	}
}
