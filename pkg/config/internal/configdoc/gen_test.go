package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/config"
)

const (
	configDir = "../.."                      // package config
	reference = "../../../../docs/config.md" // what go generate writes
)

// TestReferenceIsCurrent regenerates docs/config.md and compares: a schema
// or comment change without go generate fails here.
func TestReferenceIsCurrent(t *testing.T) {
	got, err := Generate(configDir)
	if err != nil {
		t.Fatalf("the config schema is not fully documented:\n%v", err)
	}
	want, err := os.ReadFile(reference)
	if err != nil {
		t.Fatalf("%v (run: go generate ./pkg/config)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("docs/config.md is stale: run go generate ./pkg/config (first difference at line %d)", firstDiffLine(got, want))
	}
}

func firstDiffLine(a, b []byte) int {
	al, bl := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}

// TestEveryFieldIsDocumented lists the schema's fields by reflection,
// independently of the generator's walk of the AST, and checks that the
// reference has an entry for each.
func TestEveryFieldIsDocumented(t *testing.T) {
	s, err := load(configDir)
	if err != nil {
		t.Fatal(err)
	}
	w := walker{s: s}
	w.walkStruct("Config", "", nil)
	if len(w.errs) > 0 {
		t.Fatalf("%v", w.errs)
	}
	documented := map[string]bool{}
	for _, f := range w.fields {
		documented[f.goName] = true
	}
	want := map[string]bool{}
	reflectFields(reflect.TypeFor[config.Config](), want)
	for name := range want {
		if !documented[name] {
			t.Errorf("%s has no entry in the reference", name)
		}
	}
	for name := range documented {
		if !want[name] {
			t.Errorf("the reference documents %s, which the schema does not have", name)
		}
	}
	for _, name := range []string{"Config.RegionLease", "Class.PartitionShare", "Region.Drained"} {
		if !documented[name] {
			t.Errorf("%s is not in the reference", name)
		}
	}
}

// reflectFields adds Type.Field for every YAML field reachable from t.
func reflectFields(t reflect.Type, out map[string]bool) {
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Map:
		reflectFields(t.Elem(), out)
		return
	case reflect.Struct:
	default:
		return
	}
	for f := range t.Fields() {
		if !f.IsExported() || f.Tag.Get("yaml") == "-" {
			continue
		}
		name := t.Name() + "." + f.Name
		if out[name] {
			continue
		}
		out[name] = true
		reflectFields(f.Type, out)
	}
}

// TestExamplesParse decodes every field's example, as the reference shows
// it, strictly into a Config: a misspelt path or a value of the wrong type
// fails.
func TestExamplesParse(t *testing.T) {
	s, err := load(configDir)
	if err != nil {
		t.Fatal(err)
	}
	w := walker{s: s}
	w.walkStruct("Config", "", nil)
	n := 0
	for _, f := range w.fields {
		if f.example == "" {
			continue
		}
		n++
		doc := exampleYAML(f.exampleCtx, f.example)
		dec := yaml.NewDecoder(strings.NewReader(doc))
		dec.KnownFields(true)
		var c config.Config
		if err := dec.Decode(&c); err != nil {
			t.Errorf("%s: example does not decode: %v\n%s", f.path, err, doc)
		}
	}
	if n == 0 {
		t.Fatal("no examples")
	}
}

// TestIncompleteDocumentationFails runs the generator on copies of the
// package with one field's documentation damaged.
func TestIncompleteDocumentationFails(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(configDir, "config.go"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, old, new, want string
	}{
		{
			name: "new field without a comment",
			old:  "\tEnvoy Envoy `yaml:\"envoy,omitempty\"`\n",
			new:  "\tEnvoy Envoy `yaml:\"envoy,omitempty\"`\n\tSpare int64 `yaml:\"spare,omitempty\"`\n",
			want: "spare (Config.Spare): no description",
		},
		{
			name: "no default statement",
			old:  "\t//   - Default: 1s\n\t//   - Rule: at least 10ms, at most 24h\n",
			new:  "\t//   - Rule: at least 10ms, at most 24h\n",
			want: "epoch (Config.Epoch): says neither Required nor Default",
		},
		{
			name: "no unit on a bare number",
			old:  "\t//   - Unit: relative weight (only ratios between regions matter)\n",
			new:  "",
			want: "regions.<region>.weight (Region.Weight): a bare number needs a Unit item",
		},
		{
			name: "no example",
			old:  "\t//   - Example: 0.25\n",
			new:  "",
			want: "classes.<class>.partition_share (Class.PartitionShare): no Example item",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !bytes.Contains(src, []byte(c.old)) {
				t.Fatalf("config.go no longer contains %q; update the test", c.old)
			}
			dir := t.TempDir()
			copyPackage(t, dir)
			damaged := bytes.Replace(src, []byte(c.old), []byte(c.new), 1)
			if err := os.WriteFile(filepath.Join(dir, "config.go"), damaged, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Generate(dir)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Generate: got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func copyPackage(t *testing.T, dir string) {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(configDir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	names = append(names, filepath.Join(configDir, "sample.yaml"))
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(name)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
