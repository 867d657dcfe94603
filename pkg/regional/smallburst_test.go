package regional_test

import (
	"context"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
)

// TestSampleConfigExportIsUsable: the sample config's free `export` (6/m,
// burst 1, strict, regions weighted 2:1:1) used to give each region a
// static burst cap of 0.5/0.25/0.25 tokens, so no region ever admitted a
// request of cost 1. The burst now lives in whole tokens in one region,
// which admits one request from a fresh bucket.
func TestSampleConfigExportIsUsable(t *testing.T) {
	cfg, err := config.Parse(config.SampleYAML())
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for _, region := range []string{"us-east", "eu-west", "ap-south"} {
		reg := regiontest.Start(t, cfg, region)
		client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
		resp, err := client.Check(context.Background(), &sluicev1.CheckRequest{Key: qk("newcomer", "export"), Cost: 1})
		if err != nil {
			t.Fatalf("%s: check: %v", region, err)
		}
		if resp.GetAllowed() {
			admitted++
		}
	}
	if admitted != 1 {
		t.Fatalf("%d regions admitted the first export request of cost 1 on a key with burst 1, want exactly 1", admitted)
	}
}
