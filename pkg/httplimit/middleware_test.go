package httplimit_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/httplimit"
	"github.com/sluicehq/sluice/pkg/quota"
)

// start is deliberately a quarter past a whole second, so that rounding the
// reset instant down instead of up shows in X-RateLimit-Reset, and every
// time field is counted from Date's second (start rounded down): t and
// Retry-After equal X-RateLimit-Reset - Date.
var start = time.Unix(1_700_000_000, 250_000_000)

const tenantHeader = "X-Tenant-ID"

var testLimits = map[string]quota.Limit{
	"read":  {Rate: 1, Burst: 5},
	"write": {Rate: 10, Burst: 2},
}

type fixture struct {
	clock   *testClock
	buckets *tokenBuckets
	served  atomic.Int64 // requests that reached the next handler
	handler http.Handler
}

func newFixture(t *testing.T, limits map[string]quota.Limit, edit func(*httplimit.Options)) *fixture {
	t.Helper()
	f := &fixture{clock: newTestClock(start)}
	f.buckets = newTokenBuckets(f.clock, limits)
	opts := httplimit.Options{
		Key: httplimit.HeaderKeyClass(tenantHeader, httplimit.ClassByMethod("read", "write")),
		Window: func(k quota.Key) time.Duration {
			return httplimit.RefillWindow(limits[k.Class])
		},
		Now: f.clock.Now,
	}
	if edit != nil {
		edit(&opts)
	}
	mw, err := httplimit.New(f.buckets, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.handler = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.served.Add(1)
		io.WriteString(w, "ok")
	}))
	return f
}

func (f *fixture) do(method, tenant string, extra http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "/v1/things?x=1", nil)
	if tenant != "" {
		req.Header.Set(tenantHeader, tenant)
	}
	for k, vs := range extra {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	rec := httptest.NewRecorder()
	f.handler.ServeHTTP(rec, req)
	return rec
}

// want lists the exact field values a response must carry; an empty value
// means the field must be absent.
type want struct {
	status                  int
	limit, remaining, reset string
	policy, rateLimit       string
	retryAfter              string
}

func check(t *testing.T, rec *httptest.ResponseRecorder, w want) {
	t.Helper()
	if rec.Code != w.status {
		t.Errorf("status %d, want %d (body %q)", rec.Code, w.status, rec.Body.String())
	}
	for _, c := range []struct{ name, want string }{
		{"X-RateLimit-Limit", w.limit},
		{"X-RateLimit-Remaining", w.remaining},
		{"X-RateLimit-Reset", w.reset},
		{"RateLimit-Policy", w.policy},
		{"RateLimit", w.rateLimit},
		{"Retry-After", w.retryAfter},
	} {
		got := rec.Header().Values(c.name)
		switch {
		case c.want == "" && len(got) != 0:
			t.Errorf("%s = %q, want absent", c.name, got)
		case c.want != "" && (len(got) != 1 || got[0] != c.want):
			t.Errorf("%s = %q, want %q", c.name, got, c.want)
		}
	}
}

func epoch(s int64) string { return strconv.FormatInt(1_700_000_000+s, 10) }

