package scenarios

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/sluicehq/sluice/sim/scenario"
)

//go:embed *.yaml
var files embed.FS

// Default is the scenario `go run ./sim` runs without flags.
const Default = "steady"

// Names lists the shipped scenarios, sorted.
func Names() []string {
	entries, err := fs.Glob(files, "*.yaml")
	if err != nil {
		panic("scenarios: bad glob: " + err.Error()) // a constant pattern
	}
	var out []string
	for _, e := range entries {
		out = append(out, strings.TrimSuffix(e, ".yaml"))
	}
	sort.Strings(out)
	return out
}

// Source returns a shipped scenario's YAML.
func Source(name string) ([]byte, error) {
	data, err := files.ReadFile(name + ".yaml")
	if err != nil {
		return nil, fmt.Errorf("%w: no shipped scenario %q (have %s)", scenario.ErrInvalid, name, strings.Join(Names(), ", "))
	}
	return data, nil
}

// Load parses a shipped scenario.
func Load(name string) (*scenario.Scenario, error) {
	data, err := Source(name)
	if err != nil {
		return nil, err
	}
	s, err := scenario.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", name, err)
	}
	return s, nil
}
