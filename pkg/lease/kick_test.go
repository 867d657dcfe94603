package lease_test

import (
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
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
