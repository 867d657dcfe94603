package scenario

import (
	"slices"
	"strings"
	"testing"
)

// TestProblemsNameTheFilesLinesInItsWords: the decoder's problems are
// worded for the person editing the file (no Go type, no "yaml:"), and
// every line number, inside the sluice block too, is the file's.
func TestProblemsNameTheFilesLinesInItsWords(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		{"unknown field in the sluice block", strings.Replace(minimal, "  default_tier: free\n", "  default_tier: free\n  epohc: 2s\n", 1),
			[]string{`unknown field "epohc"`, "(line 9)"}},
		{"sluice block in flow style", strings.Replace(minimal, "  default_tier: free\n", "  default_tier: free\nseed: 3\n", 1) +
			"faults: []\n",
			nil},
		{"unknown top-level field", strings.Replace(minimal, "duration: 2m\n", "duration: 2m\nwarmpu: 10s\n", 1),
			[]string{`unknown field "warmpu" (line 4)`}},
		{"negative seed", strings.Replace(minimal, "duration: 2m\n", "duration: 2m\nseed: -1\n", 1),
			[]string{`"-1" is not a whole number, 0 or more (line 4)`}},
		{"duration too large for a duration", strings.Replace(minimal, "duration: 2m\n", "duration: 9999999999h\n", 1),
			[]string{`duration "9999999999h" is out of range (a run is at most 168h0m0s) (line 3)`}},
		{"duration beyond the longest run", strings.Replace(minimal, "duration: 2m\n", "duration: 100000h\n", 1),
			[]string{"duration: 100000h0m0s is more than the longest run, 168h0m0s"}},
		{"duration of the longest run", strings.Replace(minimal, "duration: 2m\n", "duration: 168h\n", 1), nil},
		{"duration not a duration", strings.Replace(minimal, "duration: 2m\n", "duration: 5 minutes\n", 1),
			[]string{`duration "5 minutes": want a number with a unit, like 5m (line 3)`}},
		{"fault length not a duration, named by its path", minimal + "faults:\n  - {at: 10s, kind: partition, region: a, for: 5 minutes}\n",
			[]string{`faults[0].for: duration "5 minutes": want a number with a unit`, "(line 15)"}},
		{"negative diurnal peak, named by its path", strings.Replace(minimal, "rate: {a: 5/s, b: 600/m}}", "rate: {a: 5/s, b: 600/m}, shape: [{kind: diurnal, period: 1m, peaks: {a: -1s}}]}", 1),
			[]string{`workload[0].shape[0].peaks.a: duration "-1s" must not be negative (line 13)`}},
		{"unknown field, named by its path", strings.Replace(minimal, "{name: a, instances: 1}", "{name: a, instances: 1, weigth: 2}", 1),
			[]string{`topology.regions[0].weigth: unknown field "weigth" (line 10)`}},
		{"sluice field not a duration, named by its path", strings.Replace(minimal, "  default_tier: free\n", "  default_tier: free\n  grant_validity: 5\n", 1),
			[]string{`sluice.grant_validity: duration "5": want a number with a unit`, "(line 9)"}},
		{"negative sluice duration, named by its path", strings.Replace(minimal, "  default_tier: free\n", "  default_tier: free\n  region_lease: -15s\n", 1),
			[]string{`sluice.region_lease: duration "-15s" must be positive`, "(line 9)"}},
		{"sluice rule broken, named by its path and line", strings.Replace(minimal, "b: {weight: 3}", "b: {weight: 0}", 1),
			[]string{`sluice.regions.b.weight: must be a finite number > 0, got 0 (line 5)`}},
		{"sluice rule broken in block style, named by its path and line", strings.Replace(minimal, "  tiers: {free: {read: {rate: 10/s, burst: 20}}}\n", "  tiers:\n    free:\n      read:\n        rate: 10/s\n        burst: -3\n", 1),
			[]string{`sluice.tiers.free.read.burst: `, "(line 11)"}},
		{"sluice field left out, named at the sluice block", strings.Replace(minimal, "  default_tier: free\n", "", 1),
			[]string{`sluice: default_tier: `, "(line 4)"}},
		{"seed out of range, named and said so", strings.Replace(minimal, "duration: 2m\n", "duration: 2m\nseed: 99999999999999999999999\n", 1),
			[]string{`seed: "9999999..." is out of range for this field (line 4)`}},
		{"tab in indentation, on its own line", "name: x\nduration: 2m\n\tseed: 1\n",
			[]string{"found a tab character that violates indentation (line 3)"}},
		{"negative fault time", minimal + "faults:\n  - {at: -10s, kind: etcd-down, for: 5s}\n",
			[]string{`time "-10s" must be after the start of the run`, "(line 15)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.doc))
			if c.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
			for _, leak := range []string{"yaml:", "scenario.", "uint64", "leave the field out", "unmarshal"} {
				if strings.Contains(msg, leak) {
					t.Errorf("error %q says %q", msg, leak)
				}
			}
		})
	}
	// A sluice block written on the key's line (flow style) keeps its lines.
	flow := strings.Replace(minimal, `sluice:
  regions: {a: {weight: 1}, b: {weight: 3}}
  classes: {read: {}}
  tiers: {free: {read: {rate: 10/s, burst: 20}}}
  default_tier: free
`, `sluice: {regions: {a: {weight: 1}, b: {weight: 3}},
  classes: {read: {}}, epohc: 2s,
  tiers: {free: {read: {rate: 10/s, burst: 20}}}, default_tier: free}
`, 1)
	if _, err := Parse([]byte(flow)); err == nil || !strings.Contains(err.Error(), `unknown field "epohc"`) || !strings.Contains(err.Error(), "(line 5)") {
		t.Errorf("flow sluice block: %v", err)
	}
}

