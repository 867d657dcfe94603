package agent

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestAnswerExactValues pins each field of the /v1/allow answer for
// decisions at the edges: a cap the limiter does not know is the burst, a
// known one is clamped to [0, burst]; remaining to [0, cap]; reset_ms and
// retry_after_ms are whole milliseconds rounded up (a whole millisecond
// stays as it is, a past reset is 0); a denial is retried no earlier than
// 1 ms and reset no earlier than its retry; a retry_never denial names no
// time; and a key in shadow mode by the config is allowed with would_deny,
// no retry time and no retry_never.
func TestAnswerExactValues(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	at := func(d time.Duration) time.Time { return now.Add(d) }
	const burst = 100
	cases := []struct {
		name    string
		d       quota.Decision
		shadow  bool
		want    AllowResponse
		outcome string
	}{
		{"allowed, known cap, reset a nanosecond past a millisecond",
			quota.Decision{Allowed: true, Cap: 50, CapKnown: true, Remaining: 10, ResetAt: at(1500*time.Millisecond + time.Nanosecond)}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: 50, Remaining: 10, ResetMS: 1501}, outcomeOK},
		{"allowed, reset on a whole millisecond",
			quota.Decision{Allowed: true, Cap: 50, CapKnown: true, Remaining: 49, ResetAt: at(2 * time.Second)}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: 50, Remaining: 49, ResetMS: 2000}, outcomeOK},
		{"allowed, reset a nanosecond ahead",
			quota.Decision{Allowed: true, Cap: 1, CapKnown: true, Remaining: 0, ResetAt: at(time.Nanosecond)}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: 1, Remaining: 0, ResetMS: 1}, outcomeOK},
		{"allowed, reset in the past",
			quota.Decision{Allowed: true, Cap: 50, CapKnown: true, Remaining: 50, ResetAt: at(-time.Second)}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: 50, Remaining: 50}, outcomeOK},
		{"allowed, reset exactly now",
			quota.Decision{Allowed: true, Cap: 50, CapKnown: true, Remaining: 50, ResetAt: now}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: 50, Remaining: 50}, outcomeOK},
		{"cap unknown: the burst",
			quota.Decision{Allowed: true, Remaining: 80}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: burst, Remaining: 80}, outcomeOK},
		{"cap unknown, remaining above the burst",
			quota.Decision{Allowed: true, Remaining: burst + 1}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: burst, Remaining: burst}, outcomeOK},
		{"negative cap",
			quota.Decision{Allowed: true, Cap: -3, CapKnown: true, Remaining: 5}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: 0, Remaining: 0}, outcomeOK},
		{"cap of 1",
			quota.Decision{Allowed: true, Cap: 1, CapKnown: true, Remaining: 1}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: 1, Remaining: 1}, outcomeOK},
		{"cap above the burst",
			quota.Decision{Allowed: true, Cap: burst + 1, CapKnown: true, Remaining: burst + 1}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: burst, Remaining: burst}, outcomeOK},
		{"remaining above the cap",
			quota.Decision{Allowed: true, Cap: 50, CapKnown: true, Remaining: 51}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: 50, Remaining: 50}, outcomeOK},
		{"negative remaining",
			quota.Decision{Allowed: true, Cap: 50, CapKnown: true, Remaining: -1}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: 50, Remaining: 0}, outcomeOK},
		{"degraded",
			quota.Decision{Allowed: true, Cap: 50, CapKnown: true, Remaining: 7, Degraded: true}, false,
			AllowResponse{Allowed: true, Limit: burst, Cap: 50, Remaining: 7, Degraded: true}, outcomeOK},
		{"denied, retry a nanosecond past 20 ms, reset later",
			quota.Decision{WouldDeny: true, Cap: 50, CapKnown: true, Remaining: 0, RetryAfter: 20*time.Millisecond + time.Nanosecond, ResetAt: at(time.Second)}, false,
			AllowResponse{WouldDeny: true, Limit: burst, Cap: 50, RetryAfterMS: 21, ResetMS: 1000}, outcomeOverLimit},
		{"denied, retry on a whole millisecond",
			quota.Decision{WouldDeny: true, Cap: 50, CapKnown: true, RetryAfter: 20 * time.Millisecond, ResetAt: at(time.Second)}, false,
			AllowResponse{WouldDeny: true, Limit: burst, Cap: 50, RetryAfterMS: 20, ResetMS: 1000}, outcomeOverLimit},
		{"denied, retry now and no reset: 1 ms for both",
			quota.Decision{Cap: 50, CapKnown: true}, false,
			AllowResponse{WouldDeny: true, Limit: burst, Cap: 50, RetryAfterMS: 1, ResetMS: 1}, outcomeOverLimit},
		{"denied, retry a nanosecond ahead",
			quota.Decision{Cap: 50, CapKnown: true, RetryAfter: time.Nanosecond}, false,
			AllowResponse{WouldDeny: true, Limit: burst, Cap: 50, RetryAfterMS: 1, ResetMS: 1}, outcomeOverLimit},
		{"denied, retry after the reset: reset moves to it",
			quota.Decision{Cap: 50, CapKnown: true, Remaining: 3, RetryAfter: 3 * time.Second, ResetAt: at(time.Second)}, false,
			AllowResponse{WouldDeny: true, Limit: burst, Cap: 50, Remaining: 3, RetryAfterMS: 3000, ResetMS: 3000}, outcomeOverLimit},
		{"denied for good",
			quota.Decision{WouldDeny: true, Cap: 50, CapKnown: true, Remaining: 2, RetryNever: true, ResetAt: at(time.Second)}, false,
			AllowResponse{WouldDeny: true, Limit: burst, Cap: 50, Remaining: 2, RetryNever: true}, outcomeOverLimit},
		{"allowed with retry_never from the limiter's shadow mode",
			quota.Decision{Allowed: true, WouldDeny: true, Cap: 50, CapKnown: true, RetryNever: true, ResetAt: at(time.Second)}, false,
			AllowResponse{Allowed: true, WouldDeny: true, Limit: burst, Cap: 50, ResetMS: 1000}, outcomeShadowDenied},
		{"shadow key by the config, denied by the limiter",
			quota.Decision{WouldDeny: true, Cap: 50, CapKnown: true, RetryAfter: 5 * time.Millisecond, ResetAt: at(time.Second)}, true,
			AllowResponse{Allowed: true, WouldDeny: true, Limit: burst, Cap: 50, ResetMS: 1000}, outcomeShadowDenied},
		{"shadow key by the config, denied for good by the limiter",
			quota.Decision{Cap: 50, CapKnown: true, RetryNever: true, ResetAt: at(time.Second)}, true,
			AllowResponse{Allowed: true, WouldDeny: true, Limit: burst, Cap: 50, ResetMS: 1000}, outcomeShadowDenied},
		{"shadow key by the config, allowed",
			quota.Decision{Allowed: true, Cap: 50, CapKnown: true, Remaining: 9}, true,
			AllowResponse{Allowed: true, Limit: burst, Cap: 50, Remaining: 9}, outcomeOK},
	}
	for _, c := range cases {
		res := config.Resolved{Limit: quota.Limit{Rate: 10, Burst: burst}, Shadow: c.shadow}
		got, outcome := answer(now, c.d, res)
		if got != c.want || outcome != c.outcome {
			t.Errorf("%s:\n got %+v, %s\nwant %+v, %s", c.name, got, outcome, c.want, c.outcome)
		}
	}
}

