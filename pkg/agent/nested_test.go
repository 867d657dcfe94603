package agent_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
)

// TestDeeplyNestedValueNamesTheFieldAtFault: a body that is valid JSON but
// nests arrays deeper than the JSON decoder goes (10,000 levels) is
// refused for what is wrong with the request, naming the field that holds
// the nested value, not called invalid JSON at a byte that is not (it was
// "unexpected byte '[' at offset 10035").
func TestDeeplyNestedValueNamesTheFieldAtFault(t *testing.T) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	r, _ := region(t, cfg)
	a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg})
	web := httpClient(t)
	deep := strings.Repeat("[", 30_000) + strings.Repeat("]", 30_000)
	cases := []struct {
		name, body string
		field      string
		says       string
	}{
		{"in an unknown field", `{"tenant":"acme","class":"read","x":` + deep + `}`, "x",
			`unknown field "x" (the fields are tenant, class and cost)`},
		{"in tenant", `{"tenant":` + deep + `,"class":"read"}`, "tenant", "tenant must be a JSON string (got a JSON array)"},
		{"in class", `{"tenant":"acme","class":` + deep + `}`, "class", "class must be a JSON string (got a JSON array)"},
		{"in cost", `{"tenant":"acme","class":"read","cost":` + deep + `}`, "cost",
			"cost must be a whole number of tokens from 1 to 1048576 (got a JSON array)"},
		{"the body itself", deep, "", "body must be a JSON object (got a JSON array)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.body) > agent.MaxBodyBytes {
				t.Fatalf("the body is %d bytes, over the limit: the test would prove nothing", len(tc.body))
			}
			if !json.Valid([]byte(strings.ReplaceAll(tc.body, deep, "[[]]"))) {
				t.Fatalf("the body is not valid JSON: the test would prove nothing")
			}
			code, data := post(t, web, a, tc.body)
			var e agent.ErrorResponse
			if err := json.Unmarshal(data, &e); err != nil {
				t.Fatalf("error answer %q is not JSON: %v", data, err)
			}
			if code != http.StatusBadRequest || e.Field != tc.field || e.Error != tc.says {
				t.Errorf("got %d %+v; want 400, field %q, %q", code, e, tc.field, tc.says)
			}
		})
	}
	if n := a.Client().Table().Len(); n != 0 {
		t.Errorf("refused requests left %d keys in the agent; want 0", n)
	}
}
