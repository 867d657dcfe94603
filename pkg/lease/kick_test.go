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
