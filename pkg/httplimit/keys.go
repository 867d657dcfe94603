package httplimit

import (
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// ClassFunc picks the route class of a request. It must return a configured
// class name, never something derived from the raw path or query: those are
// unbounded, and every new value would be a new, full bucket.
type ClassFunc func(*http.Request) string

// HeaderKey charges every request to the tenant named in tenantHeader and to
// the fixed class. It panics if tenantHeader is empty or class is not a valid
// class name, both wiring mistakes.
func HeaderKey(tenantHeader, class string) KeyFunc {
	if err := (quota.Key{Tenant: "t", Class: class}).Validate(); err != nil {
		panic(fmt.Errorf("httplimit.HeaderKey: %w", err))
	}
	return HeaderKeyClass(tenantHeader, func(*http.Request) string { return class })
}

// HeaderKeyClass charges the request to the tenant named in tenantHeader and
// to the class chosen by class. The header must appear exactly once: with two
// values, a proxy that checked the first and a limiter that used the second
// would disagree about who pays. It panics if tenantHeader is empty or class
// is nil.
func HeaderKeyClass(tenantHeader string, class ClassFunc) KeyFunc {
	if tenantHeader == "" {
		panic(fmt.Errorf("%w: httplimit.HeaderKeyClass: tenant header name is empty", quota.ErrInvalid))
	}
	if class == nil {
		panic(fmt.Errorf("%w: httplimit.HeaderKeyClass: class function is nil", quota.ErrInvalid))
	}
	name := http.CanonicalHeaderKey(tenantHeader)
	return func(r *http.Request) (quota.Key, error) {
		values := r.Header.Values(name)
		switch {
		case len(values) == 0:
			return quota.Key{}, fmt.Errorf("header %s is missing", name)
		case len(values) > 1:
			return quota.Key{}, fmt.Errorf("header %s appears %d times; send it once", name, len(values))
		}
		key := quota.Key{Tenant: values[0], Class: class(r)}
		if err := key.Validate(); err != nil {
			return quota.Key{}, fmt.Errorf("header %s: %w", name, err)
		}
		return key, nil
	}
}

// ClassByMethod sends the safe methods (GET, HEAD, OPTIONS, TRACE; RFC 9110
// §9.2.1) to readClass and every other method to writeClass. It panics if
// either is not a valid class name.
func ClassByMethod(readClass, writeClass string) ClassFunc {
	for _, c := range []string{readClass, writeClass} {
		if err := (quota.Key{Tenant: "t", Class: c}).Validate(); err != nil {
			panic(fmt.Errorf("httplimit.ClassByMethod: %w", err))
		}
	}
	return func(r *http.Request) string {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
			return readClass
		}
		return writeClass
	}
}

// RefillWindow is the time a token bucket with limit l takes to refill from
// empty to its burst, rounded up to the nanosecond: the natural policy
// window w for a bucket that admits Burst tokens at once and Rate per second
// after. It is 0 (no window) for a limit with no positive rate or burst, and
// saturates at the longest time.Duration.
func RefillWindow(l quota.Limit) time.Duration {
	if !(l.Rate > 0) || l.Burst <= 0 {
		return 0
	}
	ns := math.Ceil(float64(l.Burst) * float64(time.Second) / l.Rate)
	if ns >= math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ns)
}