func TestAllowedAndDeniedResponsesCarryExactFields(t *testing.T) {
	f := newFixture(t, testLimits, nil)

	// Burst 5 at 1 token/s: after k requests the bucket is k tokens short,
	// full again k seconds after start, i.e. at 1_700_000_000 + k + 0.25,
	// announced as the next whole second, k + 1 after Date.
	for k := int64(1); k <= 5; k++ {
		rec := f.do(http.MethodGet, "acme", nil)
		check(t, rec, want{
			status:    http.StatusOK,
			limit:     "5",
			remaining: strconv.FormatInt(5-k, 10),
			reset:     epoch(k + 1),
			policy:    `"read";q=5;w=5`,
			rateLimit: fmt.Sprintf(`"read";r=%d;t=%d`, 5-k, k+1),
		})
	}
	if got := f.served.Load(); got != 5 {
		t.Fatalf("handler served %d requests, want 5", got)
	}

	// The sixth finds an empty bucket: one token arrives in 1 s, at
	// start + 1.25 s: the second 2 after Date, which all three name.
	rec := f.do(http.MethodGet, "acme", nil)
	check(t, rec, want{
		status:     http.StatusTooManyRequests,
		limit:      "5",
		remaining:  "0",
		reset:      epoch(2),
		policy:     `"read";q=5;w=5`,
		rateLimit:  `"read";r=0;t=2`,
		retryAfter: "2",
	})
	if got := f.served.Load(); got != 5 {
		t.Errorf("denied request reached the handler (served %d)", got)
	}
	if body := rec.Body.String(); !strings.Contains(body, "retry after 2 s") || !strings.Contains(body, "read") {
		t.Errorf("429 body %q does not say what was exceeded and when to retry", body)
	}

	// Another tenant has its own bucket.
	check(t, f.do(http.MethodGet, "globex", nil), want{
		status: http.StatusOK, limit: "5", remaining: "4", reset: epoch(2),
		policy: `"read";q=5;w=5`, rateLimit: `"read";r=4;t=2`,
	})
}

func TestRetryAfterIsWholeSecondsFromDateRoundedUpAndAtLeastOne(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rate       float64
		retryAfter string // one token at this rate from start (Date + 0.25 s), seconds from Date rounded up
	}{
		{"100ms wait", 10, "1"},
		{"exactly 1s", 1, "2"},
		{"exactly 2s", 0.5, "3"},
		{"2.5s wait", 0.4, "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limits := map[string]quota.Limit{"read": {Rate: tc.rate, Burst: 1}}
			f := newFixture(t, limits, nil)
			if rec := f.do(http.MethodGet, "acme", nil); rec.Code != http.StatusOK {
				t.Fatalf("first request: status %d", rec.Code)
			}
			rec := f.do(http.MethodGet, "acme", nil)
			if rec.Code != http.StatusTooManyRequests {
				t.Fatalf("second request: status %d, want 429", rec.Code)
			}
			if got := rec.Header().Get("Retry-After"); got != tc.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.retryAfter)
			}
			// The draft asks that Retry-After not point earlier than
			// the end of the window t describes: they are equal.
			if got, want := rec.Header().Get("RateLimit"), `"read";r=0;t=`+tc.retryAfter; got != want {
				t.Errorf("RateLimit %q, want %q", got, want)
			}

			// Waiting exactly Retry-After seconds must be enough.
			secs, _ := strconv.Atoi(tc.retryAfter)
			f.clock.Advance(time.Duration(secs) * time.Second)
			if rec := f.do(http.MethodGet, "acme", nil); rec.Code != http.StatusOK {
				t.Errorf("after waiting Retry-After: status %d, want 200", rec.Code)
			}
		})
	}
}

func TestSubSecondResetIsAnnouncedAtTheNextWholeSecond(t *testing.T) {
	f := newFixture(t, testLimits, nil)
	// write: burst 2 at 10/s. One POST leaves the bucket 100 ms from full:
	// start+0.35 s, announced as start's second + 1, and t = 1 from Date.
	check(t, f.do(http.MethodPost, "acme", nil), want{
		status: http.StatusOK, limit: "2", remaining: "1", reset: epoch(1),
		policy: `"write";q=2;w=1`, rateLimit: `"write";r=1;t=1`,
	})
}

func TestResetOnAWholeSecondIsNotRoundedFurther(t *testing.T) {
	f := newFixture(t, testLimits, nil)
	f.clock.Advance(750 * time.Millisecond) // now is exactly 1_700_000_001
	check(t, f.do(http.MethodGet, "acme", nil), want{
		status: http.StatusOK, limit: "5", remaining: "4", reset: epoch(2),
		policy: `"read";q=5;w=5`, rateLimit: `"read";r=4;t=1`,
	})
}

