package httplimit_test

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/internal/structfield"
	"github.com/sluicehq/sluice/pkg/httplimit"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// said is what one response's rate-limit fields say, once checked.
type said struct {
	q, limit, remaining int64
	t                   int64
	hasT                bool
}

// checkAgreement reads one response's rate-limit fields as a client of
// the IETF draft does (RateLimit-Policy and RateLimit parsed as RFC 8941
// Lists) and checks that the three families agree: X-RateLimit-Remaining
// is r, X-RateLimit-Limit is at most q and at least r, X-RateLimit-Reset is
// Date + t, and a 429's Retry-After is t.
func checkAgreement(t *testing.T, status int, h http.Header) said {
	t.Helper()
	one := func(name string) string {
		t.Helper()
		v := h.Values(name)
		if len(v) != 1 {
			t.Fatalf("%s: %d field lines %q, want 1", name, len(v), v)
		}
		return v[0]
	}
	integer := func(name string) int64 {
		t.Helper()
		n, err := strconv.ParseInt(one(name), 10, 64)
		if err != nil || n < 0 {
			t.Fatalf("%s = %q is not a non-negative integer", name, one(name))
		}
		return n
	}
	param := func(m structfield.Member, field, key string, required bool) (int64, bool) {
		t.Helper()
		v, ok := m.Param(key)
		switch {
		case !ok && required:
			t.Fatalf("%s: parameter %s is missing", field, key)
		case !ok:
			return 0, false
		case v.Kind != structfield.Integer || v.Int < 0:
			t.Fatalf("%s: parameter %s is a %v %+v, want a non-negative Integer", field, key, v.Kind, v)
		}
		return v.Int, true
	}
	item := func(name string) structfield.Member {
		t.Helper()
		list, err := structfield.ParseList(h.Values(name)...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(list) != 1 || list[0].IsList || list[0].Item.Kind != structfield.String {
			t.Fatalf("%s = %q: want one item whose value is a String (the policy name)", name, h.Values(name))
		}
		return list[0]
	}

	pol, rl := item("RateLimit-Policy"), item("RateLimit")
	if pol.Item.Str != rl.Item.Str {
		t.Errorf("RateLimit names policy %q, RateLimit-Policy %q", rl.Item.Str, pol.Item.Str)
	}
	var s said
	s.q, _ = param(pol, "RateLimit-Policy", "q", true)
	if w, ok := param(pol, "RateLimit-Policy", "w", false); ok && w < 1 {
		t.Errorf("RateLimit-Policy: w=%d, want at least 1", w)
	}
	r, _ := param(rl, "RateLimit", "r", true)
	s.t, s.hasT = param(rl, "RateLimit", "t", false)

	s.limit, s.remaining = integer("X-RateLimit-Limit"), integer("X-RateLimit-Remaining")
	if s.remaining != r {
		t.Errorf("X-RateLimit-Remaining %d, RateLimit r=%d", s.remaining, r)
	}
	if s.limit > s.q || r > s.limit {
		t.Errorf("want r (%d) <= X-RateLimit-Limit (%d) <= q (%d)", r, s.limit, s.q)
	}
	date, err := http.ParseTime(one("Date"))
	if err != nil {
		t.Fatalf("Date: %v", err)
	}
	switch {
	case s.hasT:
		if reset := integer("X-RateLimit-Reset"); reset != date.Unix()+s.t {
			t.Errorf("X-RateLimit-Reset %d, want Date (%d) + t (%d)", reset, date.Unix(), s.t)
		}
	case len(h.Values("X-RateLimit-Reset")) != 0:
		t.Errorf("X-RateLimit-Reset %q without a t in RateLimit", h.Values("X-RateLimit-Reset"))
	}
	switch {
	case status == http.StatusTooManyRequests && s.hasT:
		if ra := integer("Retry-After"); ra != s.t || ra < 1 {
			t.Errorf("Retry-After %d, want t (%d), at least 1", ra, s.t)
		}
	case status == http.StatusTooManyRequests:
		if v := h.Values("Retry-After"); len(v) != 0 {
			t.Errorf("Retry-After %q on a 429 that names no time", v)
		}
	default:
		if v := h.Values("Retry-After"); len(v) != 0 {
			t.Errorf("Retry-After %q on a %d", v, status)
		}
	}
	return s
}

// TestFieldFamiliesAgreeAtEveryPhaseOfTheSecond drives the middleware
// through admissions, denials, shadow decisions and a never denial at
// clock offsets across a second, and checks every response with
// checkAgreement.
func TestFieldFamiliesAgreeAtEveryPhaseOfTheSecond(t *testing.T) {
	limits := map[string]quota.Limit{
		"read":  {Rate: 1, Burst: 5},
		"write": {Rate: 10, Burst: 2},
		"bulk":  {Rate: 0.4, Burst: 3},
	}
	for _, offset := range []time.Duration{0, time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, 999 * time.Millisecond} {
		f := newFixture(t, limits, nil)
		f.buckets.caps = map[string]int{"bulk": 2} // a region's share below the policy
		f.clock.Advance(offset)
		statuses := map[int]int{}
		for i := range 40 {
			method := []string{http.MethodGet, http.MethodPost}[i%2]
			rec := f.do(method, "acme", nil)
			statuses[rec.Code]++
			checkAgreement(t, rec.Code, rec.Header())
			f.clock.Advance(time.Duration(i%7) * 37 * time.Millisecond)
		}
		if statuses[http.StatusOK] == 0 || statuses[http.StatusTooManyRequests] == 0 {
			t.Fatalf("offset %v: statuses %v, want both admissions and denials", offset, statuses)
		}
		// The region's share of bulk is 2 of the policy's 3.
		bulk := newFixture(t, limits, func(o *httplimit.Options) {
			o.Key = httplimit.HeaderKey(tenantHeader, "bulk")
		})
		bulk.buckets.caps = map[string]int{"bulk": 2}
		bulk.clock.Advance(offset)
		for i := range 4 {
			rec := bulk.do(http.MethodPost, "acme", nil)
			s := checkAgreement(t, rec.Code, rec.Header())
			if s.q != 3 || s.limit != 2 {
				t.Errorf("bulk response %d: q=%d X-RateLimit-Limit=%d, want the policy 3 and the share 2", i, s.q, s.limit)
			}
		}
		// Shadow: a served request with exhausted numbers.
		f.buckets.shadow = true
		rec := f.do(http.MethodGet, "acme", nil)
		if rec.Code != http.StatusOK {
			t.Fatalf("shadow: status %d", rec.Code)
		}
		checkAgreement(t, rec.Code, rec.Header())
	}
	// A never denial: no time in any family.
	f := newFixture(t, map[string]quota.Limit{"read": {Rate: 0.1, Burst: 1}}, nil)
	f.buckets.caps = map[string]int{"read": 0}
	rec := f.do(http.MethodGet, "acme", nil)
	if s := checkAgreement(t, rec.Code, rec.Header()); rec.Code != http.StatusTooManyRequests || s.hasT {
		t.Errorf("never denial: status %d, t present %v", rec.Code, s.hasT)
	}
}

// threeRegions: us-east (weight 2 of 4) runs on half of every key. Rates
// are slow, so refill during the test adds at most a token or two.
const threeRegions = `
lease_ttl: 2s
refresh: 200ms
regions:
  us-east:  {weight: 2}
  eu-west:  {weight: 1}
  ap-south: {weight: 1}
classes:
  read: {mode: lease}
tiers:
  free: {read: {rate: 6/m, burst: 5}}
  pro:  {read: {rate: 2/s, burst: 200}}
tenants:
  acme: {tier: pro}
default_tier: free
`

// TestHeadersSayWhatTheRegionAdmits runs the middleware on a real lease
// client against a real regional service and redis-server in us-east, which
// holds half of each key's bucket. A pro tenant's policy is burst 200 and a
// free tenant's 5: the first response must announce the region's cap (100,
// and 3 by largest remainder) as X-RateLimit-Limit under that policy, and a
// Remaining that the requests which follow really get, until the 429.
func TestHeadersSayWhatTheRegionAdmits(t *testing.T) {
	cfg := regiontest.MustConfig(t, threeRegions)
	reg := regiontest.Start(t, cfg, "us-east")
	c, err := lease.NewClient(reg.Dial(t), lease.Options{
		InstanceID: "headers-test", Refresh: 200 * time.Millisecond, BreakerTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	mw := httplimit.Middleware(c, httplimit.Options{
		Key: httplimit.HeaderKey(tenantHeader, "read"),
		Window: func(k quota.Key) time.Duration {
			res, _ := cfg.Resolve(k)
			return httplimit.RefillWindow(res.Limit)
		},
	})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })))
	defer srv.Close()
	get := func(tenant string) (int, http.Header) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(tenantHeader, tenant)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}

	for _, tc := range []struct {
		tenant      string
		policy, cap int64
	}{
		{"acme", 200, 100},
		{"newcomer", 5, 3},
	} {
		t.Run(tc.tenant, func(t *testing.T) {
			res, err := cfg.Resolve(quota.Key{Tenant: tc.tenant, Class: "read"})
			if err != nil {
				t.Fatal(err)
			}
			rate, burst, err := cfg.StaticShareOf("us-east", res)
			if err != nil || int64(math.Floor(burst)) != tc.cap {
				t.Fatalf("us-east's share of %s: burst %v (err %v), want %d", tc.tenant, burst, err, tc.cap)
			}
			start := time.Now()
			status, h := get(tc.tenant)
			first := checkAgreement(t, status, h)
			if status != http.StatusOK || first.q != tc.policy || first.limit != tc.cap {
				t.Fatalf("first response: status %d, q=%d, X-RateLimit-Limit=%d; want 200 under the policy %d announcing the region's cap %d",
					status, first.q, first.limit, tc.policy, tc.cap)
			}
			if first.remaining != tc.cap-1 {
				t.Errorf("first response: Remaining %d, want %d: one token of the region's full bucket was spent", first.remaining, tc.cap-1)
			}
			admitted := int64(1)
			for {
				status, h := get(tc.tenant)
				s := checkAgreement(t, status, h)
				if s.limit != tc.cap || s.q != tc.policy {
					t.Errorf("response %d: X-RateLimit-Limit %d q=%d, want %d and %d", admitted+1, s.limit, s.q, tc.cap, tc.policy)
				}
				if status == http.StatusTooManyRequests {
					if !s.hasT || s.t < 1 {
						t.Errorf("429 without a retry time: %v", h)
					}
					break
				}
				admitted++
				if admitted > 2*tc.cap {
					t.Fatalf("admitted %d requests, more than twice the region's cap %d", admitted, tc.cap)
				}
			}
			// Everything announced was there; more only by refill at the
			// region's rate since the first response.
			refill := int64(math.Ceil(rate * time.Since(start).Seconds()))
			if admitted < 1+first.remaining || admitted > 1+first.remaining+refill {
				t.Errorf("admitted %d before the 429; the first response promised 1 + %d (refill since: up to %d)",
					admitted, first.remaining, refill)
			}
		})
	}
}
