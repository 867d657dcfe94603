package devcluster

import (
	"bytes"
	"context"
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
