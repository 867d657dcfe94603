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
		// Exactly one per unit is named in that unit (the shortest whole
		// one); a rate whole in no unit whose hours overflow 32 bits is
		// rounded per minute.
		{1, 1, sec},
		{1.0 / 60, 1, min_},
		{1.0 / 3600, 1, hour},
		{1.0 / 86400, 1, day},
		{2e6 + 1.0/7, 120000009, min_},
		// The tolerance for float error grows with the count: 1000000/m
		// is stored as 16666.666…/s, and times 60 is 1e6 plus about 1e-10.
		{parse("1000000/m"), 1000000, min_},
	}
	for _, c := range cases {
		n, unit := perUnit(c.rate)
		if n != c.n || unit != c.unit {
			t.Errorf("perUnit(%v) = %d per %v, want %d per %v", c.rate, n, unit, c.n, c.unit)
		}
	}
}

// TestLimitUnitIsTheWindowThatRefillsTheBurst: a limit whose burst one
// unit's refill makes exactly is reported as its burst per that unit (an
// envoy ratelimit limit of 60 per minute, imported as 1/s with a burst of
// 60, was reported 1 per SECOND, and Envoy's headers said so); any other
// limit as perUnit of its rate.
func TestLimitUnitIsTheWindowThatRefillsTheBurst(t *testing.T) {
	const sec, min_, hour, day = rlsv3.RateLimitResponse_RateLimit_SECOND, rlsv3.RateLimitResponse_RateLimit_MINUTE,
		rlsv3.RateLimitResponse_RateLimit_HOUR, rlsv3.RateLimitResponse_RateLimit_DAY
	for _, c := range []struct {
		limit quota.Limit
		n     uint32
		unit  rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{quota.Limit{Rate: 10, Burst: 10}, 10, sec},
		{quota.Limit{Rate: 1, Burst: 60}, 60, min_},
		{quota.Limit{Rate: 2, Burst: 120}, 120, min_},
		{quota.Limit{Rate: 1, Burst: 3600}, 3600, hour},
		{quota.Limit{Rate: 1, Burst: 86400}, 86400, day},
		{quota.Limit{Rate: 50.0 / 60, Burst: 50}, 50, min_},
		// The rate times the unit falls short of the burst by float error
		// (10.999999999999998): the count is the burst, not its truncation.
		{quota.Limit{Rate: 11.0 / 86400, Burst: 11}, 11, day},
		// The error grows with the burst (4.8e-7 here), and the tolerance
		// with it: a burst per day whose rate is also whole per hour.
		{quota.Limit{Rate: 3999984072.0 / 86400, Burst: 3999984072}, 3999984072, day},
		// No unit refills the burst: the rate per its shortest whole unit.
		{quota.Limit{Rate: 1, Burst: 100}, 1, sec},
		{quota.Limit{Rate: 0.1, Burst: 20}, 6, min_},
		{quota.Limit{Rate: 0, Burst: 10}, 0, rlsv3.RateLimitResponse_RateLimit_UNKNOWN},
	} {
		if n, unit := limitUnit(c.limit); n != c.n || unit != c.unit {
			t.Errorf("limitUnit(%+v) = %d per %v, want %d per %v", c.limit, n, unit, c.n, c.unit)
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
		// A burst of one token takes 1/rate to refill; a key without a
		// rate gets the 1 s window rather than an unbounded one.
		{quota.Limit{Rate: 0.1, Burst: 1}, 10},
		{quota.Limit{Rate: 0, Burst: 5}, 1},
		{quota.Limit{Rate: 0.25, Burst: 1}, 4},
		// An infinite rate refills at once: still the 1 s window.
		{quota.Limit{Rate: math.Inf(1), Burst: 5}, 1},
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
	// In shadow mode the same denial is answered OK: still no time (the
	// region was not asked), where it said r=0;t=0.
	shadow := newDecided(now, lim, resultShadowDenied, quota.Decision{WouldDeny: true, Limit: 1, RetryNever: true})
	if st := shadow.status("export"); st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetDurationUntilReset() != nil {
		t.Errorf("shadow never status %v: want OK without duration_until_reset", st)
	}
	for _, h := range headers(shadow, "export", false, false, 0) {
		if k := h.GetKey(); k == HeaderRetryAfter || k == HeaderReset || (k == HeaderRateLimit && strings.Contains(h.GetValue(), "t=")) {
			t.Errorf("%s = %q on a shadow never answer", k, h.GetValue())
		}
	}
}

// TestCeilSeconds: durations round up to whole seconds; an exact second
// stays itself, nothing left is 0, and the largest Duration does not
// overflow into a wait of nothing.
func TestCeilSeconds(t *testing.T) {
	cases := []struct {
		d    time.Duration
		want int64
	}{
		{-2 * time.Second, 0}, {-time.Second, 0}, {0, 0}, {time.Nanosecond, 1}, {time.Second, 1},
		{time.Second + time.Nanosecond, 2}, {1500 * time.Millisecond, 2}, {3 * time.Second, 3},
		{math.MaxInt64, math.MaxInt64/int64(time.Second) + 1},
	}
	for _, c := range cases {
		if got := ceilSeconds(c.d); got != c.want {
			t.Errorf("ceilSeconds(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

// TestNewDecidedEdges: a region cap of 0 means nothing can be expected
// now (cap and remaining 0), and an over-limit decision without a retry
// time has no retry delay of its own but names, as retry-after does, the
// next whole second (reset 1s).
func TestNewDecidedEdges(t *testing.T) {
	now := time.Unix(1000, 0)
	lim := quota.Limit{Rate: 10, Burst: 20}
	if d := newDecided(now, lim, resultOK, quota.Decision{Allowed: true, Remaining: 5, Cap: 0, CapKnown: true}); d.cap != 0 || d.remaining != 0 {
		t.Errorf("region cap 0: %+v; want cap 0 and remaining 0", d)
	}
	if d := newDecided(now, lim, resultOverLimit, quota.Decision{}); d.retry != 0 || d.reset != time.Second || d.never {
		t.Errorf("over limit without a retry time: %+v; want retry 0, reset 1s", d)
	}
}

// TestHeaderTimes: over limit, every time field is the retry delay
// rounded up and at least 1, past the precomputed values too; allowed,
// x-ratelimit-reset is the time until the shown key is full again and
// there is no retry-after.
func TestHeaderTimes(t *testing.T) {
	lim := quota.Limit{Rate: 0.01, Burst: 5}
	cases := []struct {
		name      string
		dd        decided
		overLimit bool
		retry     time.Duration
		want      map[string]string
	}{
		{"over, retry 2.5s", decided{limit: lim, cap: 5, result: resultOverLimit}, true, 2500 * time.Millisecond,
			map[string]string{HeaderReset: "3", HeaderRetryAfter: "3", HeaderRateLimit: `"c";r=0;t=3`}},
		{"over, no retry time", decided{limit: lim, cap: 5, result: resultOverLimit}, true, 0,
			map[string]string{HeaderReset: "1", HeaderRetryAfter: "1", HeaderRateLimit: `"c";r=0;t=1`}},
		{"over, retry 120s", decided{limit: lim, cap: 5, result: resultOverLimit}, true, 120 * time.Second,
			map[string]string{HeaderReset: "120", HeaderRetryAfter: "120", HeaderRateLimit: `"c";r=0;t=120`}},
		{"over, retry 121s", decided{limit: lim, cap: 5, result: resultOverLimit}, true, 121 * time.Second,
			map[string]string{HeaderReset: "121", HeaderRetryAfter: "121", HeaderRateLimit: `"c";r=0;t=121`}},
		{"over, retry 500s", decided{limit: lim, cap: 5, result: resultOverLimit}, true, 500 * time.Second,
			map[string]string{HeaderReset: "500", HeaderRetryAfter: "500", HeaderRateLimit: `"c";r=0;t=500`}},
		{"allowed, full in 121s", decided{limit: lim, cap: 5, remaining: 3, reset: 121 * time.Second}, false, 0,
			map[string]string{HeaderReset: "121", HeaderRemaining: "3", HeaderRateLimit: `"c";r=3;t=121`}},
		{"allowed, full in 1234s", decided{limit: lim, cap: 5, remaining: 4, reset: 1234 * time.Second}, false, 0,
			map[string]string{HeaderReset: "1234", HeaderRemaining: "4", HeaderRateLimit: `"c";r=4;t=1234`}},
	}
	for _, c := range cases {
		got := map[string]string{}
		hs := headers(c.dd, "c", c.overLimit, false, c.retry)
		for _, h := range hs {
			got[h.GetKey()] = h.GetValue()
		}
		wantN := 5
		if c.overLimit {
			wantN = 6
		}
		if len(hs) != wantN || len(got) != wantN {
			t.Errorf("%s: %d headers %v, want %d", c.name, len(hs), got, wantN)
		}
		if _, ok := got[HeaderRetryAfter]; ok != c.overLimit {
			t.Errorf("%s: retry-after present %v, want %v", c.name, ok, c.overLimit)
		}
		for k, v := range c.want {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q", c.name, k, got[k], v)
			}
		}
	}
}

// TestSharedPartsFollowTheCap: the cached limit header of a class
// follows the region's cap when it changes and the limit does not.
func TestSharedPartsFollowTheCap(t *testing.T) {
	cache := &classCounters{class: "read"}
	lim := quota.Limit{Rate: 100, Burst: 200}
	for _, c := range []struct {
		cap  int64
		want string
	}{{200, "200, 200;w=2"}, {150, "150, 200;w=2"}, {150, "150, 200;w=2"}, {200, "200, 200;w=2"}} {
		dd := decided{limit: lim, cap: c.cap, cache: cache}
		if got := headers(dd, "read", false, false, 0)[0]; got.GetKey() != HeaderLimit || got.GetValue() != c.want {
			t.Errorf("cap %d: %s = %q, want %q", c.cap, got.GetKey(), got.GetValue(), c.want)
		}
	}
}

// TestNewDecidedTimesAndBounds pins newDecided's reset, retry and cap at
// their edges: an allowed decision's reset is the time until ResetAt; an
// over-limit one's is the retry delay in whole seconds, at least one,
// however long the bucket takes to fill (it is what retry-after says); a
// negative retry delay is none; a shadow answer of a never denial is not a never
// answer (it keeps its reset); a negative region cap or burst is 0.
func TestNewDecidedTimesAndBounds(t *testing.T) {
	now := time.Unix(1000, 0)
	lim := quota.Limit{Rate: 10, Burst: 20}
	cases := []struct {
		name         string
		limit        quota.Limit
		r            result
		d            quota.Decision
		cap          int64
		remaining    uint32
		reset, retry time.Duration
		never        bool
	}{
		{"allowed, full in 1.5s", lim, resultOK,
			quota.Decision{Allowed: true, Remaining: 5, ResetAt: now.Add(1500 * time.Millisecond)},
			20, 5, 1500 * time.Millisecond, 0, false},
		{"over limit, full after the retry", lim, resultOverLimit,
			quota.Decision{ResetAt: now.Add(5 * time.Second), RetryAfter: time.Second},
			20, 0, time.Second, time.Second, false},
		{"over limit, retry of a fraction, full in an hour", lim, resultOverLimit,
			quota.Decision{ResetAt: now.Add(time.Hour), RetryAfter: 1200 * time.Millisecond},
			20, 0, 2 * time.Second, 1200 * time.Millisecond, false},
		{"over limit, negative retry", lim, resultOverLimit,
			quota.Decision{ResetAt: now.Add(2 * time.Second), RetryAfter: -time.Second},
			20, 0, time.Second, 0, false},
		{"shadow answer of a never denial", lim, resultShadowDenied,
			quota.Decision{Remaining: 0, ResetAt: now.Add(3 * time.Second), RetryNever: true},
			20, 0, 3 * time.Second, 0, false},
		{"shadow answer of a never denial with no reset known (a cost above the burst, the region not asked)", lim, resultShadowDenied,
			quota.Decision{WouldDeny: true, Limit: 20, RetryNever: true},
			20, 0, 0, 0, true},
		{"negative region cap", lim, resultOK,
			quota.Decision{Allowed: true, Remaining: 5, Cap: -3, CapKnown: true},
			0, 0, 0, 0, false},
		{"zero burst", quota.Limit{Rate: 10}, resultOK,
			quota.Decision{Allowed: true, Remaining: 5},
			0, 0, 0, 0, false},
		{"negative burst", quota.Limit{Rate: 10, Burst: -1}, resultOK,
			quota.Decision{Allowed: true, Remaining: 5},
			0, 0, 0, 0, false},
	}
	for _, c := range cases {
		d := newDecided(now, c.limit, c.r, c.d)
		if d.cap != c.cap || d.remaining != c.remaining || d.reset != c.reset || d.retry != c.retry || d.never != c.never {
			t.Errorf("%s: cap %d, remaining %d, reset %v, retry %v, never %v; want %d, %d, %v, %v, %v",
				c.name, d.cap, d.remaining, d.reset, d.retry, d.never, c.cap, c.remaining, c.reset, c.retry, c.never)
		}
	}
}

// TestSFString: a structured-field String escapes '"' and '\' and
// replaces every byte outside 0x20..0x7E, keeping both ends of the range.
func TestSFString(t *testing.T) {
	cases := []struct{ in, want string }{
		{"read", `"read"`},
		{"", `""`},
		{`a"b`, `"a\"b"`},
		{`a\b`, `"a\\b"`},
		{"a b~", `"a b~"`},
		{"a\x1fb\x7fc", `"a?b?c"`},
		{"\x00é", `"???"`},
	}
	for _, c := range cases {
		if got := sfString(c.in); got != c.want {
			t.Errorf("sfString(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}

// TestSharedPartsOfAnotherClass: a decision whose cache belongs to
// another class is described under the class asked for.
func TestSharedPartsOfAnotherClass(t *testing.T) {
	lim := quota.Limit{Rate: 100, Burst: 200}
	cache := &classCounters{class: "read"}
	headers(decided{limit: lim, cap: 200, cache: cache}, "read", false, false, 0) // fills the cache
	for _, h := range headers(decided{limit: lim, cap: 200, cache: cache}, "write", false, false, 0) {
		if h.GetKey() == HeaderRateLimitPolicy && h.GetValue() != `"write";q=200;w=2` {
			t.Errorf("%s = %q, want the class write", h.GetKey(), h.GetValue())
		}
	}
}
