package lease_test

import (
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// A request admitted on the clock-free path that takes the pool to its
// low-water mark wakes the loop: the refill goes out at once, not at the
// next periodic Sync.
func TestFastPathCrossingTheMarkRefillsAtOnce(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn)
		mustAllow(t, c, acmeRead, 1)
		synctest.Wait() // the first acquire and its early refill
		// Past the spacing that holds kicks after a refill, far from the
		// next periodic Sync (at 1s).
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		st, _ := c.Table().State(acmeRead)
		if !st.HasLease || st.CheckClock || st.Tokens <= st.LowWater || st.Tokens-st.LowWater > st.Limit {
			t.Fatalf("state %+v: want a lease far from its deadline holding more than its mark", st)
		}
		at := time.Now()
		before := len(conn.servedCalls("Sync"))
		if d := mustAllow(t, c, acmeRead, st.Tokens-st.LowWater); !d.Allowed || d.Degraded {
			t.Fatalf("spending down to the mark: %+v", d)
		}
		synctest.Wait()
		syncs := conn.servedCalls("Sync")
		if len(syncs) != before+1 || !syncs[before].at.Equal(at) || reportFor(syncs[before].req.(*sluicev1.SyncRequest).Reports, acmeRead) == nil {
			t.Fatalf("after crossing the mark at %v: %d Syncs (were %d); want one for the key at once", at, len(syncs), before)
		}
		closeClient(t, c)
	})
}

// A key that crosses its mark while the loop holds kicks back (the
// spacing after a refill) is not forgotten: its refill goes out when the
// spacing ends, before the next periodic Sync.
func TestKickDuringTheRefillSpacingIsKept(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		c, _, _ := bubbleClient(t, conn)
		other := acmeRead
		other.Tenant = "other"
		mustAllow(t, c, acmeRead, 1)
		mustAllow(t, c, other, 1)
		synctest.Wait() // the first acquires and their early refills
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		var st [2]lease.KeyState
		for i, k := range []quota.Key{acmeRead, other} {
			st[i], _ = c.Table().State(k)
			if !st[i].HasLease || st[i].CheckClock || st[i].Tokens <= st[i].LowWater || st[i].Tokens-st[i].LowWater > st[i].Limit {
				t.Fatalf("%s state %+v: want a lease far from its deadline holding more than its mark", k, st[i])
			}
		}
		before := len(conn.servedCalls("Sync"))
		mustAllow(t, c, acmeRead, st[0].Tokens-st[0].LowWater) // a refill, then the spacing
		synctest.Wait()
		mustAllow(t, c, other, st[1].Tokens-st[1].LowWater) // within the spacing
		time.Sleep(time.Second - time.Since(start) - time.Millisecond)
		synctest.Wait()
		for _, s := range conn.servedCalls("Sync")[before:] {
			if reportFor(s.req.(*sluicev1.SyncRequest).Reports, other) != nil {
				closeClient(t, c)
				return
			}
		}
		t.Fatalf("no refill for %s, which crossed its mark during the spacing, before the periodic Sync at 1s", other)
	})
}

// A key that crosses a cap-held mark (its region's bucket and its pool
// fill the region's cap) while the loop holds an ordinary kick back for
// the refill spacing has its report sent after CapHeldSpacing, not when
// the spacing ends: the loop wakes for it and sends at once, here 20 ms
// after the last early refill. (small itself is not in that report: the
// region's empty answer told it to wait.)
func TestCapHeldCrossingDuringTheRefillSpacingIsSentSooner(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn)
		small := quota.Key{Tenant: "small", Class: "read"} // burst 10
		mustAllow(t, c, acmeRead, 1)
		mustAllow(t, c, small, 1)
		synctest.Wait() // the first acquires and their early refills
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		// small's first report from its cap-held mark: a refill at t1,
		// which the region answers with nothing (its bucket is empty), so
		// small's usual mark is back.
		st, _ := c.Table().State(small)
		if !st.HasLease || st.Tokens <= st.LowWater {
			t.Fatalf("%s state %+v: want a lease above its mark", small, st)
		}
		t1 := time.Now()
		mustAllow(t, c, small, st.Tokens-st.LowWater)
		synctest.Wait()
		if syncs := conn.servedCalls("Sync"); len(syncs) == 0 || !syncs[len(syncs)-1].at.Equal(t1) {
			t.Fatalf("no early refill for %s at %v", small, t1)
		}
		acme, _ := c.Table().State(acmeRead)
		if !acme.HasLease || acme.Tokens-acme.LowWater > 100/16 || acme.LowWater <= 0 {
			t.Fatalf("%s state %+v: want a pool at most %d above its cap-held mark", acmeRead, acme, 100/16)
		}
		st, _ = c.Table().State(small)
		if !st.HasLease || st.Tokens <= st.LowWater {
			t.Fatalf("%s state %+v after its report: want a lease above its usual mark", small, st)
		}
		// 10 ms into the spacing, small crosses its usual mark: held back.
		time.Sleep(10 * time.Millisecond)
		before := len(conn.servedCalls("Sync"))
		mustAllow(t, c, small, st.Tokens-st.LowWater)
		synctest.Wait()
		if n := len(conn.servedCalls("Sync")); n != before {
			t.Fatalf("%d Syncs within the spacing after an ordinary crossing, want none", n-before)
		}
		// 20 ms into it, acme crosses its cap-held mark: both go now.
		time.Sleep(10 * time.Millisecond)
		t3 := time.Now()
		if d := mustAllow(t, c, acmeRead, acme.Tokens-acme.LowWater); !d.Allowed {
			t.Fatalf("spending %s down to its mark: %+v", acmeRead, d)
		}
		synctest.Wait()
		syncs := conn.servedCalls("Sync")
		if len(syncs) != before+1 || !syncs[before].at.Equal(t3) {
			var ats []time.Duration
			for _, s := range syncs[before:] {
				ats = append(ats, s.at.Sub(t1))
			}
			t.Fatalf("Syncs after %s crossed its cap-held mark %v after the refill: at %v after it; want one at once", acmeRead, t3.Sub(t1), ats)
		}
		if reportFor(syncs[before].req.(*sluicev1.SyncRequest).Reports, acmeRead) == nil {
			t.Fatalf("the Sync at %v carries no report for %s", t3.Sub(t1), acmeRead)
		}
		closeClient(t, c)
	})
}
