package devcluster

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/config"
)

// TestRunDevRefusesARegionNotInTheConfig: bad input is a clear error that
// names the regions there are, and nothing starts or is printed.
func TestRunDevRefusesARegionNotInTheConfig(t *testing.T) {
	var out bytes.Buffer
	err := RunDev(context.Background(), DevOptions{Config: config.Default(), Region: "atlantis", Out: &out})
	if err == nil || !strings.Contains(err.Error(), `"atlantis" is not in the config`) || !strings.Contains(err.Error(), "us-east") {
		t.Fatalf("err = %v", err)
	}
	if out.Len() != 0 {
		t.Fatalf("printed %q", out.String())
	}
}

// TestRunDevRefusesABusyListenAddress: a -listen address in use is a clear
// error naming it, and what had started is stopped (no panic on the way
// out of a failed Start).
func TestRunDevRefusesABusyListenAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var out bytes.Buffer
	err = RunDev(context.Background(), DevOptions{Config: config.Default(), Region: "us-east",
		Listen: ListenAddrs{GRPC: l.Addr().String()}, Out: &out})
	if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), l.Addr().String()) {
		t.Fatalf("err = %v", err)
	}
	if out.Len() != 0 {
		t.Fatalf("printed %q", out.String())
	}
}

// TestEnvoyExamplesCountTrees: the banner's Envoy examples cover the
// envoy.domains trees (as sluicectl import envoy-ratelimit writes them),
// not only the envoy.descriptors mappings; it says there is nothing to
// ask only when the config has neither.
func TestEnvoyExamplesCountTrees(t *testing.T) {
	trees, err := config.Parse([]byte(`
regions: {local: {weight: 1}}
classes: {per_path: {}, per_user: {}}
tiers: {std: {per_path: {rate: 1/s, burst: 1}, per_user: {rate: 1/s, burst: 1}}}
default_tier: std
envoy:
  domains:
    - domain: edge
      descriptors:
        - {key: bot, value: "yes", unlimited: true}
        - key: route
          value: "/api/*/action"
          descriptors:
            - {key: user, class: per_user}
    - domain: other
      descriptors:
        - {key: path, class: per_path}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := envoyExamples(trees, "acme", "per_user", "127.0.0.1:7400")
	for _, want := range []string{
		"(envoy.domains holds 2 descriptor tree(s): edge, other)",
		`'{"domain":"edge","descriptors":[{"entries":[{"key":"route","value":"/api/x/action"},{"key":"user","value":"acme"}]}]}' 127.0.0.1:7400`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("examples lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "maps no Envoy descriptors") {
		t.Errorf("says the config maps nothing although it has trees:\n%s", got)
	}

	got = envoyExamples(config.Default(), "acme", "read", "127.0.0.1:7400")
	if !strings.Contains(got, `{"key":"tenant","value":"acme"}`) || strings.Contains(got, "envoy.domains holds") {
		t.Errorf("the default config's mapping example:\n%s", got)
	}
	none := config.Default()
	none.Envoy = config.Envoy{}
	if got := envoyExamples(none, "acme", "read", "a"); !strings.Contains(got, "maps no Envoy descriptors: see envoy.descriptors and envoy.domains") {
		t.Errorf("no mappings and no trees:\n%s", got)
	}
}
