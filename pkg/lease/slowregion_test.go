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

// TestALateAnswerLandsAndTeachesTheWait: a request gives up on its call
// after the 50ms breaker timeout and is decided by its policy, but the
// call goes on: the region's answer, 120ms after it went out, lands its
// grant in the pool, so the key's next request is decided from the pool
// at once with no second call, and it is a round trip the wait learns
// from, so a first request on another key waits for its answer instead of
// giving up. (Cut at the request's wait, the answer was never seen: every
// such request was degraded, and three opened the breaker.)
func TestALateAnswerLandsAndTeachesTheWait(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn, func(o *lease.Options) {
			o.Refresh = time.Hour // no background Sync: the requests alone
		})
		conn.setFault("*", slow)
		start := time.Now()
		if d := mustAllow(t, c, acmeRead, 1); !d.Degraded || time.Since(start) != lease.DefaultBreakerTimeout {
			t.Fatalf("first request on a region that answers in %v: %+v after %v, want degraded after %v", slowBy, d, time.Since(start), lease.DefaultBreakerTimeout)
		}
		time.Sleep(slowBy - lease.DefaultBreakerTimeout)
		synctest.Wait()
		start = time.Now()
		if d := mustAllow(t, c, acmeRead, 1); !d.Allowed || d.Degraded || time.Since(start) != 0 {
			t.Fatalf("the key's next request after the late answer: %+v after %v, want an allow from the pool at once", d, time.Since(start))
		}
		if n := conn.attemptCount("Acquire"); n != 1 {
			t.Fatalf("%d Acquire calls, want 1: the late answer's grant serves the next request", n)
		}
		start = time.Now()
		if d := mustAllow(t, c, quota.Key{Tenant: "other", Class: "read"}, 1); !d.Allowed || d.Degraded || time.Since(start) != slowBy {
			t.Fatalf("a first request on another key: %+v after %v, want an allow after the region's %v", d, time.Since(start), slowBy)
		}
		conn.setFault("*", healthy)
		closeClient(t, c)
	})
}
