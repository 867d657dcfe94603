package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// Limiter decides whether cost tokens may be spent on key now. Over quota is
// a Decision with Allowed == false, never an error; errors mean no decision
// could be made (bad input wrapping quota.ErrInvalid, or an infrastructure
// failure). The instance client in pkg/lease satisfies it. Implementations
// must be safe for concurrent use: the middleware calls Allow from every
// request goroutine.
type Limiter interface {
	Allow(ctx context.Context, key quota.Key, cost int64) (quota.Decision, error)
}

// KeyFunc maps a request to the quota key it is charged to. An error means
// the request itself is unacceptable (missing tenant, say); its text is
// shown to the client, so it should name what is missing.
type KeyFunc func(*http.Request) (quota.Key, error)

// CostFunc returns how many tokens a request consumes, 1..quota.MaxCost.
type CostFunc func(*http.Request) int64

// ErrorFunc writes the response for a request that got no decision.
type ErrorFunc func(w http.ResponseWriter, r *http.Request, err error)

// Options configures Middleware. Only Key is required.
type Options struct {
	// Key maps a request to its quota key. Required.
	Key KeyFunc

	// Cost returns the request's cost in tokens. Optional; default: every
	// request costs 1 token. Values outside 1..quota.MaxCost are answered
	// with 400 without calling the limiter.
	Cost CostFunc

	// Policy is the policy name in the IETF RateLimit and RateLimit-Policy
	// fields: printable ASCII (0x20..0x7E), at most MaxPolicyLen bytes.
	// Optional; default: the request's class.
	Policy string

	// Window returns the policy window for a key, reported as w in
	// RateLimit-Policy, rounded up to whole seconds. Optional; default: no
	// w parameter. RefillWindow computes it from a quota.Limit. A result
	// <= 0 also omits w.
	Window func(quota.Key) time.Duration

	// OnError writes the response when the key, the cost or the limiter
	// failed. Optional; default: DefaultOnError.
	OnError ErrorFunc

	// Now is the clock for the relative field t. Optional; default:
	// time.Now. It should be the clock the limiter computes ResetAt with.
	Now func() time.Time
}

// MaxPolicyLen is the longest Options.Policy accepted, in bytes.
const MaxPolicyLen = 64

// ErrNoKey is wrapped by every error about the request's key: the key
// function failed or returned an invalid key. DefaultOnError answers 400.
var ErrNoKey = errors.New("no rate-limit key for request")

// Validate reports whether o can build a middleware, naming the bad field.
func (o Options) Validate() error {
	if o.Key == nil {
		return fmt.Errorf("%w: httplimit Options.Key is nil; it is required", quota.ErrInvalid)
	}
	if o.Policy != "" {
		if err := validatePolicyName(o.Policy); err != nil {
			return err
		}
	}
	return nil
}

func validatePolicyName(name string) error {
	if len(name) > MaxPolicyLen {
		return fmt.Errorf("%w: httplimit Options.Policy is %d bytes long, the limit is %d",
			quota.ErrInvalid, len(name), MaxPolicyLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: httplimit Options.Policy %q has byte %#x at offset %d; only printable ASCII fits a structured-field string",
				quota.ErrInvalid, name, c, i)
		}
	}
	return nil
}

// New returns the rate-limiting middleware, or an error naming the first
// invalid argument.
func New(l Limiter, opts Options) (func(http.Handler) http.Handler, error) {
	if l == nil {
		return nil, fmt.Errorf("%w: httplimit limiter is nil", quota.ErrInvalid)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	m := &middleware{limiter: l, opts: opts}
	if m.opts.OnError == nil {
		m.opts.OnError = DefaultOnError
	}
	if m.opts.Now == nil {
		m.opts.Now = time.Now
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(w, r, next)
		})
	}, nil
}

// Middleware is New for wiring code: it panics on invalid arguments, which
// are programming errors found at start-up, not per request.
func Middleware(l Limiter, opts Options) func(http.Handler) http.Handler {
	mw, err := New(l, opts)
	if err != nil {
		panic(err)
	}
	return mw
}

// middleware holds only values fixed at construction, so one instance serves
// all request goroutines without locking.
type middleware struct {
	limiter Limiter
	opts    Options
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := m.opts.Key(r)
	if err == nil {
		err = key.Validate()
	}
	if err != nil {
		m.opts.OnError(w, r, fmt.Errorf("%w: %w", ErrNoKey, err))
		return
	}

	cost := int64(1)
	if m.opts.Cost != nil {
		cost = m.opts.Cost(r)
	}
	if err := quota.ValidateCost(cost); err != nil {
		m.opts.OnError(w, r, fmt.Errorf("request cost for %s: %w", key, err))
		return
	}

	d, err := m.limiter.Allow(r.Context(), key, cost)
	if err != nil {
		m.opts.OnError(w, r, fmt.Errorf("rate limiter for %s: %w", key, err))
		return
	}

	fields := computeFields(d, m.opts.Now())
	policy := m.opts.Policy
	if policy == "" {
		policy = key.Class
	}
	var window int64
	if m.opts.Window != nil {
		window = ceilSeconds(m.opts.Window(key))
	}
	fields.write(w.Header(), policy, window)

	if !d.Allowed {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusTooManyRequests)
		if fields.never {
			fmt.Fprintf(w, "rate limit exceeded for class %s; a request of cost %d cannot be admitted while the limits stay as they are, so no retry time is given\n", key.Class, cost)
			return
		}
		fmt.Fprintf(w, "rate limit exceeded for class %s; retry after %d s\n", key.Class, fields.retryAfter)
		return
	}
	next.ServeHTTP(w, r)
}

