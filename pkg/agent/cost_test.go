package agent_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestCostIsAnyWholeNumber: a cost is a JSON number whose value is a whole
// number, however it is written (1.0, as Python's json writes a float, or
// with an exponent), and that many tokens are spent; a number with a
// fractional part, however small, one below 1 or above the maximum, and a
// value of another JSON kind are refused, naming the cost.
func TestCostIsAnyWholeNumber(t *testing.T) {
	cfg := regiontest.MustConfig(t, quietConfig)
	r, _ := region(t, cfg)
	a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg})
	web := httpClient(t)
	key := quota.Key{Tenant: "acme", Class: "read"}
	body := func(cost string) string { return `{"tenant":"acme","class":"read","cost":` + cost + `}` }

	for _, tc := range []struct {
		cost string
		want int64
	}{
		{"1", 1}, {"1.0", 1}, {"1.000", 1}, {"1e3", 1000}, {"1E+3", 1000}, {"2.50e1", 25}, {"1.5e3", 1500},
		{"0.5e1", 5}, {"100e-2", 1}, {"0.0001e4", 1}, {"null", 1},
	} {
		before, _ := a.Client().Table().State(key)
		out := allow(t, web, a, body(tc.cost))
		after, _ := a.Client().Table().State(key)
		if !out.Allowed {
			t.Errorf("cost %s: %+v; want allowed", tc.cost, out)
		}
		if spent := after.Spent - before.Spent; spent != tc.want {
			t.Errorf("cost %s spent %d tokens; want %d", tc.cost, spent, tc.want)
		}
	}

	for _, tc := range []struct{ cost, says string }{
		{"1.5", "cost must be a whole number of tokens from 1 to 1048576 (got 1.5)"},
		{"1.0000000000000000001", "cost must be a whole number of tokens from 1 to 1048576 (got 1.0000000000000000001)"},
		{"1e-400", "cost must be a whole number of tokens from 1 to 1048576 (got 1e-400)"},
		{"25e-1", "cost must be a whole number of tokens from 1 to 1048576 (got 25e-1)"},
		{"0", "cost 0 must be at least 1"},
		{"0.0", "cost 0.0 must be at least 1"},
		{"-0.0e0", "cost -0.0e0 must be at least 1"},
		{"-1.0", "cost -1.0 must be at least 1"},
		{"-3", "cost -3 must be at least 1"},
		{"-1e30", "cost -1e30 must be at least 1"},
		// Read as 1048576, the maximum cost, which the burst is below.
		{"1048576.0", `cost 1048576 exceeds the burst 1000000 of tenant "acme", class "read", so it can never be admitted`},
		{"1048577", "cost 1048577 exceeds the maximum 1048576"},
		{"1048577.0", "cost 1048577.0 exceeds the maximum 1048576"},
		{"2e6", "cost 2e6 exceeds the maximum 1048576"},
		{"1e400", "cost 1e400 exceeds the maximum 1048576"},
		{"1e99999999999999999999", "cost 1e99999999999999999999 exceeds the maximum 1048576"},
		{"18446744073709551616", "cost 18446744073709551616 exceeds the maximum 1048576"},
		{`"1"`, "cost must be a whole number of tokens from 1 to 1048576 (got a JSON string)"},
		{`"1.0"`, "cost must be a whole number of tokens from 1 to 1048576 (got a JSON string)"},
		{"true", "cost must be a whole number of tokens from 1 to 1048576 (got a JSON bool)"},
		{"[1]", "cost must be a whole number of tokens from 1 to 1048576 (got a JSON array)"},
		{`{"n":1}`, "cost must be a whole number of tokens from 1 to 1048576 (got a JSON object)"},
	} {
		code, data := post(t, web, a, body(tc.cost))
		var e agent.ErrorResponse
		if err := json.Unmarshal(data, &e); err != nil {
			t.Fatalf("cost %s: error answer %q is not JSON: %v", tc.cost, data, err)
		}
		if code != http.StatusBadRequest || e.Field != "cost" || e.Error != tc.says {
			t.Errorf("cost %s: got %d %+v; want 400, field cost, %q", tc.cost, code, e, tc.says)
		}
	}
}