func TestRemainingIsNeverNegative(t *testing.T) {
	f := newFixture(t, testLimits, nil)
	key := quota.Key{Tenant: "acme", Class: "read"}
	if !f.buckets.spend(key, 3) {
		t.Fatal("could not spend 3 of 5 tokens")
	}
	f.buckets.overdraw(key, 5) // balance 2 - 5 = -3

	// The limiter really reports a negative balance; the fields must not.
	d, err := f.buckets.Allow(t.Context(), key, 1)
	if err != nil || d.Allowed || d.Remaining != -3 {
		t.Fatalf("limiter precondition: decision %+v, err %v; want denied with Remaining -3", d, err)
	}
	// Denied: 4 tokens short of one at 1/s, so retry at start + 4.25 s.
	check(t, f.do(http.MethodGet, "acme", nil), want{
		status:     http.StatusTooManyRequests,
		limit:      "5",
		remaining:  "0",
		reset:      epoch(5),
		policy:     `"read";q=5;w=5`,
		rateLimit:  `"read";r=0;t=5`,
		retryAfter: "5",
	})
}

func TestCostFunctionIsCharged(t *testing.T) {
	f := newFixture(t, testLimits, func(o *httplimit.Options) {
		o.Cost = func(r *http.Request) int64 {
			n, err := strconv.ParseInt(r.Header.Get("X-Batch-Size"), 10, 64)
			if err != nil {
				return 0 // refused by the cost check
			}
			return n
		}
	})
	batch := func(n string) http.Header { return http.Header{"X-Batch-Size": {n}} }

	check(t, f.do(http.MethodGet, "acme", batch("3")), want{
		status: http.StatusOK, limit: "5", remaining: "2", reset: epoch(4),
		policy: `"read";q=5;w=5`, rateLimit: `"read";r=2;t=4`,
	})
	// 4 tokens wanted, 2 held: 2 s at 1/s (start + 2.25 s), although the
	// bucket is not empty.
	check(t, f.do(http.MethodGet, "acme", batch("4")), want{
		status: http.StatusTooManyRequests, limit: "5", remaining: "2", reset: epoch(3),
		policy: `"read";q=5;w=5`, rateLimit: `"read";r=2;t=3`, retryAfter: "3",
	})

	for _, bad := range []string{"0", "-1", strconv.Itoa(quota.MaxCost + 1), "lots"} {
		rec := f.do(http.MethodGet, "acme", batch(bad))
		check(t, rec, want{status: http.StatusBadRequest})
		if !strings.Contains(rec.Body.String(), "cost") {
			t.Errorf("cost %s: body %q does not name the cost", bad, rec.Body.String())
		}
	}
	if got, want := fmt.Sprint(f.buckets.recordedCosts()), "[3 4]"; got != want {
		t.Errorf("limiter saw costs %s, want %s (bad costs must not reach it)", got, want)
	}
}

func TestDefaultCostIsOneToken(t *testing.T) {
	f := newFixture(t, testLimits, nil)
	f.do(http.MethodGet, "acme", nil)
	f.do(http.MethodPost, "acme", nil)
	if got, want := fmt.Sprint(f.buckets.recordedCosts()), "[1 1]"; got != want {
		t.Errorf("limiter saw costs %s, want %s", got, want)
	}
}

