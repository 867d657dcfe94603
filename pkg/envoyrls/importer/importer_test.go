package importer_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/envoyrls/importer"
	"github.com/sluicehq/sluice/pkg/quota"
)

// base is a small valid Sluice config the imports are merged into: two
// tiers, so every imported class must reach both.
const base = `
regions: {us: {weight: 1}, eu: {weight: 1}}
classes: {read: {}}
tiers:
  free: {read: {rate: 10/s, burst: 10}}
  pro: {read: {rate: 100/s, burst: 100}}
default_tier: free
envoy:
  descriptors:
    - {domain: sluice, tenant_key: tenant, class: read}
`

func mustBase(t *testing.T) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func importDocs(t *testing.T) (importer.Result, []importer.File) {
	t.Helper()
	files, _, err := importer.ReadDir("testdata/docs")
	if err != nil {
		t.Fatal(err)
	}
	res, err := importer.Convert(mustBase(t), files)
	if err != nil {
		t.Fatal(err)
	}
	return res, files
}

// TestImportDocs imports every documented shape, checks the result
// validates, survives a round trip through YAML, keeps the base, and says
// what it dropped.
func TestImportDocs(t *testing.T) {
	res, files := importDocs(t)
	if len(files) != 12 {
		t.Fatalf("read %d files, want the 12 .yaml/.yml ones (README.txt skipped)", len(files))
	}
	cfg := res.Config
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	data, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := config.Parse(data)
	if err != nil {
		t.Fatalf("the imported config does not parse back: %v\n%s", err, data)
	}
	if d := config.Diff(cfg, again); d != "" {
		t.Errorf("round trip changed it:\n%s", d)
	}
	if len(cfg.Envoy.Domains) != 12 || len(cfg.Envoy.Descriptors) != 1 || cfg.Tiers["pro"]["read"].Rate != 100 {
		t.Errorf("domains %d, mappings %d, pro read %v: the base was not kept", len(cfg.Envoy.Domains), len(cfg.Envoy.Descriptors), cfg.Tiers["pro"]["read"])
	}
	want := map[string]config.LimitSpec{
		"messaging.message_type_marketing.to_number": {Rate: config.Rate(5.0 / 86400), Burst: 5},
		"messaging.to_number":                        {Rate: config.Rate(100.0 / 86400), Burst: 100},
		"mongo_cps.database_users":                   {Rate: 500, Burst: 500},
		"rl.foo.baz_shady":                           {Rate: config.Rate(1.0 / 60), Burst: 1},
		"example9.key1_value_":                       {Rate: config.Rate(20.0 / 60), Burst: 20},
		"example9.path__api__":                       {Rate: config.Rate(20.0 / 60), Burst: 20},
		"example10.route.http_method.subject_id":     {Rate: 1, Burst: 60},
		"example11.files_files__":                    {Rate: config.Rate(10.0 / 3600), Burst: 10},
		"paths.path__api___action":                   {Rate: config.Rate(20.0 / 60), Burst: 20},
		"paths.route__api___resource___action":       {Rate: config.Rate(20.0 / 60), Burst: 20},
		"paths.service_api.path__api___action":       {Rate: 3, Burst: 3},
	}
	for class, spec := range want {
		for _, tier := range []string{"free", "pro"} {
			if got, ok := cfg.Tiers[tier][class]; !ok || got != spec {
				t.Errorf("tiers.%s.%s = %v (%v), want %v", tier, class, got, ok, spec)
			}
		}
		if cl := cfg.Classes[class]; cl.Mode != config.ModeLease {
			t.Errorf("class %s: %+v, want the defaults", class, cl)
		}
	}
	notes := strings.Join(res.Notes, "\n")
	for _, n := range []string{"detailed_metric dropped", "example8.yaml", `3_edge_proxy_per_ip.yaml: descriptors[0] (key "remote_address")`, "32 hex digits",
		`example10.yaml: descriptors[0] (key "route"): value_to_metric dropped`,
		`example10.yaml: descriptors[1] (key "user"): metadata dropped`,
		`9_example9.yaml: descriptors[3] (key "path"): every value matching "/api/*"`,
		`example11.yaml: descriptors[1] (key "files_no_share")`,
		`paths.yaml: descriptors[1] (key "route"): value "/api/*/resource/*/action": each * matches any run of bytes`} {
		if !strings.Contains(notes, n) {
			t.Errorf("notes lack %q:\n%s", n, notes)
		}
	}
	// A value that reaches no limit has no bucket, and values sharing a
	// pattern's counter have no bucket of their own: neither is listed
	// as having one.
	for _, n := range []string{`rl.yml: descriptors[1].descriptors[2] (key "bay")`, `rl.yml: descriptors[2] (key "qux")`, `example11.yaml: descriptors[0] (key "files")`} {
		if strings.Contains(notes, n) {
			t.Errorf("notes name %q as having a bucket of its own:\n%s", n, notes)
		}
	}
	// A re-import changes nothing.
	twice, err := importer.Convert(cfg, files)
	if err != nil {
		t.Fatal(err)
	}
	if d := config.Diff(cfg, twice.Config); d != "" {
		t.Errorf("a second import changed the config:\n%s", d)
	}
}

