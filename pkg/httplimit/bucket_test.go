package httplimit_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/pkg/quota"
)

// testClock is a settable clock shared by the limiter and the middleware, so
// a test decides what "now" is and the buckets refill only when it says.
type testClock struct {
	mu  sync.Mutex
	now time.Time // guarded by mu
}

func newTestClock(t time.Time) *testClock { return &testClock{now: t} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// tokenBuckets is a real per-key token bucket limiter over
// golang.org/x/time/rate, driven by an explicit clock. It reports the raw
// bucket balance (which can be negative after an overdraw) so the tests see
// what the middleware does with it. Safe for concurrent use.
type tokenBuckets struct {
	clock  *testClock
	limits map[string]quota.Limit // by class; read-only after construction
	shadow bool                   // report would-be denials as allowed
	// caps holds, by class, a bucket capacity below the class's burst (a
	// region's share of a small burst); a cost above it can never be
	// admitted and is answered RetryNever.
	caps map[string]int

	mu      sync.Mutex
	buckets map[quota.Key]*rate.Limiter // guarded by mu
	costs   []int64                     // guarded by mu; the cost of every Allow call, valid or not
}

func newTokenBuckets(clock *testClock, limits map[string]quota.Limit) *tokenBuckets {
	return &tokenBuckets{clock: clock, limits: limits, buckets: make(map[quota.Key]*rate.Limiter)}
}

func (b *tokenBuckets) bucket(key quota.Key) (*rate.Limiter, quota.Limit, error) {
	lim, ok := b.limits[key.Class]
	if !ok {
		return nil, quota.Limit{}, fmt.Errorf("%w: class %q is not configured", quota.ErrInvalid, key.Class)
	}
	bk, ok := b.buckets[key]
	if !ok {
		burst := int(lim.Burst)
		if c, ok := b.caps[key.Class]; ok {
			burst = c
		}
		bk = rate.NewLimiter(rate.Limit(lim.Rate), burst)
		b.buckets[key] = bk
	}
	return bk, lim, nil
}

func (b *tokenBuckets) Allow(_ context.Context, key quota.Key, cost int64) (quota.Decision, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.costs = append(b.costs, cost)
	if err := key.Validate(); err != nil {
		return quota.Decision{}, err
	}
	if err := quota.ValidateCost(cost); err != nil {
		return quota.Decision{}, err
	}
	bk, lim, err := b.bucket(key)
	if err != nil {
		return quota.Decision{}, err
	}
	now := b.clock.Now()
	allowed := bk.AllowN(now, int(cost))
	tokens := bk.TokensAt(now)
	d := quota.Decision{
		Allowed:   allowed,
		WouldDeny: !allowed,
		Limit:     lim.Burst,
		Cap:       int64(bk.Burst()), // below Limit when caps holds a region's share
		CapKnown:  true,
		Remaining: int64(math.Floor(tokens)),
		ResetAt:   now.Add(secondsUp((float64(bk.Burst()) - tokens) / lim.Rate)),
	}
	switch {
	case !allowed && cost > int64(bk.Burst()):
		d.RetryNever = true
		d.Allowed = b.shadow
	case !allowed:
		d.RetryAfter = secondsUp((float64(cost) - tokens) / lim.Rate)
		d.Allowed = b.shadow
	}
	return d, nil
}

// spend takes n tokens from key's bucket at the current time, as a request
// that bypassed the middleware would.
func (b *tokenBuckets) spend(key quota.Key, n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	bk, _, err := b.bucket(key)
	if err != nil {
		panic(err)
	}
	return bk.AllowN(b.clock.Now(), n)
}

// overdraw reserves n tokens ahead, as a queued background job would, which
// leaves the bucket in debt.
func (b *tokenBuckets) overdraw(key quota.Key, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	bk, _, err := b.bucket(key)
	if err != nil {
		panic(err)
	}
	if r := bk.ReserveN(b.clock.Now(), n); !r.OK() {
		panic(fmt.Sprintf("reserve %d on %s refused", n, key))
	}
}

func (b *tokenBuckets) recordedCosts() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int64(nil), b.costs...)
}

// secondsUp converts seconds to a Duration, rounding up so a wait is never
// reported shorter than the bucket needs.
func secondsUp(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(s * float64(time.Second)))
}

// failingLimiter injects the one fault a real limiter cannot produce on
// demand here: a backend that cannot decide at all.
type failingLimiter struct{ err error }

func (f failingLimiter) Allow(context.Context, quota.Key, int64) (quota.Decision, error) {
	return quota.Decision{}, f.err
}
