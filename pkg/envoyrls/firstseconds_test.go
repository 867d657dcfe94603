package envoyrls_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
)

// hotKeyConfig: one region, so the region's share is the whole limit; one
// key of 1000/s with a burst of 1000.
const hotKeyConfig = `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}}
classes:
  write: {mode: lease}
tiers:
  std: {write: {rate: 1000/s, burst: 1000}}
default_tier: std
envoy:
  descriptors:
    - {domain: sluice, tenant_key: tenant, class_key: class}
`

// TestHotKeyDeliversTheLimitFromTheStart: three Envoy clients each offer
// 1000 requests/s of one key limited to 1000/s, burst 1000, to one
// regional process's Service (called in process: the gRPC hop from Envoy
// decides nothing, and on a loaded machine it would limit what the
// clients can offer) for 5 s. An ideal central bucket admits b + r·t of it
// (everything offered until the burst is gone, then r); the process
// admits at most that (everything it leased out, spent or still held,
// counted) and falls short of it by at most 0.5% (under SLUICE_SOAK, see
// below): the burst is usable from the first request on, as the process
// reports its spending early while it holds the region's bucket at its
// cap (pkg/lease capHeldWater). t is Redis time, from before the first
// request to after the last answer.
func TestHotKeyDeliversTheLimitFromTheStart(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, hotKeyConfig)
	p := startProcess(t, rs, cfg, "envoy-hot", true)
	rdb := rs.Client()
	redisNow := func() time.Time {
		now, err := rdb.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now
	}

	const r, b = 1000.0, 1000.0
	const clients, perClient = 3, 1000.0 // offered: 3 × 1000/s
	const run = 5 * time.Second
	req := request("sluice", 0, desc("tenant", "acme", "class", "write"))
	var ok, over, sent atomic.Int64
	var firstSecond atomic.Int64 // admitted within the first second
	var wg sync.WaitGroup
	start := redisNow()
	wallStart := time.Now()
	for range clients {
		// Open loop, as Envoy's calls are: request i of a client is due
		// at i/perClient s and goes out then, whatever the earlier ones
		// are waiting for (a pool of callers per client).
		due := make(chan struct{}, 1<<14)
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range due {
					resp, err := p.svc.ShouldRateLimit(context.Background(), req)
					if err != nil {
						t.Errorf("ShouldRateLimit: %v", err)
						return
					}
					switch resp.GetOverallCode() {
					case rlsv3.RateLimitResponse_OK:
						ok.Add(1)
						if time.Since(wallStart) < time.Second {
							firstSecond.Add(1)
						}
					case rlsv3.RateLimitResponse_OVER_LIMIT:
						over.Add(1)
					default:
						t.Errorf("overall code %v", resp.GetOverallCode())
						return
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(due)
			for i := 0; ; i++ {
				at := wallStart.Add(time.Duration(float64(i) / perClient * float64(time.Second)))
				if at.Sub(wallStart) >= run || time.Since(wallStart) >= run {
					return
				}
				if d := time.Until(at); d > 0 {
					time.Sleep(d) // pacing the offered load
				}
				sent.Add(1)
				due <- struct{}{}
			}
		}()
	}
	wg.Wait()
	// Tokens the process still holds were debited from the bucket: the
	// upper check is on everything the region gave out.
	held := p.lim.Client().Table().HeldTokens()
	elapsed := redisNow().Sub(start).Seconds()
	ideal := b + r*elapsed
	got := float64(ok.Load())
	short := 1 - got/ideal
	t.Logf("offered %d in %.2fs of Redis time: OK %d (%d in the first second), OVER_LIMIT %d, %d held at the end; b + r·t = %.0f: admitted %.2f%% of ideal (%.2f%% short, %.0f tokens)",
		sent.Load(), elapsed, ok.Load(), firstSecond.Load(), over.Load(), held, ideal, 100*got/ideal, 100*short, ideal-got)
	if got+float64(held) > ideal {
		t.Fatalf("over-admission: admitted %.0f + held %d > b + r·t = %.0f", got, held, ideal)
	}
	if offered := float64(sent.Load()); offered < ideal {
		t.Skipf("the machine offered only %.0f requests, less than b + r·t = %.0f: nothing to measure", offered, ideal)
	}
	// The shortfall is a timing figure: held to the goal of 0.5% under
	// SLUICE_SOAK, where the run has the machine to itself (0.15-0.17% in
	// BENCHMARKS.md, of which the few ms between the last request and the
	// last clock reading, counted in t, are about 0.1%). In make test,
	// beside everything else on the machine, one starved owner loop or a
	// slow first round trip (the bucket sits at its cap until the first
	// batch) costs percents; there only liveness is checked, and
	// pkg/lease TestReportsSpendingThatHoldsTheRegionAtItsCap and
	// TestCapHeldCrossingWaitsTheShorterSpacing check the mechanism exactly.
	if os.Getenv("SLUICE_SOAK") == "" {
		if got < ideal/2 {
			t.Errorf("admitted %.0f < (b + r·t)/2 = %.0f: the key was not served", got, ideal/2)
		}
		return
	}
	if short > 0.005 {
		t.Errorf("admitted %.0f of b + r·t = %.0f: %.2f%% short, want <= 0.5%%", got, ideal, 100*short)
	}
}
