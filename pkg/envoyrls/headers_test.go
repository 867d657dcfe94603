package envoyrls_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/internal/structfield"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// envoySaid is what one answer's response headers say, once checked.
type envoySaid struct {
	cap, q, w, remaining, t int64
	hasT                    bool
}

// checkFields reads an answer's response headers as clients do
// (x-ratelimit-limit, RateLimit and RateLimit-Policy parsed as RFC 8941
// Lists) and returns what is wrong: the families must agree with each
// other (x-ratelimit-remaining is r, q and w appear in both x-ratelimit-limit
// and RateLimit-Policy, r <= cap <= q, x-ratelimit-reset is t) and with
// retry-after, which on OVER_LIMIT is t as well.
func checkFields(resp *rlsv3.RateLimitResponse) (envoySaid, error) {
	var s envoySaid
	h := headerMap(resp)
	if n := len(resp.GetResponseHeadersToAdd()); n != len(h) {
		return s, fmt.Errorf("%d headers, %d distinct: %v", n, len(h), resp.GetResponseHeadersToAdd())
	}
	integer := func(name string) (int64, error) {
		n, err := strconv.ParseInt(h[name], 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s = %q is not a non-negative integer", name, h[name])
		}
		return n, nil
	}
	param := func(m structfield.Member, field, key string) (int64, bool, error) {
		v, ok := m.Param(key)
		if ok && (v.Kind != structfield.Integer || v.Int < 0) {
			return 0, false, fmt.Errorf("%s: %s is a %v, want a non-negative Integer", field, key, v.Kind)
		}
		return v.Int, ok, nil
	}

	// x-ratelimit-limit: the cap this caller can expect, then the policy.
	lim, err := structfield.ParseList(h[envoyrls.HeaderLimit])
	if err != nil {
		return s, err
	}
	if len(lim) != 2 || lim[0].Item.Kind != structfield.Integer || lim[1].Item.Kind != structfield.Integer {
		return s, fmt.Errorf("%s = %q, want \"<cap>, <burst>;w=<window>\"", envoyrls.HeaderLimit, h[envoyrls.HeaderLimit])
	}
	s.cap, s.q = lim[0].Item.Int, lim[1].Item.Int
	w, hasW, err := param(lim[1], envoyrls.HeaderLimit, "w")
	if err != nil || !hasW {
		return s, fmt.Errorf("%s = %q has no w (%v)", envoyrls.HeaderLimit, h[envoyrls.HeaderLimit], err)
	}
	s.w = w

	item := func(name string) (structfield.Member, error) {
		list, err := structfield.ParseList(h[name])
		if err != nil {
			return structfield.Member{}, err
		}
		if len(list) != 1 || list[0].IsList || list[0].Item.Kind != structfield.String {
			return structfield.Member{}, fmt.Errorf("%s = %q: want one item named by a String", name, h[name])
		}
		return list[0], nil
	}
	pol, err := item(envoyrls.HeaderRateLimitPolicy)
	if err != nil {
		return s, err
	}
	rl, err := item(envoyrls.HeaderRateLimit)
	if err != nil {
		return s, err
	}
	if pol.Item.Str != rl.Item.Str {
		return s, fmt.Errorf("RateLimit names %q, RateLimit-Policy %q", rl.Item.Str, pol.Item.Str)
	}
	q, hasQ, err := param(pol, "RateLimit-Policy", "q")
	if err != nil || !hasQ || q != s.q {
		return s, fmt.Errorf("RateLimit-Policy q=%d (present %v, %v), x-ratelimit-limit says %d", q, hasQ, err, s.q)
	}
	if pw, _, _ := param(pol, "RateLimit-Policy", "w"); pw != s.w {
		return s, fmt.Errorf("RateLimit-Policy w=%d, x-ratelimit-limit w=%d", pw, s.w)
	}
	r, hasR, err := param(rl, "RateLimit", "r")
	if err != nil || !hasR {
		return s, fmt.Errorf("RateLimit %q: r missing (%v)", h[envoyrls.HeaderRateLimit], err)
	}
	if s.remaining, err = integer(envoyrls.HeaderRemaining); err != nil {
		return s, err
	}
	if r != s.remaining || r > s.cap || s.cap > s.q {
		return s, fmt.Errorf("want r (%d) = x-ratelimit-remaining (%d) <= cap (%d) <= q (%d)", r, s.remaining, s.cap, s.q)
	}
	if s.t, s.hasT, err = param(rl, "RateLimit", "t"); err != nil {
		return s, err
	}
	reset, hasReset := h[envoyrls.HeaderReset]
	if hasReset != s.hasT || (s.hasT && reset != strconv.FormatInt(s.t, 10)) {
		return s, fmt.Errorf("x-ratelimit-reset %q (present %v), RateLimit t=%d (present %v)", reset, hasReset, s.t, s.hasT)
	}
	retry, hasRetry := h[envoyrls.HeaderRetryAfter]
	over := resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
	switch {
	case over && s.hasT:
		if retry != reset || s.t < 1 {
			return s, fmt.Errorf("retry-after %q, t=%d: want equal, at least 1", retry, s.t)
		}
	case hasRetry:
		return s, fmt.Errorf("retry-after %q on an answer that is not over limit or names no time", retry)
	}
	return s, nil
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
envoy:
  descriptors:
    - {domain: sluice, tenant_key: tenant, class: read}
`

// usEastService is an Envoy endpoint deciding through a lease client of
// instance id on us-east, a real regional service and redis-server, with
// the threeRegions config.
func usEastService(t *testing.T, id string) (*config.Config, *envoyrls.Service) {
	t.Helper()
	cfg := regiontest.MustConfig(t, threeRegions)
	reg := regiontest.Start(t, cfg, "us-east")
	c, err := lease.NewClient(reg.Dial(t), lease.Options{
		InstanceID: id, Refresh: 200 * time.Millisecond, BreakerTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	svc, err := envoyrls.New(envoyrls.Options{Config: regional.StaticConfig{C: cfg}, Limiter: c})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, svc
}

// TestEnvoyHeadersSayWhatTheRegionAdmits: Envoy's answers from us-east,
// which holds half of each key's bucket on a real regional service and
// redis-server, announce the region's cap (100 of a pro tenant's 200, 3 of
// a free tenant's 5) under the policy, and a Remaining the requests that
// follow really get, until OVER_LIMIT; every answer's fields agree.
func TestEnvoyHeadersSayWhatTheRegionAdmits(t *testing.T) {
	cfg, svc := usEastService(t, "envoy-headers")
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
				t.Fatalf("us-east's share: burst %v (err %v), want %d", burst, err, tc.cap)
			}
			call := func() (*rlsv3.RateLimitResponse, envoySaid) {
				t.Helper()
				resp, err := svc.ShouldRateLimit(t.Context(), request("sluice", 0, desc("tenant", tc.tenant)))
				if err != nil {
					t.Fatal(err)
				}
				s, err := checkFields(resp)
				if err != nil {
					t.Fatalf("answer %v: %v", resp, err)
				}
				if s.cap != tc.cap || s.q != tc.policy {
					t.Errorf("cap %d under q=%d, want the region's %d under the policy %d", s.cap, s.q, tc.cap, tc.policy)
				}
				return resp, s
			}
			start := time.Now()
			resp, first := call()
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || first.remaining != tc.cap-1 {
				t.Fatalf("first answer %v: want OK with %d remaining of the region's full bucket", resp, tc.cap-1)
			}
			admitted := int64(1)
			for {
				resp, s := call()
				if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
					if !s.hasT {
						t.Errorf("OVER_LIMIT without a retry time: %v", resp)
					}
					break
				}
				admitted++
				if admitted > 2*tc.cap {
					t.Fatalf("admitted %d, more than twice the region's cap %d", admitted, tc.cap)
				}
			}
			refill := int64(math.Ceil(rate * time.Since(start).Seconds()))
			if admitted < 1+first.remaining || admitted > 1+first.remaining+refill {
				t.Errorf("admitted %d before OVER_LIMIT; the first answer promised 1 + %d (refill since: up to %d)", admitted, first.remaining, refill)
			}
		})
	}
}

// TestAnswerThatSpendsTheLastTokensSaysWhenTheyComeBack: an admitted
// request that spends every token this caller can expect (a free tenant's
// 3 in us-east, at us-east's 3 tokens a minute) leaves Remaining 0, and
// t says when the 3 are back: about a minute, although the region's own
// bucket was "full" at its answer (the tokens were out in the lease).
// The request after it is OVER_LIMIT with a retry time no later than t.
func TestAnswerThatSpendsTheLastTokensSaysWhenTheyComeBack(t *testing.T) {
	_, svc := usEastService(t, "envoy-reset")
	ask := func(hits uint32) (*rlsv3.RateLimitResponse, envoySaid) {
		t.Helper()
		resp, err := svc.ShouldRateLimit(t.Context(), request("sluice", hits, desc("tenant", "newcomer")))
		if err != nil {
			t.Fatal(err)
		}
		s, err := checkFields(resp)
		if err != nil {
			t.Fatalf("answer %v: %v", resp, err)
		}
		return resp, s
	}
	resp, spent := ask(3)
	// 3 tokens at us-east's static 3/m (6/m × 2/4): 60 s, give or take the
	// rounding to whole seconds and the time the test took.
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || spent.remaining != 0 || !spent.hasT || spent.t < 59 || spent.t > 61 {
		t.Fatalf("the cap of 3 spent at once: %v, remaining %d t %d (has t %v); want OK, 0 remaining, t about 60", resp, spent.remaining, spent.t, spent.hasT)
	}
	resp, next := ask(1)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || !next.hasT || next.t > spent.t {
		t.Fatalf("the request after: %v, t %d; want OVER_LIMIT with a retry time no later than %d", resp, next.t, spent.t)
	}
}

// TestNeverAnswerCarriesTheRegionsCapNotTheBurst: a cost above the
// configured burst is answered "never" without asking the region; its
// x-ratelimit-limit is the region's cap, as every other answer on the key
// says (us-east's 3 of a free tenant's 5), not the burst: before the region
// has answered on the key, while the client holds it, and after the client
// has forgotten it as idle. It said 5 whenever the client did not hold
// the key.
func TestNeverAnswerCarriesTheRegionsCapNotTheBurst(t *testing.T) {
	cfg := regiontest.MustConfig(t, threeRegions)
	reg := regiontest.Start(t, cfg, "us-east")
	const refresh, idle = 200 * time.Millisecond, 400 * time.Millisecond
	src := regional.StaticConfig{C: cfg}
	c, err := lease.NewClient(reg.Dial(t), lease.Options{
		InstanceID: "envoy-never-cap", Refresh: refresh, IdleTimeout: idle, BreakerTimeout: 2 * time.Second,
		StaticShare: envoyrls.LiveStaticShare(src, "us-east"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	svc, err := envoyrls.New(envoyrls.Options{Config: src, Limiter: c})
	if err != nil {
		t.Fatal(err)
	}
	key := quota.Key{Tenant: "newcomer", Class: "read"}
	ask := func(what string, hits uint32, want rlsv3.RateLimitResponse_Code) {
		t.Helper()
		resp, err := svc.ShouldRateLimit(t.Context(), request("sluice", hits, desc("tenant", key.Tenant)))
		if err != nil {
			t.Fatal(err)
		}
		s, err := checkFields(resp)
		if err != nil {
			t.Fatalf("%s: answer %v: %v", what, resp, err)
		}
		if resp.GetOverallCode() != want || s.cap != 3 || s.q != 5 {
			t.Errorf("%s: %v, cap %d under q=%d; want %v with the region's cap 3 under the policy 5", what, resp.GetOverallCode(), s.cap, s.q, want)
		}
	}
	ask("never, before the region answered", 6, rlsv3.RateLimitResponse_OVER_LIMIT)
	ask("one token", 1, rlsv3.RateLimitResponse_OK)
	if _, held := c.Table().State(key); !held {
		t.Fatal("the client does not hold the key it just decided")
	}
	ask("never, the key held", 6, rlsv3.RateLimitResponse_OVER_LIMIT)

	// Forgotten after idle without demand; the client looks at its keys
	// every refresh.
	deadline := time.Now().Add(idle + 10*refresh)
	for {
		if _, held := c.Table().State(key); !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client still holds the key %v after its idle timeout of %v", idle+10*refresh, idle)
		}
		time.Sleep(refresh / 10)
	}
	ask("never, the key forgotten", 6, rlsv3.RateLimitResponse_OVER_LIMIT)
}
