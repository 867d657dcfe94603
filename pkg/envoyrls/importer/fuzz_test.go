package importer_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls/importer"
)

// FuzzImport: an envoy ratelimit file is either refused (an error wrapping
// ErrInvalid, or the config package's own refusal of the result) or
// imported into a config that validates, survives a round trip through
// YAML, leaves the base as it was, holds the file's domain, and does not
// change when the same file is imported into it again. The seeds are the
// documented shapes and the refused ones in testdata.
func FuzzImport(f *testing.F) {
	for _, pattern := range []string{"testdata/docs/*.y*ml", "testdata/refused/*/*.y*ml"} {
		paths, err := filepath.Glob(pattern)
		if err != nil {
			f.Fatal(err)
		}
		for _, path := range paths {
			data, err := os.ReadFile(path)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := config.Parse([]byte(base))
		if err != nil {
			t.Fatal(err)
		}
		before, err := b.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		file, err := importer.Parse("fuzz.yaml", data)
		if err != nil {
			if !errors.Is(err, importer.ErrInvalid) {
				t.Fatalf("a refused file's error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		res, err := importer.Convert(b, []importer.File{file})
		if after, merr := b.Marshal(); merr != nil || string(after) != string(before) {
			t.Fatalf("Convert changed its base (%v):\n%s\nwas\n%s", merr, after, before)
		}
		if err != nil {
			if !errors.Is(err, importer.ErrInvalid) && !errors.Is(err, config.ErrInvalidConfig) {
				t.Fatalf("a refused import's error wraps neither importer.ErrInvalid nor config.ErrInvalidConfig: %v", err)
			}
			return
		}
		cfg := res.Config
		if err := cfg.Validate(); err != nil {
			t.Fatalf("the imported config does not validate: %v", err)
		}
		if cfg.EnvoyTree(file.Domain) == nil {
			t.Fatalf("the imported config has no tree for domain %q", file.Domain)
		}
		out, err := cfg.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		again, err := config.Parse(out)
		if err != nil {
			t.Fatalf("the imported config does not parse back: %v\n%s", err, out)
		}
		if d := config.Diff(cfg, again); d != "" {
			t.Fatalf("the round trip changed it:\n%s", d)
		}
		twice, err := importer.Convert(cfg, []importer.File{file})
		if err != nil {
			t.Fatalf("importing the same file again: %v", err)
		}
		if d := config.Diff(cfg, twice.Config); d != "" {
			t.Fatalf("importing the same file again changed the config:\n%s", d)
		}
	})
}
