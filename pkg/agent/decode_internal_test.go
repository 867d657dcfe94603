package agent

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestJSONErrorNamesTheDepthLimit: nesting deeper than encoding/json
// reads is said as such, naming the limit, which is the decoder's own
// (a value at maxJSONDepth decodes, one level more does not); it is not
// called invalid JSON.
func TestJSONErrorNamesTheDepthLimit(t *testing.T) {
	nested := func(depth int) []byte {
		return []byte(strings.Repeat("[", depth) + strings.Repeat("]", depth))
	}
	var v any
	if err := json.Unmarshal(nested(maxJSONDepth), &v); err != nil {
		t.Fatalf("%d levels: %v; want decoded (the limit is not encoding/json's)", maxJSONDepth, err)
	}
	body := nested(maxJSONDepth + 1)
	err := json.Unmarshal(body, &v)
	if err == nil {
		t.Fatalf("%d levels decoded; want the decoder's depth error (the limit is not encoding/json's)", maxJSONDepth+1)
	}
	want := fmt.Sprintf("body nests arrays and objects deeper than %d levels, the most the agent reads (at offset %d)", maxJSONDepth, maxJSONDepth)
	if got := jsonError(body, err); got.msg != want || got.field != "" {
		t.Errorf("jsonError: %q (field %q); want %q", got.msg, got.field, want)
	}
	// A syntax error next to deep nesting is still one.
	bad := []byte(`{"a"[` + strings.Repeat("[", maxJSONDepth+5))
	if got := jsonError(bad, json.Unmarshal(bad, &v)); !strings.Contains(got.msg, "not valid JSON: unexpected byte '[' at offset 4") {
		t.Errorf("jsonError on a syntax error: %q", got.msg)
	}
}
