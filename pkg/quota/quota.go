package quota

import (
	"errors"
	"fmt"
	"math"
	"time"
	"unicode/utf8"
)

// ErrInvalid is wrapped by every validation error, so edges can map it to
// an "invalid argument" status with errors.Is.
var ErrInvalid = errors.New("invalid argument")

const (
	// MaxTenantLen is the longest tenant id accepted, in bytes.
	MaxTenantLen = 128
	// MaxClassLen is the longest class name accepted, in bytes.
	MaxClassLen = 64
	// MaxCost is the largest cost one request may carry. Anything above is
	// certainly a bug in the caller's cost function, not a real request.
	MaxCost = 1 << 20
	// MaxWant is the largest batch an instance may ask for in one lease.
	MaxWant = 1 << 30
	// MinRefresh is the shortest refresh (the period of an instance's
	// Sync): below it an instance would spend its time, and its region's,
	// on Sync round trips, each bounded by half a refresh by default.
	MinRefresh = 10 * time.Millisecond
	// MaxBurst is the largest burst of a key (tokens). The regional scripts
	// keep a bucket's tokens in whole micro-tokens in a float64, exact up
	// to 2^30 tokens, so every sum of them rounds back to the right one.
	MaxBurst = 1_000_000_000
	// MaxRate is the largest rate of a key (tokens/s): a second of refill
	// is at most 10^15 micro-tokens, below 2^53.
	MaxRate = 1_000_000_000
)

// Key identifies one limited quantity: a tenant's traffic of one route
// class. The zero value is invalid.
type Key struct {
	Tenant string
	Class  string
}

// String renders the key as "tenant/class" for logs and errors.
func (k Key) String() string { return k.Tenant + "/" + k.Class }

// Validate reports whether k is syntactically acceptable. It does not know
// which classes are configured; callers check that against their config.
func (k Key) Validate() error {
	if err := validateName("tenant", k.Tenant, MaxTenantLen); err != nil {
		return err
	}
	return validateName("class", k.Class, MaxClassLen)
}

// ValidateID checks an instance or region id with the same rules as a tenant.
func ValidateID(field, id string) error { return validateName(field, id, MaxTenantLen) }

func validateName(field, s string, max int) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalid, field)
	}
	if len(s) > max {
		return fmt.Errorf("%w: %s is %d bytes long, the limit is %d", ErrInvalid, field, len(s), max)
	}
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return fmt.Errorf("%w: %s %q has byte %s; allowed are letters, digits and . _ : @ -",
				ErrInvalid, field, truncate(s, 40), ByteAt(s, i))
		}
	}
	return nil
}

// ByteAt names the byte s[i] and its place for an error message: an
// ASCII byte quoted (' ' at offset 2, '\n' at offset 2), any other in hex,
// with the character it starts when it starts one (0xc3 at offset 2 (the
// first byte of 'é')): a byte above 0x7f is never shown as the Latin-1
// character of its number.
func ByteAt(s string, i int) string {
	c := s[i]
	if c < utf8.RuneSelf {
		return fmt.Sprintf("%q at offset %d", c, i)
	}
	if r, n := utf8.DecodeRuneInString(s[i:]); n > 1 {
		return fmt.Sprintf("%#x at offset %d (the first byte of %q)", c, i, r)
	}
	return fmt.Sprintf("%#x at offset %d", c, i)
}

func nameByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	case c == '.', c == '_', c == ':', c == '@', c == '-':
		return true
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// ValidateCost checks a per-request cost: 1..MaxCost tokens.
func ValidateCost(cost int64) error {
	if cost < 1 {
		return fmt.Errorf("%w: cost %d must be at least 1", ErrInvalid, cost)
	}
	if cost > MaxCost {
		return fmt.Errorf("%w: cost %d exceeds the maximum %d", ErrInvalid, cost, MaxCost)
	}
	return nil
}

// ValidateWant checks a lease batch request: 0..MaxWant tokens.
func ValidateWant(want int64) error {
	if want < 0 {
		return fmt.Errorf("%w: want %d is negative", ErrInvalid, want)
	}
	if want > MaxWant {
		return fmt.Errorf("%w: want %d exceeds the maximum %d", ErrInvalid, want, MaxWant)
	}
	return nil
}

// WholeUnits is d rounded up to whole units (the seconds or milliseconds
// of a Retry-After, a reset or a JSON wait), 0 for d <= 0. It never
// overflows: the largest Duration rounds up to one unit more than it holds
// whole, not to a wait of nothing.
func WholeUnits(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	n := int64(d / unit)
	if d%unit != 0 {
		n++
	}
	return n
}

// Limit is the rate and burst of one key.
type Limit struct {
	// Rate in tokens per second; > 0.
	Rate float64
	// Burst in tokens; >= 1.
	Burst int64
}

// maxResetSeconds keeps ResetIn's arithmetic inside a Duration.
const maxResetSeconds = float64(1<<63-1) / float64(time.Second) / 2

