package envoyrls_test

import (
	"context"
	"math"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
)

// treeServiceConfig: slow limits (per minute and per day), so refill
// during the test moves no verdict.
const treeServiceConfig = `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}}
classes:
  per_number: {}
  marketing: {}
  user_a: {}
tiers:
  std:
    per_number: {rate: 100/d, burst: 100}
    marketing: {rate: 2/d, burst: 2}
    user_a: {rate: 1/m, burst: 2}
default_tier: std
envoy:
  domains:
    - domain: messaging
      descriptors:
        - key: message_type
          value: marketing
          descriptors:
            - {key: to_number, class: marketing}
        - {key: to_number, class: per_number}
        - {key: to_number, value: "911", unlimited: true}
        - key: service
          descriptors:
            - {key: user, value: user-a, class: user_a, shadow_mode: true}
`

// TestTreeAnswers drives envoy.domains trees through the service on a
// real region: nested descriptors with per-value buckets, several
// descriptors in one request (all charged, OVER_LIMIT when one is over,
// the headers describing that one), unlimited descriptors and a shadow
// node.
func TestTreeAnswers(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, treeServiceConfig)
	p := startProcess(t, rs, cfg, "envoy-tree", true)
	marketing := limitSpec{"marketing", 2, rlsv3.RateLimitResponse_RateLimit_DAY, 2, 86400}

	t.Run("nested and several descriptors", func(t *testing.T) {
		// Envoy sends both descriptors of envoyproxy/ratelimit's
		// "messaging" example in one request: each is charged.
		req := func(number string) *rlsv3.RateLimitRequest {
			return request("messaging", 0,
				desc("message_type", "marketing", "to_number", number),
				desc("to_number", number))
		}
		for i := range 3 {
			resp := ask(t, p.rls, req("2061111111"))
			st := resp.GetStatuses()
			want := rlsv3.RateLimitResponse_OK
			if i == 2 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if resp.GetOverallCode() != want || len(st) != 2 || st[0].GetCode() != want || st[1].GetCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("request %d: %v, want %v from the marketing descriptor, OK from the other", i+1, resp, want)
			}
			// Once marketing limits the request, per_number is not charged
			// (answered OK as not decided, with no current_limit).
			if i < 2 && (st[1].GetCurrentLimit().GetName() != "per_number" || st[1].GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY ||
				st[1].GetCurrentLimit().GetRequestsPerUnit() != 100) {
				t.Fatalf("request %d: second status %v, want 100 per DAY named per_number", i+1, st[1])
			}
			if i == 2 && st[1].GetCurrentLimit() != nil {
				t.Fatalf("request %d: second status %v, want it not decided once the first limits the request", i+1, st[1])
			}
			// The headers describe the tightest: marketing, 2 a day.
			if err := checkHeaders(resp, st[0], marketing); err != nil {
				t.Fatalf("request %d: %v", i+1, err)
			}
		}
		// Another number has its own buckets.
		if resp := ask(t, p.rls, req("2062222222")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("another number: %v, want OK", resp)
		}
	})

	t.Run("unlimited", func(t *testing.T) {
		for range 5 {
			resp := ask(t, p.rls, request("messaging", 0, desc("to_number", "911")))
			st := resp.GetStatuses()[0]
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != math.MaxUint32 ||
				st.GetCurrentLimit() != nil || len(resp.GetResponseHeadersToAdd()) != 0 {
				t.Fatalf("unlimited descriptor: %v, want OK, remaining MaxUint32, no limit, no headers", resp)
			}
		}
		// Nothing was charged: no key of Redis names the descriptor.
		keys, err := rs.Client().Keys(context.Background(), "*911*").Result()
		if err != nil || len(keys) != 0 {
			t.Errorf("unlimited descriptors made Redis keys %v (%v)", keys, err)
		}
		if n := counter(t, p.reg, "sluice_envoy_unlimited_descriptors_total", nil); n != 5 {
			t.Errorf("unlimited counter %v, want 5", n)
		}
	})

	t.Run("shadow node", func(t *testing.T) {
		const n = 6
		for i := range n {
			resp := ask(t, p.rls, request("messaging", 0, desc("service", "auth", "user", "user-a")))
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("request %d: %v, want OK (shadow_mode)", i+1, resp)
			}
		}
		labels := map[string]string{"class": "user_a", "tier": "std"}
		okN := counter(t, p.reg, "sluice_envoy_decisions_total", with(labels, "result", "ok"))
		shadowN := counter(t, p.reg, "sluice_envoy_decisions_total", with(labels, "result", "shadow_denied"))
		if okN > 2 || okN+shadowN != n || shadowN < n-2 {
			t.Errorf("ok %v, shadow_denied %v; want at most the burst of 2 ok and the rest shadow_denied", okN, shadowN)
		}
		if over := counter(t, p.reg, "sluice_envoy_decisions_total", with(labels, "result", "over_limit")); over != 0 {
			t.Errorf("%v over_limit decisions for a shadow node", over)
		}
		// Beside a descriptor that limits the caller, the exhausted shadow
		// one is not what the headers describe: it limits nobody.
		resp := ask(t, p.rls, request("messaging", 0, desc("service", "auth", "user", "user-a"), desc("to_number", "555")))
		st := resp.GetStatuses()
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st[0].GetLimitRemaining() != 0 {
			t.Fatalf("shadow and per_number: %v, want OK with the shadow descriptor exhausted", resp)
		}
		perNumber := limitSpec{"per_number", 100, rlsv3.RateLimitResponse_RateLimit_DAY, 100, 86400}
		if err := checkHeaders(resp, st[1], perNumber); err != nil {
			t.Errorf("headers: %v (want them to describe per_number)", err)
		}
	})
}
