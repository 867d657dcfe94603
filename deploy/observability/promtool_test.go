package observability

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"

	"go.yaml.in/yaml/v3"
)

// alertTestsFile holds the alert unit tests in promtool's format.
const alertTestsFile = "testdata/alerts_test.yaml"

// alertTests is the part of a promtool test file these tests read.
type alertTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name          string `yaml:"name"`
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// TestEveryAlertHasUnitTests: each alert of alerts.yaml has a promtool case
// where it fires and one where it stays silent, so a new alert cannot ship
// without input series that show both.
func TestEveryAlertHasUnitTests(t *testing.T) {
	rf := loadRules(t, readFile(t, alertsFile))
	var at alertTests
	if err := yaml.Unmarshal(readFile(t, alertTestsFile), &at); err != nil {
		t.Fatalf("%s: %v", alertTestsFile, err)
	}
	if len(at.RuleFiles) != 1 || at.RuleFiles[0] != alertsFile {
		t.Fatalf("%s: rule_files %q, want [%s]", alertTestsFile, at.RuleFiles, alertsFile)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range at.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	alerts := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			if !fires[r.Alert] {
				t.Errorf("%s: no case in %s where it fires", r.Alert, alertTestsFile)
			}
			if !silent[r.Alert] {
				t.Errorf("%s: no case in %s where it stays silent", r.Alert, alertTestsFile)
			}
		}
	}
	var unknown []string
	for name := range fires {
		if !alerts[name] {
			unknown = append(unknown, name)
		}
	}
	for name := range silent {
		if !alerts[name] && !fires[name] {
			unknown = append(unknown, name)
		}
	}
	sort.Strings(unknown)
	if len(unknown) > 0 {
		t.Errorf("%s tests alerts that %s does not have: %q", alertTestsFile, alertsFile, unknown)
	}
}

// promtool returns the promtool binary or skips the test.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found: the alert unit tests (" + alertTestsFile + ") need it; " +
			"`make deps` installs it (Debian package prometheus)")
	}
	return p
}

// TestAlertUnitTests runs the promtool unit tests of the alerts on their
// input series. promtool compares annotations too, so it is given a copy of
// alerts.yaml without them: the cases state labels, TestAlertRules holds
// the annotations to the runbook, and TestPromtoolCheckRules checks their
// templates.
func TestAlertUnitTests(t *testing.T) {
	bin := promtool(t)
	dir := t.TempDir()
	stripped, err := withoutAnnotations(readFile(t, alertsFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, alertsFile), stripped, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), readFile(t, alertTestsFile), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "test", "rules", "alerts_test.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules %s: %v\n%s", alertTestsFile, err, out)
	}
}

// TestPromtoolCheckRules: promtool accepts the rule file as shipped,
// annotation templates included.
func TestPromtoolCheckRules(t *testing.T) {
	bin := promtool(t)
	if out, err := exec.Command(bin, "check", "rules", alertsFile).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", alertsFile, err, out)
	}
}

// withoutAnnotations returns the rule file with every rule's annotations
// removed and everything else as it was.
func withoutAnnotations(data []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	var strip func(n *yaml.Node)
	strip = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == "annotations" {
					n.Content = append(n.Content[:i], n.Content[i+2:]...)
					i -= 2
				}
			}
		}
		for _, c := range n.Content {
			strip(c)
		}
	}
	strip(&doc)
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	return out.Bytes(), enc.Close()
}
