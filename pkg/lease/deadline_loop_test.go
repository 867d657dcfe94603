package lease_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/pkg/lease"
)

// TestLoopHotPathStopsAtDeadlineWhileSyncHangs: the region stops answering
// (requests hang) and the owner loop sits in a background Sync for its
// whole SyncTimeout, longer than the guard (half the 2s lease TTL), across
// the lease's deadline. The clock-free hot path must not spend the lease's
// tokens at or after the deadline meanwhile (DESIGN invariant 4): the
// owner arms the clock check for the whole RPC before sending it.
func TestLoopHotPathStopsAtDeadlineWhileSyncHangs(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn, func(o *lease.Options) {
			o.IdleTimeout = time.Hour
			o.SyncTimeout = 1900 * time.Millisecond
		})
		// Half a refresh in, so the next periodic Sync (at 1s) starts
		// before the guard time (deadline − 1s) and hangs past the deadline.
		time.Sleep(500 * time.Millisecond)
		mustAllow(t, c, acmeRead, 1)
		synctest.Wait()
		conn.setFault("*", hanging)
		st, _ := c.Table().State(acmeRead)
		if !st.HasLease || st.Tokens < 2 {
			t.Fatalf("no lease with tokens held: %+v", st)
		}
		if lead := st.Deadline.Sub(time.Now()); lead <= time.Second {
			t.Fatalf("deadline %v ahead, want more than the guard (1s)", lead)
		}
		time.Sleep(time.Until(st.Deadline) - time.Nanosecond)
		if d := mustAllow(t, c, acmeRead, 1); !d.Allowed || d.Degraded {
			t.Fatalf("1ns before the deadline: %+v, want a leased allow", d)
		}
		time.Sleep(time.Nanosecond)
		spent, _ := c.Table().State(acmeRead)
		if d := mustAllow(t, c, acmeRead, 1); d.Allowed && !d.Degraded {
			t.Fatalf("at the deadline, owner blocked in a Sync: %+v, a leased allow after the lease ended", d)
		}
		if st, _ := c.Table().State(acmeRead); st.Spent != spent.Spent {
			t.Fatalf("lease tokens spent at the deadline: %d, then %d", spent.Spent, st.Spent)
		}
		conn.setFault("*", healthy)
	})
}
