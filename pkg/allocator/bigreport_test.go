package allocator_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/allocator"
)

// learningConfig keeps a new leader learning (re-issuing every grant a
// region holds) for a minute: longer than any report here takes, so every
// key reported with a held grant gets one back.
const learningConfig = `
epoch: 10s
grant_validity: 60s
regions:
  a: {weight: 1}
  b: {weight: 1}
classes:
  write: {}
tiers:
  free: {write: {rate: 100/s, burst: 100}}
default_tier: free
`

// heldReport is region's report of n keys (tenants t0000000...) of which
// every held-th holds a grant below its static share, which a learning
// leader hands back: the others, within their static share, get none.
func heldReport(region string, seq uint64, n, held int) *sluicev1.RegionReport {
	rep := &sluicev1.RegionReport{Region: region, Seq: seq, Keys: make([]*sluicev1.KeyDemand, n)}
	for i := range rep.Keys {
		kd := &sluicev1.KeyDemand{Key: qk(fmt.Sprintf("t%07d", i), "write"), Admitted: 1, WindowMs: 10_000, Holding: 5}
		if i%held == 0 {
			kd.HeldRate, kd.HeldBurst, kd.HeldValidMs = 10, 10, 30_000
		}
		rep.Keys[i] = kd
	}
	return rep
}

// TestReportBeyondTheOldKeyCap: a region reporting more than the old cap
// of 100,000 keys per report (which refused the whole report and left the
// region without grants) through allocator.Client is answered by a real
// leader on real etcd over gRPC: every key holding a grant (one in 50)
// gets it back from the learning leader, in report order, and the leader
// tracks every key. The client sends the report in pages of 100,000 keys.
// make test reports 110,000 keys (two pages, the second one short); with
// SLUICE_SOAK set, 250,000 (three): the allocator's work per key under
// the race detector makes the larger run a minute on a busy machine.
func TestReportBeyondTheOldKeyCap(t *testing.T) {
	const held = 50
	n := 110_000
	if os.Getenv("SLUICE_SOAK") != "" {
		n = 250_000
	}
	srv := etcdtest.Start(t)
	// A session TTL that rides out the pauses a quarter of a million keys
	// cause on a loaded machine.
	r := startReplica(t, srv, allocator.StaticConfig{C: mustConfig(t, learningConfig)}, allocator.DefaultSessionTTL)
	waitFor(t, 10*time.Second, "the replica leads", r.IsLeader)
	c, err := allocator.NewClient([]string{r.GRPCAddr()}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	ans, err := c.Sync(ctx, heldReport("a", 1, n, held))
	if err != nil {
		t.Fatalf("report of %d keys: %v", n, err)
	}
	t.Logf("%d keys reported and answered in %v", n, time.Since(start))
	if !ans.Learning || ans.Seq != 1 || ans.Region != "a" {
		t.Fatalf("answer: region %q seq %d learning %v, want a, 1, true", ans.Region, ans.Seq, ans.Learning)
	}
	if len(ans.Grants) != n/held {
		t.Fatalf("%d grants, want one per key holding one: %d", len(ans.Grants), n/held)
	}
	for i, g := range ans.Grants {
		// The fence may shave a rounding step off a re-issued rate.
		if want := fmt.Sprintf("t%07d", i*held); g.Key.GetTenant() != want || math.Abs(g.Rate-10) > 1e-9 || math.Abs(g.Burst-10) > 1e-9 || g.ValidMs <= 0 {
			t.Fatalf("grants[%d] = %v, want %s/write at rate 10, burst 10", i, g, want)
		}
	}
	if m := scrape(t, r.Daemon); !strings.Contains(m, fmt.Sprintf("sluice_global_keys %d\n", n)) {
		t.Fatalf("the leader does not track the %d keys:\n%s", n, grep(m, "sluice_global_keys"))
	}
}