// TestValidateAtTheBounds pins which requests validate accepts, with the
// key and cost it decides on, and the field it names when it refuses
// (in a message without the "invalid argument" prefix): a cost of exactly
// the key's burst is accepted and one more is not; no cost is 1.
func TestValidateAtTheBounds(t *testing.T) {
	cfg, err := config.Parse([]byte(fuzzConfig))
	if err != nil {
		t.Fatal(err)
	}
	cost := func(n int64) *int64 { return &n }
	cases := []struct {
		name     string
		req      AllowRequest
		wantCost int64 // when accepted
		field    string
		says     string // when refused
	}{
		{"no cost is 1", AllowRequest{Tenant: "acme", Class: "read"}, 1, "", ""},
		{"cost 1", AllowRequest{Tenant: "acme", Class: "read", Cost: cost(1)}, 1, "", ""},
		{"cost of the burst", AllowRequest{Tenant: "acme", Class: "read", Cost: cost(200)}, 200, "", ""},
		{"cost of another tenant's burst", AllowRequest{Tenant: "other", Class: "read", Cost: cost(20)}, 20, "", ""},
		{"cost of 1 on a burst of 1", AllowRequest{Tenant: "acme", Class: "write", Cost: cost(1)}, 1, "", ""},
		{"cost one above the burst", AllowRequest{Tenant: "acme", Class: "read", Cost: cost(201)}, 0, "cost", "exceeds the burst 200"},
		{"cost one above another tenant's burst", AllowRequest{Tenant: "other", Class: "read", Cost: cost(21)}, 0, "cost", "exceeds the burst 20"},
		{"cost 2 on a burst of 1", AllowRequest{Tenant: "acme", Class: "write", Cost: cost(2)}, 0, "cost", "exceeds the burst 1"},
		{"cost 0", AllowRequest{Tenant: "acme", Class: "read", Cost: cost(0)}, 0, "cost", "at least 1"},
		{"cost above the maximum", AllowRequest{Tenant: "acme", Class: "read", Cost: cost(quota.MaxCost + 1)}, 0, "cost", "exceeds the maximum"},
		{"no tenant", AllowRequest{Class: "read"}, 0, "tenant", "tenant is empty"},
		{"bad tenant", AllowRequest{Tenant: "a b", Class: "read"}, 0, "tenant", "has byte"},
		{"bad tenant and bad class", AllowRequest{Tenant: "a b", Class: "r d"}, 0, "tenant", "has byte"},
		{"no class", AllowRequest{Tenant: "acme"}, 0, "class", "class is empty"},
		{"bad class", AllowRequest{Tenant: "acme", Class: "r d"}, 0, "class", "has byte"},
		{"unknown class", AllowRequest{Tenant: "acme", Class: "nope"}, 0, "class", "not configured"},
		{"bad class and bad cost", AllowRequest{Tenant: "acme", Class: "r d", Cost: cost(0)}, 0, "class", "has byte"},
		{"unknown class and bad cost", AllowRequest{Tenant: "acme", Class: "nope", Cost: cost(0)}, 0, "cost", "at least 1"},
	}
	for _, c := range cases {
		key, got, res, berr := validate(cfg, c.req)
		if c.field == "" && c.says == "" {
			want, err := cfg.Resolve(quota.Key{Tenant: c.req.Tenant, Class: c.req.Class})
			if berr != nil || err != nil || got != c.wantCost || res != want || key != (quota.Key{Tenant: c.req.Tenant, Class: c.req.Class}) {
				t.Errorf("%s: key %q, cost %d, %+v, refusal %v; want accepted with cost %d and %+v (%v)", c.name, key, got, res, berr, c.wantCost, want, err)
			}
			continue
		}
		if berr == nil || berr.status != http.StatusBadRequest || berr.field != c.field || !strings.Contains(berr.msg, c.says) {
			t.Errorf("%s: refusal %+v; want 400 on field %q saying %q", c.name, berr, c.field, c.says)
		}
		// The status says the argument is invalid; the message does not
		// repeat it.
		if berr != nil && strings.HasPrefix(berr.msg, quota.ErrInvalid.Error()) {
			t.Errorf("%s: refusal %q starts with %q", c.name, berr.msg, quota.ErrInvalid.Error())
		}
	}
}

// TestDecodeBodyBound: a body of exactly 64 KiB is read, one byte more is
// refused with 413.
func TestDecodeBodyBound(t *testing.T) {
	const kib64 = 64 << 10
	body := `{"tenant":"acme","class":"read"}`
	for _, c := range []struct {
		size   int
		status int
	}{{kib64, 0}, {kib64 + 1, http.StatusRequestEntityTooLarge}} {
		padded := body + strings.Repeat(" ", c.size-len(body))
		r := httptest.NewRequest(http.MethodPost, "/v1/allow", strings.NewReader(padded))
		req, berr := decode(httptest.NewRecorder(), r)
		switch {
		case c.status == 0 && (berr != nil || req.Tenant != "acme" || req.Class != "read" || req.Cost != nil):
			t.Errorf("body of %d bytes: %+v, %+v; want it read", c.size, req, berr)
		case c.status != 0 && (berr == nil || berr.status != c.status):
			t.Errorf("body of %d bytes: %+v; want %d", c.size, berr, c.status)
		}
	}
}
