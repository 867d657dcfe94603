package live

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestGrantHeldCountsTheStoredExpiry: a grant a state read finds held is
// counted until the expiry Redis stores, whatever the report that follows
// says: one that already ended is not counted again, one the oracle was
// not told is counted until its stored end, and one it already counts
// keeps its record.
func TestGrantHeldCountsTheStoredExpiry(t *testing.T) {
	k := quota.Key{Tenant: "f04", Class: "read"}
	d := &deployment{keyID: map[quota.Key]int{k: 0}}
	now := time.Now()
	applied := now.Add(time.Second).UnixMicro()
	d.grantApplied(0, 0, 32, 11, applied)
	// Held until 12 ms ago: ended before the read was seen.
	d.grantHeld(0, 0, 30, 10, now.Add(-12*time.Millisecond).UnixMicro())
	if g := d.seen[[2]int{0, 0}]; g.rate != 32 || g.expiryUS != applied {
		t.Fatalf("a grant that had ended replaced the one applied: %+v", g)
	}
	// A grant the oracle was not told of (its set_rate answer lost): it
	// counts until the stored expiry, exactly.
	stored := now.Add(3 * time.Second).UnixMicro()
	d.grantHeld(0, 0, 30, 10, stored)
	g := d.seen[[2]int{0, 0}]
	if g.rate != 30 || g.burst != 10 || g.expiryUS != stored {
		t.Fatalf("a held grant recorded as %+v, want 30/s burst 10 until %d", g, stored)
	}
	// Read again by the next report: nothing changes.
	d.grantHeld(0, 0, 30, 10, stored)
	if g2 := d.seen[[2]int{0, 0}]; g2 != g {
		t.Fatalf("the same grant read again moved to %+v from %+v", g2, g)
	}
	// The key's trace shows the grant applied and the one read counted.
	var held int
	for _, e := range d.trace.events[0] {
		if strings.Contains(e.what, "oracle counts the held") {
			held++
		}
	}
	if n := len(d.trace.events[0]); held != 1 || n != 2 {
		t.Fatalf("the key's trace has %d events, %d of them held grants counted; want the grant applied and 1 held", n, held)
	}
}
