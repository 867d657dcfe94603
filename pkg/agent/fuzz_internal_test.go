package agent

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

const fuzzConfig = `
regions: {local: {weight: 1}}
classes: {read: {mode: lease}, write: {mode: strict, shadow: true}}
tiers: {std: {read: {rate: 10/s, burst: 20}, write: {rate: 1/s, burst: 1}}}
tenants: {acme: {tier: std, overrides: {read: {rate: 100/s, burst: 200}}}}
default_tier: std
`

// FuzzAllowRequest: every POST /v1/allow body is either refused with 400
// or 413, a message, a field that is empty or one of the request's, and a
// JSON error body; or it is one JSON object whose fields are named exactly
// tenant, class and cost, each at most once, and it names a valid key of a
// configured class with a cost from 1 to the key's burst, the values the
// body holds. Nothing is decided for a refused body.
func FuzzAllowRequest(f *testing.F) {
	cfg, err := config.Parse([]byte(fuzzConfig))
	if err != nil {
		f.Fatal(err)
	}
	for _, body := range []string{
		`{"tenant":"acme","class":"read"}`, `{"tenant":"acme","class":"read","cost":200}`,
		`{"tenant":"other","class":"write","cost":1}`, `{"tenant":"acme","class":"read","cost":201}`,
		`{"tenant":"a b","class":"read"}`, `{"tenant":"acme","class":"nope"}`, `{"tenant":"acme"}`,
		`{"tenant":"acme","class":"read","cost":1.5}`, `{"tenant":"acme","class":"read","cost":"1"}`,
		`{"tenant":"acme","class":"read","tokens":1}`, `{"tenant":7}`, `[1,2]`, `{} {}`, ``, ` `, `null`,
		`{"tenant":"acme","class":"read","cost":-1}`, `{"tenant":"acme","class":"read","cost":9223372036854775807}`,
		`{"tenant":"acme","class":"read","cost":18446744073709551616}`, `{"Tenant":"acme","CLASS":"read"}`,
		`{"tenant":"acme","class":"read","cost":1.0}`, `{"tenant":"acme","class":"read","cost":2.50e1}`,
		`{"tenant":"acme","class":"read","cost":1.0000000000000000001}`, `{"tenant":"acme","class":"read","cost":-0.0}`,
	} {
		f.Add([]byte(body)) // more seeds in testdata/fuzz/FuzzAllowRequest
	}
	// Valid JSON nested deeper than encoding/json reads.
	deep := strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1)
	f.Add([]byte(`{"tenant":"acme","class":"read","x":` + deep + `}`))
	f.Add([]byte(`{"tenant":"acme","class":` + deep + `}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/allow", strings.NewReader(string(body)))
		req, berr := decode(w, r)
		var key quota.Key
		var cost int64
		var res config.Resolved
		if berr == nil {
			key, cost, res, berr = validate(cfg, req)
		}
		if berr != nil {
			if berr.status != http.StatusBadRequest && berr.status != http.StatusRequestEntityTooLarge {
				t.Fatalf("refused with status %d: %s", berr.status, berr.msg)
			}
			switch berr.field {
			case "", "tenant", "class", "cost":
			default:
				if !strings.Contains(berr.msg, "unknown field") {
					t.Fatalf("refusal names field %q, which the request does not have: %s", berr.field, berr.msg)
				}
			}
			if strings.Contains(berr.msg, "unknown field") && fieldNames[berr.field] {
				t.Fatalf("refusal calls field %q unknown: %s", berr.field, berr.msg)
			}
			if berr.msg == "" {
				t.Fatal("refused without a message")
			}
			out := httptest.NewRecorder()
			writeError(out, berr)
			var e ErrorResponse
			if err := json.Unmarshal(out.Body.Bytes(), &e); err != nil || e.Error != berr.msg || e.Field != berr.field {
				t.Fatalf("error body %q does not carry the refusal (%v)", out.Body.Bytes(), err)
			}
			return
		}
		fields, ok := topFields(body)
		if !ok {
			t.Fatalf("accepted %q, which is not one JSON object of strings, numbers and nulls", body)
		}
		times := map[string]int{}
		for _, f := range fields {
			times[f.name]++
		}
		for _, f := range fields {
			if !fieldNames[f.name] || times[f.name] != 1 {
				t.Fatalf("accepted %q with field %q (%d times)", body, f.name, times[f.name])
			}
			want, got := f.value, any(nil)
			switch f.name {
			case "tenant":
				got = key.Tenant
			case "class":
				got = key.Class
			case "cost":
				got = float64(cost)
			}
			if want != nil && want != got {
				t.Fatalf("accepted %q: %s is %v; the body says %v", body, f.name, got, want)
			}
		}
		if err := key.Validate(); err != nil {
			t.Fatalf("accepted an invalid key %q: %v", key, err)
		}
		if want, err := cfg.Resolve(key); err != nil || want != res {
			t.Fatalf("accepted key %q resolves to %+v, %v; validate said %+v", key, want, err, res)
		}
		if cost < 1 || cost > res.Limit.Burst || cost > quota.MaxCost {
			t.Fatalf("accepted cost %d for a burst of %d", cost, res.Limit.Burst)
		}
	})
}

// fieldNames are AllowRequest's JSON field names.
var fieldNames = map[string]bool{"tenant": true, "class": true, "cost": true}

// field is one field of a JSON object: its name and value (a string, a
// float64 or nil).
type field struct {
	name  string
	value any
}

// topFields lists the fields of body, in order and with repeats, when it
// is one JSON object whose values are strings, numbers or nulls.
func topFields(body []byte) ([]field, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var out []field
	for dec.More() {
		name, err := dec.Token()
		if err != nil {
			return nil, false
		}
		value, err := dec.Token()
		if err != nil {
			return nil, false
		}
		switch value.(type) {
		case string, float64, nil:
		default:
			return nil, false
		}
		out = append(out, field{name.(string), value})
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return out, true
}

// FuzzAllowAnswer: whatever the limiter's decision, the answer keeps the
// package doc's promises: cap within [0, limit], remaining within [0, cap],
// a retry time of at least 1 ms exactly on a denial that a wait cures,
// reset_ms not before it, nothing to wait for on retry_never, allowed
// always in shadow mode, would_deny on every real denial, and never a
// retry or reset time earlier than the limiter's.
func FuzzAllowAnswer(f *testing.F) {
	f.Add(true, false, int64(50), true, int64(10), int64(time.Second), int64(0), false, false, false, int64(100))
	f.Add(false, true, int64(50), true, int64(0), int64(time.Second), int64(20*time.Millisecond), false, false, false, int64(100))
	f.Add(false, true, int64(0), false, int64(0), int64(0), int64(0), true, false, false, int64(5))
	f.Add(false, true, int64(500), true, int64(-3), int64(-time.Second), int64(time.Nanosecond), false, true, true, int64(100))
	f.Add(false, true, int64(1), true, int64(1), int64(1<<62), int64(1<<63-1), false, false, false, int64(1))
	f.Fuzz(func(t *testing.T, allowed, wouldDeny bool, capacity int64, capKnown bool, remaining, resetNS, retryNS int64,
		retryNever, degraded, shadow bool, burst int64) {
		if burst < 1 {
			return // a configured burst is at least 1
		}
		now := time.Unix(1_800_000_000, 0)
		d := quota.Decision{Allowed: allowed, WouldDeny: wouldDeny, Cap: capacity, CapKnown: capKnown,
			Remaining: remaining, RetryAfter: time.Duration(retryNS), RetryNever: retryNever, Degraded: degraded}
		if resetNS != 0 {
			d.ResetAt = now.Add(time.Duration(resetNS))
		}
		res := config.Resolved{Limit: quota.Limit{Rate: 10, Burst: burst}, Shadow: shadow}
		resp, outcome := answer(now, d, res)
		switch {
		case resp.Limit != burst:
			t.Fatalf("limit %d, want the burst %d", resp.Limit, burst)
		case resp.Cap < 0 || resp.Cap > resp.Limit:
			t.Fatalf("cap %d outside [0, %d]", resp.Cap, resp.Limit)
		case resp.Remaining < 0 || resp.Remaining > resp.Cap:
			t.Fatalf("remaining %d outside [0, cap %d]", resp.Remaining, resp.Cap)
		case shadow && !resp.Allowed:
			t.Fatal("a shadow key was refused")
		case !allowed && !resp.WouldDeny:
			t.Fatal("a denial without would_deny")
		case resp.RetryNever && (resp.Allowed || resp.RetryAfterMS != 0 || resp.ResetMS != 0):
			t.Fatalf("retry_never with allowed %v, retry_after_ms %d, reset_ms %d", resp.Allowed, resp.RetryAfterMS, resp.ResetMS)
		case !resp.Allowed && !resp.RetryNever && resp.RetryAfterMS < 1:
			t.Fatalf("a denial a wait cures with retry_after_ms %d", resp.RetryAfterMS)
		case resp.Allowed && resp.RetryAfterMS != 0:
			t.Fatalf("allowed with retry_after_ms %d", resp.RetryAfterMS)
		case resp.ResetMS < 0 || (!resp.Allowed && resp.ResetMS < resp.RetryAfterMS):
			t.Fatalf("reset_ms %d (retry_after_ms %d)", resp.ResetMS, resp.RetryAfterMS)
		}
		// Never an earlier time than the limiter's: whole milliseconds,
		// rounded up.
		ms := func(ns int64) int64 { return ns/1e6 + min(ns%1e6, 1) }
		if !resp.Allowed && !resp.RetryNever && retryNS > 0 && resp.RetryAfterMS < ms(retryNS) {
			t.Fatalf("retry_after_ms %d for a retry after %v", resp.RetryAfterMS, time.Duration(retryNS))
		}
		if !resp.RetryNever && resetNS > 0 && resp.ResetMS < ms(resetNS) {
			t.Fatalf("reset_ms %d for a reset in %v", resp.ResetMS, time.Duration(resetNS))
		}
		want := outcomeOK
		switch {
		case !resp.Allowed:
			want = outcomeOverLimit
		case resp.WouldDeny:
			want = outcomeShadowDenied
		}
		if outcome != want {
			t.Fatalf("outcome %q, want %q", outcome, want)
		}
	})
}
