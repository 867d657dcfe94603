package envoyrls

import (
	"math"
	"strconv"
	"strings"
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
	// HeaderRateLimit and HeaderRateLimitPolicy are the IETF draft's
	// structured fields (see the package doc).
	HeaderRateLimit       = "ratelimit"
	HeaderRateLimitPolicy = "ratelimit-policy"
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

// limitUnit expresses a key's limit as a count per unit for Envoy's
// current_limit: the unit whose window refills exactly the burst when
// there is one (an envoy ratelimit limit of 60 per minute is imported as
// 1/s with a burst of 60 and is reported 60 per MINUTE, as Envoy's
// x-ratelimit headers then say), else perUnit of the rate.
func limitUnit(l quota.Limit) (uint32, rlsv3.RateLimitResponse_RateLimit_Unit) {
	if l.Rate > 0 && l.Burst >= 1 && l.Burst <= math.MaxUint32 {
		b := float64(l.Burst)
		for _, u := range rateUnits {
			if n := l.Rate * u.seconds; math.Abs(n-b) <= wholeTolerance*b {
				return uint32(l.Burst), u.unit
			}
		}
	}
	return perUnit(l.Rate)
}

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
func ceilSeconds(d time.Duration) int64 { return quota.WholeUnits(d, time.Second) }

// decided is one matched descriptor after its decision.
type decided struct {
	limit  quota.Limit
	result result
	// cap is what this caller can currently expect at once: the region's
	// cap for the key (Decision.Cap), at most limit.Burst.
	cap       int64
	remaining uint32 // at most cap
	// reset is what duration_until_reset and the time headers name: on
	// OVER_LIMIT the retry delay (Envoy's rate limit filter turns a
	// status's duration_until_reset into x-ratelimit-reset, which must
	// then agree with retry-after and RateLimit's t: docs/operations.md,
	// "Rate-limit headers"), otherwise until Remaining is back to cap.
	reset time.Duration
	retry time.Duration // > 0 only when over limit
	// never: over limit, and no wait cures it (Decision.RetryNever); no
	// reset or retry time is promised then.
	never bool
	// cache keeps the answer parts shared by every answer about the same
	// limit of the class (optional).
	cache *classCounters
}

func newDecided(now time.Time, limit quota.Limit, r result, d quota.Decision) decided {
	out := decided{limit: limit, result: r, cap: max(limit.Burst, 0)}
	if d.CapKnown {
		out.cap = min(max(d.Cap, 0), out.cap)
	}
	out.remaining = uint32(min(max(d.Remaining, 0), out.cap, math.MaxUint32))
	out.reset = d.ResetIn(now)
	switch {
	case r == resultOverLimit && d.RetryNever:
		out.never, out.reset = true, 0
	case r == resultOverLimit:
		out.retry = max(d.RetryAfter, 0)
		// Whole seconds, at least one, as retry-after: Envoy's filter
		// writes duration_until_reset's seconds as x-ratelimit-reset, so a
		// fraction would be cut to an earlier second than retry-after.
		out.reset = time.Duration(max(ceilSeconds(out.retry), 1)) * time.Second
	case d.RetryNever && d.ResetAt.IsZero():
		// The shadow answer of a never denial decided without asking the
		// region (a cost above the burst): no reset time is known, so none
		// is promised, as for the denial itself. A reset of 0 beside a
		// remaining of 0 (RateLimit r=0;t=0) said nothing was left and the
		// cap was back already.
		out.never = true
	}
	return out
}

// shared is what every answer about one limit of one class carries
// alike: its current_limit and the x-ratelimit-limit and
// ratelimit-policy headers. Answers point to it and never change it.
type shared struct {
	className string
	limit     quota.Limit
	cap       int64
	rl        rlsv3.RateLimitResponse_RateLimit
	hLimit    corev3.HeaderValue
	hPolicy   corev3.HeaderValue
	// The same in wire form, each a whole field: current_limit of a
	// DescriptorStatus, and response_headers_to_add entries.
	rlWire, hLimitWire, hPolicyWire []byte
}

func newShared(className string, limit quota.Limit, capacity int64) *shared {
	sh := &shared{className: className, limit: limit, cap: capacity}
	n, unit := limitUnit(limit)
	sh.rl.Name, sh.rl.RequestsPerUnit, sh.rl.Unit = className, n, unit
	var scratch [96]byte
	buf := strconv.AppendInt(scratch[:0], capacity, 10)
	buf = append(buf, ", "...)
	policyAt := len(buf) // "BURST;w=WINDOW", repeated in the policy
	buf = strconv.AppendInt(buf, limit.Burst, 10)
	buf = append(buf, ";w="...)
	buf = strconv.AppendInt(buf, refillWindow(limit), 10)
	limitEnd := len(buf)
	buf = appendSFString(buf, className)
	buf = append(buf, ";q="...)
	buf = append(buf, buf[policyAt:limitEnd]...)
	all := string(buf)
	sh.hLimit.Key, sh.hLimit.Value = HeaderLimit, all[:limitEnd]
	sh.hPolicy.Key, sh.hPolicy.Value = HeaderRateLimitPolicy, all[limitEnd:]
	wire := appendRateLimitField(nil, &sh.rl)
	rlEnd := len(wire)
	wire = appendHeaderField(wire, sh.hLimit.Key, sh.hLimit.Value)
	limitWireEnd := len(wire)
	wire = appendHeaderField(wire, sh.hPolicy.Key, sh.hPolicy.Value)
	sh.rlWire, sh.hLimitWire, sh.hPolicyWire = wire[:rlEnd:rlEnd], wire[rlEnd:limitWireEnd:limitWireEnd], wire[limitWireEnd:]
	return sh
}

// sharedFor returns the shared parts of dd's answer, from dd.cache when
// they are the same limit's (built and kept there when not).
func sharedFor(dd decided, className string) *shared {
	if dd.cache == nil || dd.cache.class != className {
		return newShared(className, dd.limit, dd.cap)
	}
	sh := dd.cache.shared.Load()
	if sh == nil || sh.limit != dd.limit || sh.cap != dd.cap {
		sh = newShared(className, dd.limit, dd.cap)
		dd.cache.shared.Store(sh)
	}
	return sh
}

// statusBlock holds one descriptor's status and the messages it points
// to, so that they are allocated together.
type statusBlock struct {
	st  rlsv3.RateLimitResponse_DescriptorStatus
	dur durationpb.Duration
}

// fill writes dd's status into b and returns it.
func (b *statusBlock) fill(dd decided, sh *shared) *rlsv3.RateLimitResponse_DescriptorStatus {
	code := rlsv3.RateLimitResponse_OK
	if dd.result == resultOverLimit {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	b.st.Code, b.st.CurrentLimit, b.st.LimitRemaining = code, &sh.rl, dd.remaining
	if !dd.never {
		// As durationpb.New.
		nanos := dd.reset.Nanoseconds()
		secs := nanos / 1e9
		b.dur.Seconds, b.dur.Nanos = secs, int32(nanos-secs*1e9)
		b.st.DurationUntilReset = &b.dur
	}
	return &b.st
}

func (dd decided) status(className string) *rlsv3.RateLimitResponse_DescriptorStatus {
	return new(statusBlock).fill(dd, sharedFor(dd, className))
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

// maxHeaders is how many headers an answer carries at most.
const maxHeaders = 6

// headerBlock holds the headers of an answer its own: the rest are
// shared (x-ratelimit-limit, ratelimit-policy, and the time fields for
// the first few seconds).
type headerBlock struct {
	remaining, rateLimit corev3.HeaderValue
	ptrs                 [maxHeaders]*corev3.HeaderValue
}

// timeHeaders are x-ratelimit-reset and retry-after for t = 0, 1, …, and
// timeHeadersWire the same as response_headers_to_add fields.
var (
	timeHeaders     [121][2]corev3.HeaderValue
	timeHeadersWire [121][2][]byte
)

func init() {
	for t := range timeHeaders {
		v := strconv.Itoa(t)
		timeHeaders[t][0].Key, timeHeaders[t][0].Value = HeaderReset, v
		timeHeaders[t][1].Key, timeHeaders[t][1].Value = HeaderRetryAfter, v
		timeHeadersWire[t][0] = appendHeaderField(nil, HeaderReset, v)
		timeHeadersWire[t][1] = appendHeaderField(nil, HeaderRetryAfter, v)
	}
}

// headers builds the response fields for the descriptor shown. Every
// time field is one number of whole seconds, t: on OVER_LIMIT the longest
// retry delay of the over-limit descriptors (at least 1), otherwise until
// the shown descriptor's Remaining is back to its cap; x-ratelimit-reset,
// RateLimit's t and retry-after all carry it. When some over-limit
// descriptor is a never denial no time is promised: none of the three is
// written.
func headers(shown decided, className string, overLimit, never bool, retry time.Duration) []*corev3.HeaderValue {
	return new(headerBlock).build(shown, sharedFor(shown, className), overLimit, never, retry)
}

// build writes the headers (see headers) into hb and returns them. The
// values of its own are substrings of one string built without fmt.
func (hb *headerBlock) build(shown decided, sh *shared, overLimit, never bool, retry time.Duration) []*corev3.HeaderValue {
	t, timed := headerTime(shown, overLimit, never, retry)
	var scratch [96]byte
	buf, remainingEnd := appendOwnValues(scratch[:0], shown, sh, t, timed)
	all := string(buf)
	hb.remaining.Key, hb.remaining.Value = HeaderRemaining, all[:remainingEnd]
	hb.rateLimit.Key, hb.rateLimit.Value = HeaderRateLimit, all[remainingEnd:]
	hb.ptrs[0], hb.ptrs[1], hb.ptrs[2], hb.ptrs[3] = &sh.hLimit, &hb.remaining, &sh.hPolicy, &hb.rateLimit
	if !timed {
		return hb.ptrs[:4:4]
	}
	var reset, retryAfter *corev3.HeaderValue
	if t < int64(len(timeHeaders)) {
		reset, retryAfter = &timeHeaders[t][0], &timeHeaders[t][1]
	} else {
		ts := all[strings.LastIndexByte(all, '=')+1:] // RateLimit's t
		reset = &corev3.HeaderValue{Key: HeaderReset, Value: ts}
		if overLimit {
			retryAfter = &corev3.HeaderValue{Key: HeaderRetryAfter, Value: ts}
		}
	}
	hb.ptrs[4] = reset
	if !overLimit {
		return hb.ptrs[:5:5]
	}
	hb.ptrs[5] = retryAfter
	return hb.ptrs[:6:6]
}

// headerTime is the time fields' value t and whether they are written
// (see headers).
func headerTime(shown decided, overLimit, never bool, retry time.Duration) (t int64, timed bool) {
	switch {
	case overLimit && never, !overLimit && shown.never:
		return 0, false
	case overLimit:
		return max(ceilSeconds(retry), 1), true
	}
	return ceilSeconds(shown.reset), true
}

// appendOwnValues appends the values of an answer's own headers to b:
// x-ratelimit-remaining, then RateLimit (whose last digits are t when
// timed); remainingEnd is where the first ends.
func appendOwnValues(b []byte, shown decided, sh *shared, t int64, timed bool) (_ []byte, remainingEnd int) {
	start := len(b)
	b = strconv.AppendUint(b, uint64(shown.remaining), 10)
	remainingEnd = len(b)
	b = appendSFString(b, sh.className)
	b = append(b, ";r="...)
	b = append(b, b[start:remainingEnd]...)
	if timed {
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, t, 10)
	}
	return b, remainingEnd
}

// sfString serialises s as a structured-field String (RFC 8941 §4.1.6),
// replacing what a String cannot hold (class names are letters, digits and
// . _ : @ -, so nothing is replaced for a configured class).
func sfString(s string) string {
	return string(appendSFString(make([]byte, 0, len(s)+2), s))
}

func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
