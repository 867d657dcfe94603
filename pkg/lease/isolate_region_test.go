package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/lease"
)

// TestIsolatedInstanceErrorIsBounded: a live instance cut off from its
// region for longer than the lease TTL keeps spending its lease until its
// own deadline, then stops. The region cannot hear about that spend; when
// the lease expires, reaping (reclaim: reported) gives its unspent tokens,
// by the region's books, back to the bucket, and another instance admits
// them again. Over the run, on Redis time, the key admits at most
// b + r·t + ε, where ε is what the cut-off instance spent after its last
// delivered report, and ε is at most what the region showed unspent in
// its lease when the link was cut: the tokens it held at its last report.
// (A real regional server and Redis; the client's connection is cut by a
// fault-injecting connection.)
func TestIsolatedInstanceErrorIsBounded(t *testing.T) {
	e := startRegion(t)
	ctx := context.Background()
	const r, b = 1.0, 100.0 // acme read on the only region
	start := e.reg.RedisNow(t)

	connA := newRegionConn(t, e.reg.Server)
	a, err := lease.NewClient(connA, lease.Options{InstanceID: "isolated", Refresh: 200 * time.Millisecond, BreakerTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(context.Background()) })
	var admitted int64
	allow := func(c *lease.Client) bool {
		d, err := c.Allow(ctx, acmeRead, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed && !d.Degraded { // a degraded decision is the on_failure policy's, outside the bound
			admitted++
			return true
		}
		return false
	}
	// A spends with demand enough to lease a batch, until its lease holds
	// tokens and its last report has been answered.
	for i := 0; i < 20; i++ {
		allow(a)
	}
	waitFor(t, "the instance's refill to settle", func() bool {
		st, _ := a.Table().State(acmeRead)
		return st.HasLease && st.Tokens > 0 && st.Pending == nil && !st.InFlight
	})
	connA.setFault("*", unreachable)
	held := e.regionState(t, acmeRead).Outstanding // the region's books: unspent in A's lease
	if held <= 0 {
		t.Fatalf("the region shows nothing out in the instance's lease")
	}
	for allow(a) {
	}

	// The region reaps the lease once it expires on Redis time.
	var reported int64
	waitFor(t, "the region to reap the expired lease", func() bool {
		st := e.regionState(t, acmeRead)
		reported = st.Admitted // what A's delivered reports said it used
		return st.Outstanding == 0
	})
	spent, _ := a.Table().State(acmeRead)
	eps := spent.Spent - reported // spent, never reported: handed out again by the reaping
	if eps > held {
		t.Fatalf("the cut-off instance spent %d tokens the region never heard of, more than the %d its lease held at its last report", eps, held)
	}

	// Another instance takes everything the region will give.
	bc, _, _ := newClient(t, e)
	for allow(bc) {
	}
	end := e.reg.RedisNow(t)
	bound := b + r*end.Sub(start).Seconds()
	t.Logf("admitted %d over %v; b + r·t = %.3f; ε = %d (held %d at the last report)", admitted, end.Sub(start), bound, eps, held)
	if float64(admitted) > bound+float64(eps) {
		t.Fatalf("admitted %d > b + r·t + ε = %.3f + %d", admitted, bound, eps)
	}
	connA.setFault("*", healthy)
}
