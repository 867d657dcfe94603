package allocator_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/allocator"
)

// twoRegionsLarge is twoRegions with a limit large enough that a shortfall
// is more than a 100 ms demand reading's noise (hierarchy's
// pendingShortfall rule).
const twoRegionsLarge = `
epoch: 100ms
grant_validity: 500ms
regions:
  a: {weight: 1}
  b: {weight: 1}
classes:
  write: {}
tiers:
  free: {write: {rate: 10000/s, burst: 10000}}
default_tier: free
`

// TestWatchNudgesDonorAndRecipient: two regions follow the region contract
// over gRPC while each keeps a Watch stream open through allocator.Client.
// The heavy region's short answers nudge the light one (the donor), whose
// acknowledgement nudges the heavy one back; both nudges arrive on the
// streams and are counted.
func TestWatchNudgesDonorAndRecipient(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, allocator.StaticConfig{C: mustConfig(t, twoRegionsLarge)}, testTTL)
	waitFor(t, 10*time.Second, "the replica leads", r.IsLeader)

	gc, err := allocator.NewClient([]string{r.GRPCAddr()}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	var mu sync.Mutex
	nudged := map[string]int{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, region := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gc.Watch(ctx, region, testEpoch, func() {
				mu.Lock()
				nudged[region]++
				mu.Unlock()
			})
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	// A busy machine may cost the replica its 1 s session now and then:
	// every wait below is in session TTLs, and a Sync refused while it
	// campaigns again is retried at the next epoch.
	waitFor(t, 30*testTTL, "both streams open", func() bool {
		return strings.Contains(scrape(t, r.Daemon), "sluice_global_watch_streams 2")
	})

	heavy := &regionSim{name: "a", perSec: 100_000, holding: func(heldGrant, float64) float64 { return 0 }}
	light := &regionSim{name: "b", perSec: 100, holding: func(h heldGrant, static float64) float64 { return max(h.burst, static) }}
	count := func(region string) int {
		mu.Lock()
		defer mu.Unlock()
		return nudged[region]
	}
	ticker := time.NewTicker(testEpoch)
	defer ticker.Stop()
	// Learning lasts one validity; the shift then takes a few epochs.
	deadline := time.Now().Add(60 * testTTL)
	for count("a") == 0 || count("b") == 0 {
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("nudges %v, want both regions nudged", nudged)
		}
		for _, sim := range []*regionSim{heavy, light} {
			sent := time.Now()
			resp, err := r.api.Sync(rpcCtx(t), sim.report(sent))
			if _, notLeader := allocator.NotLeaderAddr(err); notLeader {
				continue
			}
			if err != nil {
				t.Fatalf("Sync from %s: %v", sim.name, err)
			}
			for _, g := range resp.Grants {
				sim.held = heldGrant{rate: g.Rate, burst: g.Burst, until: sent.Add(time.Duration(g.ValidMs) * time.Millisecond)}
			}
		}
		<-ticker.C
	}
	m := scrape(t, r.Daemon)
	for _, want := range []string{`sluice_global_nudges_total{region="a"}`, `sluice_global_nudges_total{region="b"}`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, grep(m, "nudges"))
		}
	}
}

// TestWatchRefusals: an unknown region is refused with InvalidArgument, a
// replica that does not lead redirects like Sync.
func TestWatchRefusals(t *testing.T) {
	srv := etcdtest.Start(t)
	src := allocator.StaticConfig{C: mustConfig(t, twoRegions)}
	leader := startReplica(t, srv, src, testTTL)
	waitFor(t, 10*time.Second, "the first replica leads", leader.IsLeader)
	standby := startReplica(t, srv, src, testTTL)

	recvErr := func(api sluicev1.AllocatorServiceClient, region string) error {
		stream, err := api.Watch(rpcCtx(t), &sluicev1.WatchRequest{Region: region})
		if err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	if err := recvErr(leader.api, "nowhere"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"nowhere"`) {
		t.Fatalf("watch of an unknown region: %v, want InvalidArgument naming it", err)
	}
	waitFor(t, 10*time.Second, "the standby knows the leader", func() bool {
		addr, ok := allocator.NotLeaderAddr(recvErr(standby.api, "a"))
		return ok && addr == leader.GRPCAddr()
	})
}
