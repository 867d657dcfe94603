package lease_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestHolderGivesBackAtTheGrantThatTellsOfAPeer: instance a, alone on a
// key of 7 an hour (burst 7), holds the rest of the burst. Instance b asks
// and is refused (the region's bucket is empty). The grant of a's next
// periodic Sync tells a of two live instances, above whose batch cap
// (max(1, floor(7/4)) = 1) a's pool lies: a gives the excess back at once
// (keyInfo.giveBack, Core.GiveBackDue), not at the periodic Sync a
// refresh later, which is what b, told to ask again after about one
// refresh, waits for.
func TestHolderGivesBackAtTheGrantThatTellsOfAPeer(t *testing.T) {
	reg := regiontest.Start(t, regiontest.MustConfig(t, slowKeyRegion), "local")
	conn := newRegionConn(t, reg.Server)
	key := quota.Key{Tenant: "acme", Class: "read"}
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		a, _, _ := bubbleClient(t, conn, func(o *lease.Options) { o.InstanceID = "a" })
		b, _, _ := bubbleClient(t, conn, func(o *lease.Options) { o.InstanceID = "b" })
		if d := mustAllow(t, a, key, 1); !d.Allowed {
			t.Fatalf("a's first request: %+v", d)
		}
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if st, _ := a.Table().State(key); st.Tokens != 6 || st.Live != 1 {
			t.Fatalf("a's state %+v after its first request; want it alone holding the rest of the burst, 6", st)
		}
		if d := mustAllow(t, b, key, 1); d.Allowed || d.Degraded {
			t.Fatalf("b's first request: %+v; want refused by the region (a holds the burst)", d)
		}
		// a's periodic Sync at 1 s learns of b; half a refresh later a
		// holds only its batch cap.
		time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
		synctest.Wait()
		st, _ := a.Table().State(key)
		if st.Live != 2 || st.Tokens > 1 {
			t.Fatalf("a's state %+v half a refresh after the Sync that told it of b; want 2 live and at most its batch cap 1 held", st)
		}
		closeClient(t, a)
		closeClient(t, b)
	})
}
