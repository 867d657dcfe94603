package lease_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestSlowHealthyRegionIsNoOutage: a region that answers every call, but
// in 120ms (a healthy Redis on a CPU-starved machine), is not an outage.
// Once the instance has seen it answer that slowly (one background Sync),
// requests on keys it holds nothing for wait for the answer instead of
// giving up at the 50ms breaker timeout: none is decided by its on_failure
// policy and the breaker stays closed. (With a fixed 50ms wait, every such
// request was degraded and three of them opened the breaker.) A region
// that then stops answering is given up on after the wait its recent
// answers justify, and then within the breaker timeout.
func TestSlowHealthyRegionIsNoOutage(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn)
		conn.setFault("*", slow)
		// A first request, and one refresh for the background Sync to
		// bring back the region's answer time.
		c.Allow(t.Context(), quota.Key{Tenant: "warm", Class: "read"}, 1)
		time.Sleep(time.Second + slowBy)
		synctest.Wait()
		degraded := 0
		for i := range 20 {
			d := mustAllow(t, c, quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "read"}, 1)
			if d.Degraded {
				degraded++
			}
		}
		if degraded > 0 {
			t.Fatalf("%d of 20 first requests on a slow but healthy region were degraded", degraded)
		}
		closeClient(t, c)
	})
}

// TestFastRegionThatStopsIsGivenUpOnWithinTheBreakerTimeout: after fast
// answers, a region that stops answering sends a request to its
// on_failure policy after exactly the breaker timeout.
func TestFastRegionThatStopsIsGivenUpOnWithinTheBreakerTimeout(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn)
		mustAllow(t, c, acmeRead, 1)
		time.Sleep(time.Second)
		synctest.Wait()
		conn.setFault("*", hanging)
		start := time.Now()
		d := mustAllow(t, c, quota.Key{Tenant: "new", Class: "read"}, 1)
		if took := time.Since(start); !d.Degraded || took != lease.DefaultBreakerTimeout {
			t.Fatalf("hanging region after fast answers: %+v after %v, want degraded after %v", d, took, lease.DefaultBreakerTimeout)
		}
		conn.setFault("*", healthy)
		closeClient(t, c)
	})
}