func TestKeyErrorIs400AndSkipsTheLimiter(t *testing.T) {
	f := newFixture(t, testLimits, nil)
	for _, tc := range []struct {
		name    string
		headers http.Header
		inBody  string
	}{
		{"missing tenant", nil, "X-Tenant-Id is missing"},
		{"tenant twice", http.Header{tenantHeader: {"acme", "globex"}}, "appears 2 times"},
		{"forbidden byte", http.Header{tenantHeader: {"ac me"}}, "tenant"},
		{"hash tag brace", http.Header{tenantHeader: {"{acme}"}}, "tenant"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := f.do(http.MethodGet, "", tc.headers)
			check(t, rec, want{status: http.StatusBadRequest})
			if !strings.Contains(rec.Body.String(), tc.inBody) {
				t.Errorf("body %q does not contain %q", rec.Body.String(), tc.inBody)
			}
		})
	}
	if got := f.buckets.recordedCosts(); len(got) != 0 {
		t.Errorf("limiter was called %d times for requests without a valid key", len(got))
	}
	if got := f.served.Load(); got != 0 {
		t.Errorf("%d requests without a key reached the handler", got)
	}
}

func TestCustomKeyFunctionErrorReachesOnError(t *testing.T) {
	keyErr := errors.New("API key not recognised")
	var seen error
	f := newFixture(t, testLimits, func(o *httplimit.Options) {
		o.Key = func(*http.Request) (quota.Key, error) { return quota.Key{}, keyErr }
		o.OnError = func(w http.ResponseWriter, r *http.Request, err error) {
			seen = err
			httplimit.DefaultOnError(w, r, err)
		}
	})
	rec := f.do(http.MethodGet, "acme", nil)
	check(t, rec, want{status: http.StatusBadRequest})
	if !errors.Is(seen, keyErr) || !errors.Is(seen, httplimit.ErrNoKey) {
		t.Errorf("OnError got %v; want it to wrap both the key error and ErrNoKey", seen)
	}
	if !strings.Contains(rec.Body.String(), "API key not recognised") {
		t.Errorf("body %q hides the key error", rec.Body.String())
	}
	if n := len(f.buckets.recordedCosts()); n != 0 {
		t.Errorf("limiter called %d times", n)
	}
}

func TestInvalidKeyFromCustomKeyFunctionIs400(t *testing.T) {
	f := newFixture(t, testLimits, func(o *httplimit.Options) {
		o.Key = func(r *http.Request) (quota.Key, error) {
			// A careless key function that trusts the path.
			return quota.Key{Tenant: "acme", Class: r.URL.Path}, nil
		}
	})
	rec := f.do(http.MethodGet, "acme", nil)
	check(t, rec, want{status: http.StatusBadRequest})
	if !strings.Contains(rec.Body.String(), "class") {
		t.Errorf("body %q does not name the class", rec.Body.String())
	}
	if n := len(f.buckets.recordedCosts()); n != 0 {
		t.Errorf("limiter called %d times with an invalid key", n)
	}
}

func TestLimiterRejectingInputIs400(t *testing.T) {
	f := newFixture(t, testLimits, func(o *httplimit.Options) {
		o.Key = httplimit.HeaderKey(tenantHeader, "export") // not configured
	})
	rec := f.do(http.MethodGet, "acme", nil)
	check(t, rec, want{status: http.StatusBadRequest})
	if !strings.Contains(rec.Body.String(), `class "export" is not configured`) {
		t.Errorf("body %q does not name the class", rec.Body.String())
	}
}

func TestLimiterFailureIs503WithoutInternals(t *testing.T) {
	backendErr := errors.New("dial tcp 10.0.0.7:6379: connection refused")
	var seen error
	var served atomic.Int64
	mw := httplimit.Middleware(failingLimiter{backendErr}, httplimit.Options{
		Key: httplimit.HeaderKey(tenantHeader, "read"),
		OnError: func(w http.ResponseWriter, r *http.Request, err error) {
			seen = err
			httplimit.DefaultOnError(w, r, err)
		},
	})
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) }))
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set(tenantHeader, "acme")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)

	check(t, rec, want{status: http.StatusServiceUnavailable})
	if !errors.Is(seen, backendErr) {
		t.Errorf("OnError got %v, want it to wrap the limiter error", seen)
	}
	if body := rec.Body.String(); strings.Contains(body, "10.0.0.7") {
		t.Errorf("503 body leaks the backend address: %q", body)
	}
	if served.Load() != 0 {
		t.Error("request without a decision reached the handler")
	}
}

func TestErrorStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("x: %w", httplimit.ErrNoKey), http.StatusBadRequest},
		{fmt.Errorf("limiter: %w", quota.ErrInvalid), http.StatusBadRequest},
		{errors.New("redis down"), http.StatusServiceUnavailable},
	} {
		if got := httplimit.ErrorStatus(tc.err); got != tc.want {
			t.Errorf("ErrorStatus(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestShadowModeServesDeniedRequests(t *testing.T) {
	f := newFixture(t, testLimits, nil)
	f.buckets.shadow = true
	if !f.buckets.spend(quota.Key{Tenant: "acme", Class: "read"}, 5) {
		t.Fatal("could not empty the bucket")
	}
	rec := f.do(http.MethodGet, "acme", nil)
	check(t, rec, want{
		status: http.StatusOK, limit: "5", remaining: "0", reset: epoch(6),
		policy: `"read";q=5;w=5`, rateLimit: `"read";r=0;t=6`,
	})
	if f.served.Load() != 1 {
		t.Error("shadow-mode request did not reach the handler")
	}
}

func TestPolicyNameAndWindowOptions(t *testing.T) {
	f := newFixture(t, testLimits, func(o *httplimit.Options) {
		o.Policy = `tier "pro" \ read`
		o.Window = nil
	})
	check(t, f.do(http.MethodGet, "acme", nil), want{
		status: http.StatusOK, limit: "5", remaining: "4", reset: epoch(2),
		policy:    `"tier \"pro\" \\ read";q=5`,
		rateLimit: `"tier \"pro\" \\ read";r=4;t=2`,
	})
}

// TestOneBytePolicyName: the shortest policy name, one byte, is written
// as a quoted String like any other.
func TestOneBytePolicyName(t *testing.T) {
	f := newFixture(t, testLimits, func(o *httplimit.Options) { o.Policy = "p" })
	check(t, f.do(http.MethodGet, "acme", nil), want{
		status: http.StatusOK, limit: "5", remaining: "4", reset: epoch(2),
		policy: `"p";q=5;w=5`, rateLimit: `"p";r=4;t=2`,
	})
}

func TestNewRejectsBadOptions(t *testing.T) {
	clock := newTestClock(start)
	lim := newTokenBuckets(clock, testLimits)
	key := httplimit.HeaderKey(tenantHeader, "read")
	for _, tc := range []struct {
		name   string
		l      httplimit.Limiter
		opts   httplimit.Options
		inText string
	}{
		{"nil limiter", nil, httplimit.Options{Key: key}, "limiter is nil"},
		{"nil key", lim, httplimit.Options{}, "Options.Key is nil"},
		{"non-ASCII policy", lim, httplimit.Options{Key: key, Policy: "lecture-é"}, "Options.Policy"},
		{"newline in policy", lim, httplimit.Options{Key: key, Policy: "a\nb"}, "Options.Policy"},
		{"long policy", lim, httplimit.Options{Key: key, Policy: strings.Repeat("p", httplimit.MaxPolicyLen+1)}, "Options.Policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := httplimit.New(tc.l, tc.opts)
			if err == nil || mw != nil {
				t.Fatalf("New accepted bad options")
			}
			if !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), tc.inText) {
				t.Errorf("error %q: want ErrInvalid mentioning %q", err, tc.inText)
			}
			defer func() {
				if recover() == nil {
					t.Error("Middleware did not panic on bad options")
				}
			}()
			httplimit.Middleware(tc.l, tc.opts)
		})
	}
}