// TestImportRefusals: what has no Sluice equivalent is refused, naming the
// file, the descriptor and why.
func TestImportRefusals(t *testing.T) {
	cases := map[string]string{
		"replaces":              "example7.yaml: descriptors[1].descriptors[0] (key \"user\"): rate_limit.replaces has no Sluice equivalent",
		"blocklist":             "edge.yaml: descriptors[1] (key \"remote_address\"): rate_limit.requests_per_unit 0 (refuse every request) has no Sluice equivalent",
		"unknown_field":         "a.yaml: unknown field rate_limits (line 4)",
		"bad_unit":              `a.yaml: descriptors[0] (key "k"): rate_limit.unit "week": want second, minute, hour or day`,
		"duplicate_domain":      `b.yaml: domain "same" is also the domain of a.yaml`,
		"quota_mode":            `quota.yaml: descriptors[0] (key "user"): quota_mode has no Sluice equivalent: envoyproxy/ratelimit refuses a request over a quota_mode descriptor only when every quota_mode descriptor of the request is over its limit`,
		"share_threshold_exact": `share.yaml: descriptors[0] (key "files"): share_threshold needs a value holding a *`,
	}
	for dir, want := range cases {
		t.Run(dir, func(t *testing.T) {
			files, _, err := importer.ReadDir("testdata/refused/" + dir)
			if err == nil {
				b := mustBase(t)
				before, _ := b.Marshal()
				_, err = importer.Convert(b, files)
				after, _ := b.Marshal()
				if string(before) != string(after) {
					t.Error("a refused import changed the base config")
				}
			}
			if !errors.Is(err, importer.ErrInvalid) || !strings.Contains(err.Error(), want) {
				t.Errorf("got %v\nwant an ErrInvalid saying %q", err, want)
			}
		})
	}
	if _, _, err := importer.ReadDir("testdata"); err == nil || !strings.Contains(err.Error(), "no .yaml or .yml file") {
		t.Errorf("a directory without config files: %v", err)
	}
	// A limit Sluice cannot hold is refused naming the file and the
	// descriptor: envoyproxy/ratelimit takes up to 2^32-1 a unit, a Sluice
	// burst up to 1e9.
	f, err := importer.Parse("big.yaml", []byte("domain: d\ndescriptors: [{key: k, rate_limit: {unit: day, requests_per_unit: 4294967295}}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := importer.Convert(mustBase(t), []importer.File{f}); err == nil ||
		!strings.Contains(err.Error(), `big.yaml: descriptors[0] (key "k"): rate_limit.requests_per_unit 4294967295 is above 1000000000`) {
		t.Errorf("2^32-1 a day: %v", err)
	}
	// A rate Sluice cannot hold is refused by validation, naming the field.
	f, err = importer.Parse("fast.yaml", []byte("domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1000000000}}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := importer.Convert(mustBase(t), []importer.File{f}); err != nil {
		t.Errorf("1e9 per second, the largest burst and rate: %v", err)
	}
	// What the config's rules refuse in a converted tree names the file
	// and the descriptor, not the generated envoy.domains path.
	for dir, want := range map[string]string{
		"duplicate_descriptor": `a.yaml: descriptors[0].descriptors[1]: duplicates descriptors[0].descriptors[0] (key "j", value "v")`,
		"key_with_space":       `a.yaml: descriptors[0].key: "bad key" has a space`,
	} {
		files, _, err := importer.ReadDir("testdata/refused/" + dir)
		if err != nil {
			t.Fatal(err)
		}
		_, err = importer.Convert(mustBase(t), files)
		if !errors.Is(err, config.ErrInvalidConfig) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "envoy.domains[") {
			t.Errorf("%s: got %v\nwant an ErrInvalidConfig saying %q", dir, err, want)
		}
	}
}

// TestImportNotesDigestPrefixes: a prefix holding a byte no plain tenant
// holds is named in a note, since every value under it is limited under a
// digest; a plain prefix is not.
func TestImportNotesDigestPrefixes(t *testing.T) {
	f, err := importer.Parse("paths.yaml", []byte(`domain: d
descriptors:
  - {key: path, value: "/v1/*", rate_limit: {unit: second, requests_per_unit: 5}}
  - {key: user, value: "user-*", rate_limit: {unit: second, requests_per_unit: 5}}
  - {key: addr, value: "2001:db8:*", rate_limit: {unit: second, requests_per_unit: 5}}
`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := importer.Convert(mustBase(t), []importer.File{f})
	if err != nil {
		t.Fatal(err)
	}
	notes := strings.Join(res.Notes, "\n")
	for _, want := range []string{
		`paths.yaml: descriptors[0] (key "path"): every value matching "/v1/*"`,
		`paths.yaml: descriptors[2] (key "addr"): every value matching "2001:db8:*"`,
	} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	if strings.Contains(notes, `matching "user-*"`) {
		t.Errorf("a plain prefix is named as digested:\n%s", notes)
	}
}

// TestImportWildcardsAnywhere: a value with a * before its end is imported
// as envoyproxy/ratelimit's README (Example 9) matches it, each * any run
// of characters: the documented values match, the others do not, an exact
// sibling is weighed first, and share_threshold makes one bucket.
func TestImportWildcardsAnywhere(t *testing.T) {
	res, _ := importDocs(t)
	resolve := func(key, value string) envoyrls.Target {
		t.Helper()
		d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
		targets, err := envoyrls.Resolve(res.Config, &rlsv3.RateLimitRequest{Domain: "paths", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return targets[0]
	}
	for _, c := range []struct{ key, value, class string }{
		{"path", "/api/123/action", "paths.path__api___action"},
		{"path", "/api/user-id/action", "paths.path__api___action"},
		{"path", "/api//action", "paths.path__api___action"},
		{"path", "/api/admin/action", "paths.path__api_admin_action"},
		{"path", "/api/123/other", ""},
		{"path", "/api/action", ""},
		{"route", "/api/v1/resource/123/action", "paths.route__api___resource___action"},
		{"route", "/api/v2/resource/456/action", "paths.route__api___resource___action"},
		{"route", "/api/v1/resource/123", ""},
		{"route", "x/v2/shared", "paths.route___v__shared"},
	} {
		got := resolve(c.key, c.value)
		if c.class == "" {
			if got.Matched {
				t.Errorf("%s=%s: charged to %v; envoyproxy/ratelimit applies no limit", c.key, c.value, got.Key)
			}
			continue
		}
		if !got.Matched || got.Key.Class != c.class {
			t.Errorf("%s=%s: matched %v key %v, want class %s", c.key, c.value, got.Matched, got.Key, c.class)
		}
	}
	if a, b := resolve("path", "/api/1/action"), resolve("path", "/api/2/action"); a.Key == b.Key {
		t.Errorf("two values of a pattern without share_threshold share the bucket %v", a.Key)
	}
	if a, b := resolve("route", "a/v1/shared"), resolve("route", "b/v9/shared"); a.Key != b.Key {
		t.Errorf("two values of a pattern with share_threshold have buckets %v and %v", a.Key, b.Key)
	}
}

// limit is what envoyproxy/ratelimit decides for one descriptor.
type limit struct {
	perUnit   int64
	seconds   float64
	unlimited bool
	shadow    bool
	node      *importer.Descriptor // whose counter
	// counted are the entries as the counter names them: a value matched
	// by a pattern with share_threshold is the pattern.
	counted [][2]string
}

// wildcard is a pattern as envoyproxy/ratelimit's README describes it,
// as a regular expression: each * any run of characters, none too.
func wildcard(pattern string) *regexp.Regexp {
	parts := strings.Split(pattern, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`\A` + strings.Join(parts, `(?s:.*)`) + `\z`)
}

var seconds = map[string]float64{"second": 1, "minute": 60, "hour": 3600, "day": 86400}

// envoyLimit is envoyproxy/ratelimit's lookup as its README describes it:
// per entry, key_value first, then the first value holding * that matches
// the entry's value (each * any run of characters), then the key alone;
// the rate limit of the node the last entry reaches applies; nil when
// there is none.
func envoyLimit(files []importer.File, domain string, entries [][2]string) *limit {
	var level []importer.Descriptor
	for _, f := range files {
		if f.Domain == domain {
			level = f.Descriptors
		}
	}
	var out *limit
	var counted [][2]string
	for i, e := range entries {
		var next *importer.Descriptor
		for j := range level {
			if d := &level[j]; d.Key == e[0] && d.Value == e[1] && d.Value != "" {
				next = d
			}
		}
		for j := range level {
			d := &level[j]
			if next == nil && d.Key == e[0] && strings.Contains(d.Value, "*") && wildcard(d.Value).MatchString(e[1]) {
				next = d
			}
		}
		for j := range level {
			if d := &level[j]; next == nil && d.Key == e[0] && d.Value == "" {
				next = d
			}
		}
		if next == nil {
			return out
		}
		if next.ShareThreshold && strings.Contains(next.Value, "*") {
			e[1] = next.Value
		}
		counted = append(counted, e)
		if rl := next.RateLimit; rl != nil && i == len(entries)-1 {
			out = &limit{unlimited: rl.Unlimited, shadow: next.ShadowMode, node: next, counted: counted}
			if !rl.Unlimited {
				out.perUnit, out.seconds = *rl.RequestsPerUnit, seconds[rl.Unit]
			}
		}
		if len(next.Descriptors) == 0 {
			return out
		}
		level = next.Descriptors
	}
	return out
}

// samples builds descriptors from every path of the files: the configured
// values, other values, values under each prefix, and one entry more and
// less than each path.
func samples(files []importer.File) map[string][][][2]string {
	out := map[string][][][2]string{}
	var walk func(domain string, prefix [][2]string, ds []importer.Descriptor)
	walk = func(domain string, prefix [][2]string, ds []importer.Descriptor) {
		for _, d := range ds {
			values := []string{"other", "v1", "v2"}
			switch {
			case strings.Contains(d.Value, "*"):
				// Each * as nothing, one byte, several, and a piece of the
				// pattern itself; and the pattern as it is.
				values = append(values, d.Value)
				for _, fill := range []string{"", "x", "y/z", "/resource/"} {
					values = append(values, strings.ReplaceAll(d.Value, "*", fill))
				}
				values = append(values, strings.Replace(d.Value, "*", "", 1)+"-")
			case d.Value != "":
				values = append(values, d.Value)
			}
			for _, v := range values {
				path := append(append([][2]string{}, prefix...), [2]string{d.Key, v})
				out[domain] = append(out[domain], path, append(append([][2]string{}, path...), [2]string{"extra", "x"}))
				if len(path) > 1 {
					out[domain] = append(out[domain], path[1:])
				}
				if v == d.Value || v == "v1" || v == "v2" || strings.Contains(d.Value, "*") && wildcard(d.Value).MatchString(v) {
					walk(domain, path, d.Descriptors)
				}
			}
		}
	}
	for _, f := range files {
		walk(f.Domain, nil, f.Descriptors)
		out[f.Domain] = append(out[f.Domain], [][2]string{{"unknown", "x"}})
	}
	return out
}

// TestImportedAnswersAsEnvoyRatelimit compares, for descriptors built from
// every path of the documented shapes, what envoyproxy/ratelimit would
// apply with what the imported config makes Sluice apply: the same rate
// per unit (burst requests_per_unit), the same unlimited and unlimited-by-
// absence answers, the same shadow mode, and the same counters: two
// descriptors share a Sluice bucket exactly when they share a counter.
func TestImportedAnswersAsEnvoyRatelimit(t *testing.T) {
	res, files := importDocs(t)
	cfg := res.Config
	n := 0
	for domain, descs := range samples(files) {
		counters := map[string]quota.Key{} // envoy counter → Sluice key
		keys := map[quota.Key]string{}
		for _, entries := range descs {
			d := &ratelimitv3.RateLimitDescriptor{}
			for _, e := range entries {
				d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e[0], Value: e[1]})
			}
			name := fmt.Sprintf("%s %v", domain, entries)
			targets, err := envoyrls.Resolve(cfg, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			got, want := targets[0], envoyLimit(files, domain, entries)
			n++
			if want == nil || want.unlimited {
				if got.Matched {
					t.Errorf("%s: Sluice charges %v; envoyproxy/ratelimit applies no limit", name, got.Key)
				}
				continue
			}
			if !got.Matched {
				t.Errorf("%s: unmatched in Sluice; envoyproxy/ratelimit applies %d per %vs", name, want.perUnit, want.seconds)
				continue
			}
			wantRate := float64(want.perUnit) / want.seconds
			if got.Resolved.Limit.Rate != wantRate || got.Resolved.Limit.Burst != want.perUnit || got.Shadow != want.shadow {
				t.Errorf("%s: Sluice %+v shadow %v; envoyproxy/ratelimit %d per %vs shadow %v",
					name, got.Resolved.Limit, got.Shadow, want.perUnit, want.seconds, want.shadow)
			}
			// envoyproxy/ratelimit counts per node and full descriptor
			// (a shared pattern standing for the values it matched).
			counter := fmt.Sprintf("%p %v", want.node, want.counted)
			if k, seen := counters[counter]; seen && k != got.Key {
				t.Errorf("%s: one envoy counter, two Sluice keys %v and %v", name, k, got.Key)
			}
			counters[counter] = got.Key
			if c, seen := keys[got.Key]; seen && c != counter {
				t.Errorf("%s: Sluice key %v shared by envoy counters %s and %s", name, got.Key, c, counter)
			}
			keys[got.Key] = counter
		}
	}
	if n < 100 {
		t.Errorf("only %d descriptors compared", n)
	}
}

// importOne converts one file given as YAML into the config base parses to.
func importOne(t *testing.T, base, name, yaml string) (importer.Result, error) {
	t.Helper()
	b, err := config.Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	f, err := importer.Parse(name, []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return importer.Convert(b, []importer.File{f})
}

// countNotes is how many notes hold s.
func countNotes(res importer.Result, s string) int {
	n := 0
	for _, note := range res.Notes {
		if strings.Contains(note, s) {
			n++
		}
	}
	return n
}

// TestImportNotesTheMappingsOfItsDomain: an imported domain that the base
// also maps with envoy.descriptors gets one note, however many mappings it
// has; a domain mapped only elsewhere gets none.
func TestImportNotesTheMappingsOfItsDomain(t *testing.T) {
	const mapped = base + `    - {domain: d, tenant_key: user, class: read}
    - {domain: d, tenant_key: tenant, class: read}
`
	const file = "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 5}}]\n"
	res, err := importOne(t, mapped, "d.yaml", file)
	if err != nil {
		t.Fatal(err)
	}
	if n := countNotes(res, `domain "d" also has an envoy.descriptors mapping (tenant_key "user")`); n != 1 || countNotes(res, "also has an envoy.descriptors mapping") != 1 {
		t.Errorf("two mappings of the domain: %d notes naming the first, want exactly one note:\n%s", n, strings.Join(res.Notes, "\n"))
	}
	// The base maps only the domain "sluice".
	res, err = importOne(t, base, "d.yaml", file)
	if err != nil {
		t.Fatal(err)
	}
	if n := countNotes(res, "envoy.descriptors mapping"); n != 0 {
		t.Errorf("a domain no mapping serves: noted as mapped:\n%s", strings.Join(res.Notes, "\n"))
	}
}

// TestImportRequestsPerUnitRange: requests_per_unit is a uint32 in
// envoyproxy/ratelimit; a count beyond it is refused as out of that range,
// and one within it but above the largest Sluice burst as such, naming
// the file and the descriptor.
func TestImportRequestsPerUnitRange(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{
		{1<<32 - 1, `d.yaml: descriptors[0] (key "k"): rate_limit.requests_per_unit 4294967295 is above 1000000000, the largest burst`},
		{1e9 + 1, "rate_limit.requests_per_unit 1000000001 is above 1000000000"},
		{1 << 32, "rate_limit.requests_per_unit 4294967296: want a whole number in 1..4294967295"},
		{-1, "rate_limit.requests_per_unit -1: want a whole number in 1..4294967295"},
	} {
		_, err := importOne(t, base, "d.yaml", fmt.Sprintf("domain: d\ndescriptors: [{key: k, rate_limit: {unit: day, requests_per_unit: %d}}]\n", c.n))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("requests_per_unit %d: %v, want an error saying %q", c.n, err, c.want)
		}
		if c.n == 1<<32-1 && strings.Contains(err.Error(), "want a whole number") {
			t.Errorf("requests_per_unit %d, within a uint32: %v", c.n, err)
		}
	}
}

// TestReadDirNamesWhatItSkips: envoyproxy/ratelimit loads every file under
// its directory, so each entry ReadDir does not read is named, the
// directory without any file to read too.
func TestReadDirNamesWhatItSkips(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{
		"a.yaml":       "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n",
		"b.conf":       "domain: e\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n",
		".hidden.yaml": "domain: f\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n",
		"sub/c.yaml":   "domain: g\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n",
		"empty/.keep":  "",
	} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files, skipped, err := importer.ReadDir(dir)
	if err != nil || len(files) != 1 || files[0].Name != "a.yaml" {
		t.Fatalf("files %+v, %v: want a.yaml alone", files, err)
	}
	want := []string{
		`.hidden.yaml not read: its name starts with "."`,
		"b.conf not read: not a .yaml or .yml file",
		"empty/ not read: a directory",
		"sub/ not read: a directory",
	}
	if len(skipped) != len(want) {
		t.Fatalf("skipped %q, want %d entries", skipped, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(skipped[i], w) {
			t.Errorf("skipped[%d] = %q, want it to start with %q", i, skipped[i], w)
		}
	}
	// A directory holding only a directory: the error names it.
	top := filepath.Join(t.TempDir(), "runtime")
	if err := os.MkdirAll(filepath.Join(top, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, err := importer.ReadDir(top); err == nil || !strings.Contains(err.Error(), "holds no .yaml or .yml file (config/ not read: a directory") {
		t.Errorf("a directory holding only a directory: %v", err)
	}
}

// TestImportRefusesFractionalRequestsPerUnit: a requests_per_unit that is
// not a whole number is refused as written, naming the file and the
// descriptor, through an alias too; yaml would cut it to a whole number
// (5.5 to 5, 0.5 to 0), where envoyproxy/ratelimit refuses the file.
func TestImportRefusesFractionalRequestsPerUnit(t *testing.T) {
	_, err := importOne(t, base, "d.yaml", `domain: d
descriptors:
  - {key: a, rate_limit: {unit: second, requests_per_unit: 5.5}}
  - {key: b, rate_limit: {unit: second, requests_per_unit: 1e3}}
  - {key: c, rate_limit: &half {unit: second, requests_per_unit: 0.5}}
  - {key: d, rate_limit: *half}
  - {key: e, rate_limit: {unit: second, requests_per_unit: 0x10}}
`)
	for _, want := range []string{
		`d.yaml: descriptors[0] (key "a"): rate_limit.requests_per_unit 5.5: want a whole number`,
		`d.yaml: descriptors[1] (key "b"): rate_limit.requests_per_unit 1e3: want a whole number`,
		`d.yaml: descriptors[2] (key "c"): rate_limit.requests_per_unit 0.5: want a whole number`,
		`d.yaml: descriptors[3] (key "d"): rate_limit.requests_per_unit 0.5: want a whole number`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v\nwant an error saying %q", err, want)
		}
	}
	if err != nil && (strings.Contains(err.Error(), `"e"`) || strings.Contains(err.Error(), "requests_per_unit 0 ")) {
		t.Errorf("a whole number refused, or a fraction reported cut: %v", err)
	}
	// The block is still read strictly.
	if _, err := importer.Parse("d.yaml", []byte("domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 5, bogus: 1}}]\n")); err == nil || !strings.Contains(err.Error(), "unknown field bogus (line 2)") {
		t.Errorf("an unknown field in rate_limit: %v", err)
	}
}

// TestParseRefusesASecondDocument: envoyproxy/ratelimit reads a file's
// first YAML document only; a file holding more is refused naming the
// line of the second, not imported without it. Document markers around
// one document, or an empty one after it, are not a second one.
func TestParseRefusesASecondDocument(t *testing.T) {
	const one = "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 5}}]\n"
	_, err := importer.Parse("d.yaml", []byte(one+"---\ndomain: e\ndescriptors: [{key: b, rate_limit: {unit: second, requests_per_unit: 5}}]\n"))
	if !errors.Is(err, importer.ErrInvalid) || !strings.Contains(err.Error(), "d.yaml: line 4: a second YAML document") {
		t.Errorf("two documents: %v", err)
	}
	for _, data := range []string{one, "---\n" + one + "...\n", one + "---\n", one + "---\n# nothing\n"} {
		if f, err := importer.Parse("d.yaml", []byte(data)); err != nil || f.Domain != "d" {
			t.Errorf("%q: %+v, %v", data, f, err)
		}
	}
}

// TestImportNamesLimitsOfOneNameApart: rate limits given the same name get
// classes of their own, the second and later ones numbered from 2.
func TestImportNamesLimitsOfOneNameApart(t *testing.T) {
	res, err := importOne(t, base, "d.yaml", `domain: d
descriptors:
  - {key: a, rate_limit: {name: api, unit: second, requests_per_unit: 1}}
  - {key: b, rate_limit: {name: api, unit: second, requests_per_unit: 2}}
  - {key: c, rate_limit: {name: api, unit: second, requests_per_unit: 3}}
`)
	if err != nil {
		t.Fatal(err)
	}
	nodes := res.Config.EnvoyTree("d").Descriptors
	for i, want := range []string{"d.api", "d.api.2", "d.api.3"} {
		if got := nodes[i].Class; got != want {
			t.Errorf("descriptors[%d]: class %q, want %q", i, got, want)
		}
		if got := res.Config.Tiers["free"][want].Burst; got != float64(i+1) {
			t.Errorf("class %q: burst %v, want %d", want, got, i+1)
		}
	}
}

// TestReimportNotesOnlyTheClassesItDrops: importing a domain again without
// one of its limits notes that limit's class, and no class still named.
func TestReimportNotesOnlyTheClassesItDrops(t *testing.T) {
	first, err := importOne(t, base, "d.yaml", `domain: d
descriptors:
  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: b, rate_limit: {unit: second, requests_per_unit: 2}}
`)
	if err != nil {
		t.Fatal(err)
	}
	f, err := importer.Parse("d.yaml", []byte("domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1}}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := importer.Convert(first.Config, []importer.File{f})
	if err != nil {
		t.Fatal(err)
	}
	if countNotes(res, `class "d.b" is no longer named`) != 1 || countNotes(res, "is no longer named") != 1 {
		t.Errorf("want one note, of the dropped class d.b:\n%s", strings.Join(res.Notes, "\n"))
	}
}

// TestDigestedPrefixesNamesOnlyPerValuePatterns: only a pattern without
// share_threshold limits each value it matches under its own tenant; an
// exact value and a shared pattern holding the same bytes are not named.
func TestDigestedPrefixesNamesOnlyPerValuePatterns(t *testing.T) {
	cfg, err := config.Parse([]byte(`
regions: {us: {weight: 1}}
classes: {read: {}}
tiers: {free: {read: {rate: 10/s, burst: 10}}}
default_tier: free
envoy:
  domains:
    - domain: d
      descriptors:
        - {key: path, value: "/v1/exact", class: read}
        - {key: path, value: "/v1/shared/*", share_threshold: true, class: read}
        - {key: path, value: "/v1/*", class: read}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := importer.DigestedPrefixes(cfg)
	if len(got) != 1 || !strings.HasPrefix(got[0], `envoy.domains[0].descriptors[2] (key "path"): every value matching "/v1/*"`) {
		t.Errorf("got %q, want only descriptors[2]", got)
	}
}

// TestImportFilesWithoutADomain: each file without a domain is refused for
// that alone; it is not a domain the next such file repeats.
func TestImportFilesWithoutADomain(t *testing.T) {
	var files []importer.File
	for _, name := range []string{"a.yaml", "b.yaml"} {
		f, err := importer.Parse(name, []byte("descriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	_, err := importer.Convert(mustBase(t), files)
	if err == nil || !strings.Contains(err.Error(), "a.yaml: domain: is required") || !strings.Contains(err.Error(), "b.yaml: domain: is required") ||
		strings.Contains(err.Error(), "also the domain of") {
		t.Errorf("got %v, want each file refused for its missing domain, and nothing else", err)
	}
}

// TestImportClassNamesKeepLettersAndDigits: every letter and digit of a
// descriptor's path stays in its class name, at both ends of each range.
func TestImportClassNamesKeepLettersAndDigits(t *testing.T) {
	res, err := importOne(t, base, "d.yaml", "domain: d\ndescriptors: [{key: Zz, value: Aa09, rate_limit: {unit: second, requests_per_unit: 1}}]\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Config.EnvoyTree("d").Descriptors[0].Class; got != "d.Zz_Aa09" {
		t.Errorf("class %q, want d.Zz_Aa09", got)
	}
}
