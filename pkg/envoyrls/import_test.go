package envoyrls_test

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/envoyrls/importer"
)

// TestImportedConfigDecidesAsEnvoyRatelimit imports the documented
// envoyproxy/ratelimit shapes into a one-region config and sends Envoy's
// descriptors to a real region: each per-minute limit of n admits n and
// refuses the next, a wildcard anywhere in a value limits each value it
// matches (all of them together with share_threshold), shadow_mode
// answers OK past its limit, unlimited and limit-less descriptors are
// always OK.
func TestImportedConfigDecidesAsEnvoyRatelimit(t *testing.T) {
	files, _, err := importer.ReadDir("importer/testdata/docs")
	if err != nil {
		t.Fatal(err)
	}
	res, err := importer.Convert(regiontest.MustConfig(t, `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}}
classes: {read: {}}
tiers: {std: {read: {rate: 10/s, burst: 10}}}
default_tier: std
`), files)
	if err != nil {
		t.Fatal(err)
	}
	rs := redistest.Start(t)
	p := startProcess(t, rs, res.Config, "envoy-import", true)

	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	cases := []struct {
		name    string
		domain  string
		entries []string
		answers []rlsv3.RateLimitResponse_Code
	}{
		{"1/minute, nested exact values", "rl", []string{"source_cluster", "proxy", "destination_cluster", "mock"}, []rlsv3.RateLimitResponse_Code{ok, over, over}},
		{"2/minute, any value", "rl", []string{"foo", "f1"}, []rlsv3.RateLimitResponse_Code{ok, ok, over}},
		{"another value, its own counter", "rl", []string{"foo", "f2"}, []rlsv3.RateLimitResponse_Code{ok, ok, over}},
		{"3/minute, nested any value", "rl", []string{"foo", "f1", "bar", "b"}, []rlsv3.RateLimitResponse_Code{ok, ok, ok, over}},
		{"shadow_mode past 1/minute", "rl", []string{"foo", "f1", "baz", "shady"}, []rlsv3.RateLimitResponse_Code{ok, ok, ok}},
		{"unlimited", "rl", []string{"foo", "f1", "bay", "x"}, []rlsv3.RateLimitResponse_Code{ok, ok, ok}},
		{"no limit, wins over any value", "rl", []string{"foo", "f1", "baz", "trusted"}, []rlsv3.RateLimitResponse_Code{ok, ok, ok}},
		{"top-level unlimited", "rl", []string{"qux", "q"}, []rlsv3.RateLimitResponse_Code{ok, ok, ok}},
		{"1/minute for one address", "edge_proxy_per_ip", []string{"remote_address", "50.0.0.5"}, []rlsv3.RateLimitResponse_Code{ok, over}},
		{"prefix, 20/minute", "example9", []string{"key1", "value7"}, append(repeat(ok, 20), over)},
		{"depth does not match", "example4", []string{"key", "value"}, []rlsv3.RateLimitResponse_Code{ok, ok}},
		{"a prefix of a path, 20/minute", "example9", []string{"path", "/api/v2/action"}, append(repeat(ok, 20), over)},
		{"a prefix, another value, its own counter", "example9", []string{"path", "/api/user-id/action"}, append(repeat(ok, 20), over)},
		{"not the prefix: no limit", "example9", []string{"path", "/other/v2/action"}, repeat(ok, 21)},
		{"share_threshold, 10/hour: 5 on one value", "example11", []string{"files", "files/a.pdf"}, repeat(ok, 5)},
		{"share_threshold: 5 on another", "example11", []string{"files", "files/b.csv"}, repeat(ok, 5)},
		{"share_threshold: a third value is over the shared limit", "example11", []string{"files", "files/c.txt"}, []rlsv3.RateLimitResponse_Code{over}},
		{"without share_threshold, 10/hour", "example11", []string{"files_no_share", "files_no_share/a.pdf"}, append(repeat(ok, 10), over)},
		{"without share_threshold, another value, its own counter", "example11", []string{"files_no_share", "files_no_share/b.csv"}, repeat(ok, 10)},
	}
	for _, c := range cases {
		for i, want := range c.answers {
			resp := ask(t, p.rls, request(c.domain, 0, desc(c.entries...)))
			if resp.GetOverallCode() != want {
				t.Fatalf("%s: request %d: %v, want %v", c.name, i+1, resp, want)
			}
		}
	}
	// Envoy's route with two rate_limits sends both descriptors: the one
	// over its limit decides.
	resp := ask(t, p.rls, request("rl", 0, desc("foo", "f3"), desc("foo", "f1", "bar", "b")))
	if resp.GetOverallCode() != over || resp.GetStatuses()[0].GetCode() != ok || resp.GetStatuses()[1].GetCode() != over {
		t.Fatalf("two descriptors, the second over its limit: %v", resp)
	}
}

func repeat(c rlsv3.RateLimitResponse_Code, n int) []rlsv3.RateLimitResponse_Code {
	out := make([]rlsv3.RateLimitResponse_Code, n)
	for i := range out {
		out[i] = c
	}
	return out
}