func TestConcurrentRequestsAdmitExactlyTheBurst(t *testing.T) {
	f := newFixture(t, testLimits, nil) // the clock stands still: no refill
	const n = 40
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { codes <- f.do(http.MethodGet, "acme", nil).Code })
	}
	wg.Wait()
	close(codes)
	counts := map[int]int{}
	for c := range codes {
		counts[c]++
	}
	if counts[http.StatusOK] != 5 || counts[http.StatusTooManyRequests] != n-5 {
		t.Errorf("status counts %v, want 5 x 200 and %d x 429", counts, n-5)
	}
}

func TestFieldsReachAClientOverTheWire(t *testing.T) {
	f := newFixture(t, testLimits, nil)
	srv := httptest.NewServer(f.handler)
	defer srv.Close()

	get := func() *http.Response {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(tenantHeader, "acme")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for range 2 {
		if resp := get(); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200", resp.StatusCode)
		}
	}
	resp := get()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	for name, want := range map[string]string{
		"X-RateLimit-Limit":     "2",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     epoch(1),
		"Retry-After":           "1",
		"RateLimit-Policy":      `"write";q=2;w=1`,
		"RateLimit":             `"write";r=0;t=1`,
		"Content-Type":          "text/plain; charset=utf-8",
	} {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

// TestNeverDenialPromisesNoRetryTime: a region whose share of a small burst
// is below a request's cost can never admit it (Decision.RetryNever). The
// 429 must not carry a Retry-After (nor a t in RateLimit) after which the
// request would still be refused; waiting any time changes nothing.
func TestNeverDenialPromisesNoRetryTime(t *testing.T) {
	limits := map[string]quota.Limit{"read": {Rate: 0.1, Burst: 1}}
	f := newFixture(t, limits, nil)
	f.buckets.caps = map[string]int{"read": 0}
	for range 2 {
		// The region's bucket can hold none of the burst of 1: this caller
		// can expect nothing (X-RateLimit-Limit 0) under a policy of 1, and
		// no time is named.
		rec := f.do(http.MethodGet, "acme", nil)
		check(t, rec, want{
			status:    http.StatusTooManyRequests,
			limit:     "0",
			remaining: "0",
			policy:    `"read";q=1;w=10`,
			rateLimit: `"read";r=0`,
		})
		if body := rec.Body.String(); strings.Contains(body, "retry after") || !strings.Contains(body, "cannot be admitted") {
			t.Errorf("429 body %q promises a retry time or does not say the request cannot be admitted", body)
		}
		f.clock.Advance(time.Hour)
	}
	if got := f.served.Load(); got != 0 {
		t.Errorf("handler served %d requests, want 0", got)
	}
}

// TestPolicyNameBounds: Options.Policy is accepted up to exactly 64 bytes
// of printable ASCII (0x20 to 0x7E inclusive) and refused one byte longer
// or with the byte just outside that range.
func TestPolicyNameBounds(t *testing.T) {
	if httplimit.MaxPolicyLen != 64 {
		t.Errorf("MaxPolicyLen = %d, want 64", httplimit.MaxPolicyLen)
	}
	key := httplimit.HeaderKey(tenantHeader, "read")
	lim := newTokenBuckets(newTestClock(start), testLimits)
	for _, tc := range []struct {
		policy string
		ok     bool
	}{
		{strings.Repeat("p", 64), true},
		{strings.Repeat("p", 65), false},
		{"a b", true},     // 0x20
		{"a~b", true},     // 0x7E
		{"a\x1fb", false}, // one below 0x20
		{"a\x7fb", false}, // one above 0x7E
		{"\x7f", false},   // the first byte is checked too
		{"ab\x1f", false}, // and the last
	} {
		_, err := httplimit.New(lim, httplimit.Options{Key: key, Policy: tc.policy})
		if (err == nil) != tc.ok {
			t.Errorf("Policy %q (%d bytes): error %v, want accepted %v", tc.policy, len(tc.policy), err, tc.ok)
		}
		if err != nil && !errors.Is(err, quota.ErrInvalid) {
			t.Errorf("Policy %q: error %v does not wrap quota.ErrInvalid", tc.policy, err)
		}
	}
}