// ResetIn is how long after now this caller's Remaining is back to Cap if
// nobody spends: the later of ResetAt and the time the tokens missing
// from Cap take at Refill. 0 when Remaining is at Cap and the region's
// bucket is full, or when neither is known. An admitted request that
// spent the last tokens an instance held says so: the region's bucket
// may be full (the tokens were out in the lease), but the caller's
// Remaining is 0 until they are refilled.
func (d Decision) ResetIn(now time.Time) time.Duration {
	var in time.Duration
	if !d.ResetAt.IsZero() {
		in = max(d.ResetAt.Sub(now), 0)
	}
	if d.CapKnown && d.Refill > 0 && d.Remaining < d.Cap {
		if s := float64(d.Cap-max(d.Remaining, 0)) / d.Refill; s < maxResetSeconds {
			// Rounded up to the microsecond, less a billionth for float
			// error (3 tokens at 1/m is 180 s, not 180 s and a
			// microsecond; a rate on the wire may carry 13 digits): far
			// below the whole seconds and milliseconds readers round to.
			us := math.Ceil(s * float64(time.Second/time.Microsecond) * (1 - 1e-9))
			in = max(in, time.Duration(us)*time.Microsecond)
		}
	}
	return in
}

// Decision is the outcome of one Allow or Check. The zero value denies.
type Decision struct {
	// Allowed says whether the request may proceed. In shadow mode it is
	// always true and WouldDeny carries the real verdict.
	Allowed bool
	// WouldDeny is set when the limiter would have denied the request; it is
	// the real verdict in shadow mode and equals !Allowed otherwise.
	WouldDeny bool
	// Limit is the key's configured burst: the policy, the same in every
	// region and on every decision (RateLimit-Policy's q).
	Limit int64
	// Cap is the most tokens this caller can currently expect to spend at
	// once: the key's burst cap in the caller's region now (its static
	// share plus what the global tier grants it, in whole tokens), or this
	// instance's local bucket while degraded; at most Limit
	// (X-RateLimit-Limit). Read it only when CapKnown.
	Cap int64
	// CapKnown says Cap is set; a limiter that does not know it leaves
	// both zero, and readers show Limit instead.
	CapKnown bool
	// Remaining is the tokens this caller can expect to spend now, without
	// waiting, after this decision: never negative, at most Cap (when
	// known), and below the cost on a denial. A leased decision counts the
	// instance's tokens plus what the region's bucket held at its last
	// answer, so concurrent spending elsewhere in the region since then
	// can make it an overestimate by up to one refresh of that spending.
	// An admission of the on_failure policy open limits nothing: its
	// Remaining is math.MaxInt64, shown as the whole limit (or Cap).
	Remaining int64
	// ResetAt is when the region's bucket is full again (as of the
	// region's last answer) if nobody spends; zero when unknown. Tokens
	// an instance holds are not in that bucket: once spent, they come
	// back only at Refill. Readers giving a reset time use ResetIn.
	ResetAt time.Time
	// Refill is the rate (tokens/s) at which the tokens missing from Cap
	// come back when nobody spends: the region's current rate for the
	// key, or the local bucket's while degraded; 0 when unknown.
	Refill float64
	// RetryAfter is how long to wait before retrying a denied request; zero
	// when allowed, and when RetryNever is set.
	RetryAfter time.Duration
	// RetryNever is set on a denial no wait can cure while the config
	// stays as it is: the cost exceeds the key's configured burst (the
	// whole limit), or the region runs with no global tier (unleased) and
	// the cost exceeds its cap, which is its static share for good. No
	// Retry-After is promised then. A cost within the configured burst
	// that a region with a global tier cannot hold now, because tokens are
	// out in other instances' leases, its cap is below the cost or its
	// rate is zero (its floor, partition_share 0, while its static lease
	// lapsed or it is drained), is a denial with a RetryAfter: those tokens
	// come back (released, expired), the global tier grants the region
	// more of the burst, and gives it its rate back when it hears from it
	// again or it is restored.
	RetryNever bool
	// Degraded is set when the decision came from the class's on_failure
	// policy because the regional service could not be reached.
	Degraded bool
}

// DemandMoved reports whether got tokens of demand counted over a window
// are a plain change from expect, the tokens the last rate read would
// bring over it: the two differ by more than the smaller (a factor of two)
// and by more than three standard deviations of a Poisson count at the
// larger. A steady demand's count passes it about once in ten thousand
// windows; a demand that doubled or halved passes it once the window
// holds a few tens of its tokens. The regional scripts close a lease's
// demand window early on such a change (lib.lua demand_moved), and a lease
// client reports such a fall early (lease.Table.PrepareFalls).
func DemandMoved(got, expect float64) bool {
	hi, lo := got, expect
	if lo > hi {
		hi, lo = expect, got
	}
	return hi-lo > max(lo, 3*math.Sqrt(hi))
}