// ErrorStatus maps an error handed to OnError to the status DefaultOnError
// uses: 400 when the request is at fault (ErrNoKey, or quota.ErrInvalid from
// the cost check or the limiter), 503 when the limiter could not decide.
func ErrorStatus(err error) int {
	if errors.Is(err, ErrNoKey) || errors.Is(err, quota.ErrInvalid) {
		return http.StatusBadRequest
	}
	return http.StatusServiceUnavailable
}

// DefaultOnError answers with ErrorStatus(err). A 400 body carries the error
// text so the client can fix its request; a 503 body does not, because
// limiter failures describe internal infrastructure.
func DefaultOnError(w http.ResponseWriter, r *http.Request, err error) {
	status := ErrorStatus(err)
	msg := "rate limiter unavailable"
	if status == http.StatusBadRequest {
		msg = err.Error()
	}
	http.Error(w, msg, status)
}

// fields are one decision's numbers, already rounded for the wire.
type fields struct {
	policy     int64 // q: the key's configured burst
	limit      int64 // what this caller can currently expect at once (Cap)
	remaining  int64 // at most limit
	date       int64 // now as Unix seconds, rounded down: the Date field
	reset      int64 // t: seconds from date; X-RateLimit-Reset is date + t
	denied     bool
	retryAfter int64 // == reset; only when denied and not never
	never      bool  // denied, and no wait will do (Decision.RetryNever)
}

// computeFields turns a decision into the fields' numbers. Every time
// field names one instant, a whole second of the Date clock at or after
// the moment it stands for: t is counted from Date's second,
// X-RateLimit-Reset is Date + t, and on a 429 Retry-After equals t. So a
// client that waits t from receiving the response, or until
// X-RateLimit-Reset by a synchronised clock, never arrives early.
func computeFields(d quota.Decision, now time.Time) fields {
	limit := max(d.Limit, 0)
	if d.CapKnown {
		limit = max(d.Cap, 0)
		if d.Limit > 0 {
			limit = min(limit, d.Limit)
		}
	}
	f := fields{
		policy:    max(d.Limit, limit),
		limit:     limit,
		remaining: min(max(d.Remaining, 0), limit),
		date:      now.Unix(),
		denied:    !d.Allowed,
	}
	switch {
	case f.denied && d.RetryNever:
		// No wait cures this denial: promise no time to retry at.
		f.never = true
	case f.denied:
		f.reset = max(ceilUnix(now.Add(max(d.RetryAfter, 0)))-f.date, 1)
		f.retryAfter = f.reset
	default:
		if in := d.ResetIn(now); in > 0 {
			f.reset = ceilUnix(now.Add(in)) - f.date
		}
	}
	return f
}

func (f fields) write(h http.Header, policy string, window int64) {
	h.Set("Date", time.Unix(f.date, 0).UTC().Format(http.TimeFormat))
	h.Set("X-RateLimit-Limit", strconv.FormatInt(f.limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(f.remaining, 10))
	if !f.never {
		h.Set("X-RateLimit-Reset", strconv.FormatInt(f.date+f.reset, 10))
	}

	name := sfString(policy)
	p := name + ";q=" + strconv.FormatInt(f.policy, 10)
	if window > 0 {
		p += ";w=" + strconv.FormatInt(window, 10)
	}
	h.Set("RateLimit-Policy", p)
	rl := name + ";r=" + strconv.FormatInt(f.remaining, 10)
	if !f.never {
		rl += ";t=" + strconv.FormatInt(f.reset, 10)
	}
	h.Set("RateLimit", rl)

	if f.denied && !f.never {
		h.Set("Retry-After", strconv.FormatInt(f.retryAfter, 10))
	}
}

// sfString serialises s as a structured-field String (RFC 8941 §4.1.6). s has
// been checked to be printable ASCII, so only '"' and '\' need escaping.
func sfString(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(append(b, '"'))
}

// ceilSeconds rounds d up to whole seconds; zero or negative gives 0.
func ceilSeconds(d time.Duration) int64 { return quota.WholeUnits(d, time.Second) }

// ceilUnix is t as Unix seconds, rounded up to the next whole second.
func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() != 0 {
		s++
	}
	return s
}
