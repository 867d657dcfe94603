package regional_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestRedisCluster runs the regional daemon on a real three-node Redis
// Cluster: every script touches keys of one hash tag (one slot), and a
// Sync pipelines keys that live on different nodes.
func TestRedisCluster(t *testing.T) {
	addrs := redistest.StartCluster(t, 3)
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: strings.Join(addrs, ","),
		Config: regional.StaticConfig{C: regiontest.MustConfig(t, oneRegion)}, ColdStart: regional.ColdStartFull,
		Unleased: true, // no global tier: static shares unconditional
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	reg := &regiontest.Region{Addr: d.GRPCAddr()}
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()

	var reports []*sluicev1.KeyReport
	for i := range 30 { // 30 tenants spread over the 16384 slots, so over all three nodes
		reports = append(reports, &sluicev1.KeyReport{Key: qk(fmt.Sprintf("tenant-%d", i), "read"), Seq: 1, Want: 7})
	}
	resp, err := client.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "i1", Reports: reports})
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range resp.Grants {
		if g.Granted != 7 {
			t.Fatalf("key %d: granted %d, want 7", i, g.Granted)
		}
	}
	for i := range 30 {
		c, err := client.Check(ctx, &sluicev1.CheckRequest{Key: qk(fmt.Sprintf("tenant-%d", i), "export"), Cost: 1})
		if err != nil || !c.Allowed {
			t.Fatalf("check %d: %v %v", i, c, err)
		}
	}
	// The keys really are spread: every node holds some.
	for _, a := range addrs {
		n := redistest.KeyCount(t, a)
		if n == 0 {
			t.Errorf("node %s holds no key: the test did not exercise the cluster", a)
		}
	}
}
