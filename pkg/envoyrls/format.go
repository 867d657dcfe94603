package envoyrls

import (
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/pkg/quota"
)

// Header names written when Options.Headers is on (lower case: HTTP/2).
const (
	HeaderLimit      = "x-ratelimit-limit"
	HeaderRemaining  = "x-ratelimit-remaining"
	HeaderReset      = "x-ratelimit-reset"
	HeaderRetryAfter = "retry-after"
)

// result is how one descriptor was decided, and a metric label value.
type result uint8

const (
	resultOK result = iota
	resultOverLimit
	resultShadowDenied
	numResults
)

func (r result) String() string {
	switch r {
	case resultOverLimit:
		return "over_limit"
	case resultShadowDenied:
		return "shadow_denied"
	}
	return "ok"
}

// classify turns a Decision into a result. shadow is the config's view:
// a key in shadow mode is never refused, whatever produced the decision.
func classify(d quota.Decision, shadow bool) result {
	switch {
	case d.Allowed && d.WouldDeny:
		return resultShadowDenied
	case d.Allowed:
		return resultOK
	case shadow:
		return resultShadowDenied
	}
	return resultOverLimit
}

var rateUnits = [...]struct {
	unit    rlsv3.RateLimitResponse_RateLimit_Unit
	seconds float64
}{
	{rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, 60},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, 3600},
	{rlsv3.RateLimitResponse_RateLimit_DAY, 86400},
}

// wholeTolerance absorbs float error in rate × unit: 6/m is stored as
// 0.1 tokens/s, and 0.1 × 60 is not exactly 6.
const wholeTolerance = 1e-9

// perUnit expresses rate (tokens/s) as a whole count per unit: the
// shortest unit in which it is whole, else rounded in the longest unit
// whose count fits in 32 bits (the most precise). The count is at least 1.
func perUnit(rate float64) (uint32, rlsv3.RateLimitResponse_RateLimit_Unit) {
	if !(rate > 0) {
		return 0, rlsv3.RateLimitResponse_RateLimit_UNKNOWN
	}
	if rate >= math.MaxUint32 {
		return math.MaxUint32, rlsv3.RateLimitResponse_RateLimit_SECOND
	}
	for _, u := range rateUnits {
		n := rate * u.seconds
		if n > math.MaxUint32 {
			break
		}
		if r := math.Round(n); r >= 1 && math.Abs(n-r) <= wholeTolerance*r {
			return uint32(r), u.unit
		}
	}
	unit := rateUnits[0] // fits: rate < 2^32 was checked above
	for _, u := range rateUnits[1:] {
		if rate*u.seconds <= math.MaxUint32 {
			unit = u
		}
	}
	return uint32(max(math.Round(rate*unit.seconds), 1)), unit.unit
}

// refillWindow is the whole seconds, rounded up and at least 1, an empty
// bucket takes to refill to its burst: the quota-policy window under which
// "burst per window" is the key's rate.
func refillWindow(l quota.Limit) int64 {
	if !(l.Rate > 0) || l.Burst < 1 {
		return 1
	}
	w := math.Ceil(float64(l.Burst) / l.Rate)
	if w > math.MaxInt32 {
		return math.MaxInt32
	}
	return max(int64(w), 1)
}

// ceilSeconds rounds d up to whole seconds (0 for d <= 0).
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// decided is one matched descriptor after its decision.
type decided struct {
	limit     quota.Limit
	result    result
	remaining uint32
	reset     time.Duration // until the bucket is full again, >= retry
	retry     time.Duration // > 0 only when over limit
	// never: over limit, and no wait cures it (Decision.RetryNever); no
	// reset or retry time is promised then.
	never bool
}

func newDecided(now time.Time, limit quota.Limit, r result, d quota.Decision) decided {
	out := decided{limit: limit, result: r}
	out.remaining = uint32(min(max(d.Remaining, 0), math.MaxUint32))
	if !d.ResetAt.IsZero() {
		out.reset = max(d.ResetAt.Sub(now), 0)
	}
	switch {
	case r == resultOverLimit && d.RetryNever:
		out.never, out.reset = true, 0
	case r == resultOverLimit:
		out.retry = max(d.RetryAfter, 0)
		out.reset = max(out.reset, out.retry)
	}
	return out
}

func (dd decided) status(className string) *rlsv3.RateLimitResponse_DescriptorStatus {
	code := rlsv3.RateLimitResponse_OK
	if dd.result == resultOverLimit {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	n, unit := perUnit(dd.limit.Rate)
	st := &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:           code,
		CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{Name: className, RequestsPerUnit: n, Unit: unit},
		LimitRemaining: dd.remaining,
	}
	if !dd.never {
		st.DurationUntilReset = durationpb.New(dd.reset)
	}
	return st
}

// closerToExhaustion reports whether a should be the descriptor the
// headers describe rather than b: over limit first, then fewer remaining.
func closerToExhaustion(a, b decided) bool {
	aOver, bOver := a.result == resultOverLimit, b.result == resultOverLimit
	if aOver != bOver {
		return aOver
	}
	return a.remaining < b.remaining
}

// headers builds the x-ratelimit-* fields for the descriptor shown, and
// retry-after when the request is over limit, unless never: no wait can
// admit some over-limit descriptor. x-ratelimit-reset is left out
// when the descriptor shown is such a one (it has no duration_until_reset).
func headers(shown decided, overLimit, never bool, retry time.Duration) []*corev3.HeaderValue {
	limit := strconv.FormatInt(shown.limit.Burst, 10)
	h := []*corev3.HeaderValue{
		{Key: HeaderLimit, Value: limit + ", " + limit + ";w=" + strconv.FormatInt(refillWindow(shown.limit), 10)},
		{Key: HeaderRemaining, Value: strconv.FormatUint(uint64(shown.remaining), 10)},
	}
	if !shown.never {
		h = append(h, &corev3.HeaderValue{Key: HeaderReset, Value: strconv.FormatInt(ceilSeconds(shown.reset), 10)})
	}
	if overLimit && !never {
		h = append(h, &corev3.HeaderValue{Key: HeaderRetryAfter, Value: strconv.FormatInt(max(ceilSeconds(retry), 1), 10)})
	}
	return h
}
