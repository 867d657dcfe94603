package scenarios

import (
	"slices"
	"strings"
	"testing"
)

func TestEveryShippedScenarioValidates(t *testing.T) {
	names := Names()
	for _, want := range []string{"steady", "follow-the-sun", "flash-crowd", "instance-crash", "global-failover",
		"region-partition", "redis-outage", "chaos", "region-outage", "region-long-partition", "region-drain"} {
		if !slices.Contains(names, want) {
			t.Errorf("scenario %s is not shipped", want)
		}
	}
	for _, n := range names {
		s, err := Load(n)
		if err != nil {
			t.Errorf("%s: %v", n, err)
			continue
		}
		if s.Name != n {
			t.Errorf("file %s.yaml names itself %q", n, s.Name)
		}
		if s.Description == "" {
			t.Errorf("%s has no description", n)
		}
	}
	if !slices.Contains(names, Default) {
		t.Fatalf("default scenario %s is not shipped", Default)
	}
}

func TestUnknownScenarioNamesTheShippedOnes(t *testing.T) {
	_, err := Load("nope")
	if err == nil {
		t.Fatal("unknown scenario loaded")
	}
	if want := "steady"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not list the shipped scenarios", err)
	}
}