// TestEveryProblemOnceNamingItsFieldAndLine: two bad values alike on one
// line are each reported once, naming its own field (both were reported
// twice, naming neither); a problem validation finds is worded as the
// decoder's are: "invalid scenario: <field>: ... (line N)", the line of
// the field, or of the entry it belongs to when the field was left out.
func TestEveryProblemOnceNamingItsFieldAndLine(t *testing.T) {
	doc := strings.Replace(minimal, "  global:", "  latency: {local: 0s, default: 0s}\n  global:", 1)
	_, err := Parse([]byte(doc))
	if err == nil {
		t.Fatal("accepted")
	}
	lines := strings.Split(err.Error(), "\n")
	for _, want := range []string{
		`invalid scenario: topology.latency.local: duration "0s" must be positive (an optional field left out takes its default) (line 11)`,
		`invalid scenario: topology.latency.default: duration "0s" must be positive (an optional field left out takes its default) (line 11)`,
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("error %q lacks the line %q", err, want)
		}
	}
	if len(lines) != 2 {
		t.Errorf("%d problems, want 2: %q", len(lines), err)
	}
	for _, c := range []struct{ doc, want string }{
		{strings.Replace(minimal, "duration: 2m\n", "duration: 2m\nseed: 0\n", 1), "invalid scenario: seed: must be at least 1 (seeds start at 1; leave it out for 1) (line 4)"},
		{strings.Replace(minimal, "{name: a, instances: 1}", "{name: a, instances: 0}", 1), "invalid scenario: topology.regions[0].instances: must be in 1..10000, got 0 (line 10)"},
		// cost left out is 1; the burst 20 is below a cost written
		// on the entry's own line, named by the entry's line.
		{strings.Replace(minimal, "class: read,", "class: read, cost: 21,", 1), "invalid scenario: workload[0].cost: 21 exceeds the burst 20 of acme/read: no request of it can ever be admitted (line 13)"},
		{strings.Replace(minimal, "  - {tenant: acme, class: read, rate: {a: 5/s, b: 600/m}}", "  - tenant: acme\n    class: read", 1), "invalid scenario: workload[0].rate: a tenant needs a rate for at least one region (line 13)"},
	} {
		_, err := Parse([]byte(c.doc))
		if err == nil || !slices.Contains(strings.Split(err.Error(), "\n"), c.want) {
			t.Errorf("got %v, want the line %q", err, c.want)
		}
	}
}
