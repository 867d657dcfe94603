package lease_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestDegradedModeAfterTheLeaseSpentTheBurstFindsNoFullBucket: an
// instance spends a key's whole burst through its lease, then its region
// stops answering. Its on_failure policy (local: the region's rate and
// burst over the one live instance, 1/s and 100) counts what the lease
// admitted, so the instance's admissions, leased and degraded, stay
// within b + r·t over the run; a local bucket that ignored the lease
// admitted a second burst at the switch. (A real regional server and
// Redis; the region is cut off by a fault-injecting connection.)
func TestDegradedModeAfterTheLeaseSpentTheBurstFindsNoFullBucket(t *testing.T) {
	e := startRegion(t)
	ctx := context.Background()
	const r, b = 1.0, 100.0 // acme read on the only region
	conn := newRegionConn(t, e.reg.Server)
	reg := prometheus.NewRegistry()
	c, err := lease.NewClient(conn, lease.Options{
		InstanceID: "switch", Refresh: 200 * time.Millisecond,
		BreakerTimeout: 2 * time.Second, SyncTimeout: 2 * time.Second, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	start := time.Now()
	var leased, degraded int64
	allow := func() quota.Decision {
		d, err := c.Allow(ctx, acmeRead, 1)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case d.Allowed && d.Degraded:
			degraded++
		case d.Allowed:
			leased++
		}
		return d
	}
	for allow().Allowed {
	}
	if leased < b {
		t.Fatalf("the lease admitted %d before its first denial, want the burst %v", leased, b)
	}
	conn.setFault("*", unreachable)
	// Once the region's named wait is over, the instance asks again, finds
	// it unreachable and decides with the local policy, until it denies.
	waitFor(t, "a degraded denial", func() bool {
		for {
			d := allow()
			if !d.Allowed || !d.Degraded {
				return d.Degraded && !d.Allowed
			}
		}
	})
	elapsed := time.Since(start)
	bound := b + r*elapsed.Seconds()
	t.Logf("leased %d, degraded %d over %v; b + r·t = %.3f", leased, degraded, elapsed, bound)
	if float64(leased+degraded) > bound {
		t.Fatalf("admitted %d leased + %d degraded over %v, above b + r·t = %.3f: degraded mode started from a full local bucket",
			leased, degraded, elapsed, bound)
	}
	if got := metrictest.Series(t, reg, "sluice_client_degraded_episodes_total", nil); got != 1 {
		t.Fatalf("degraded episodes %v, want 1", got)
	}
	conn.setFault("*", healthy)
}

// TestShortDegradedEpisodesAreCounted: episodes of degraded mode shorter
// than a scrape leave the degraded gauge at 0 when scraped; the episodes
// counter counts each. A strict class asks the region on every request,
// so each request the cut-off region cannot answer is degraded, and the
// next one it answers ends the episode.
func TestShortDegradedEpisodesAreCounted(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	export := quota.Key{Tenant: "acme", Class: "export"}
	synctest.Test(t, func(t *testing.T) {
		c, reg, logs := bubbleClient(t, conn, func(o *lease.Options) {
			o.Refresh = time.Hour // no background Sync: the requests alone end the episodes
		})
		const episodes = 3
		for i := range episodes {
			conn.setFault("*", unreachable)
			if d := mustAllow(t, c, export, 1); !d.Degraded {
				t.Fatalf("episode %d: %+v with the region cut off, want degraded", i, d)
			}
			conn.setFault("*", healthy)
			if d := mustAllow(t, c, export, 1); d.Degraded {
				t.Fatalf("episode %d: %+v with the region back, want its answer", i, d)
			}
		}
		if got := metrictest.Gauge(t, reg, "sluice_client_degraded"); got != 0 {
			t.Fatalf("degraded gauge %v between episodes", got)
		}
		if got := metrictest.Series(t, reg, "sluice_client_degraded_episodes_total", nil); got != episodes {
			t.Fatalf("degraded episodes %v, want %d\n%s", got, episodes, logs.String())
		}
		closeClient(t, c)
	})
}
