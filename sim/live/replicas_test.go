package live

import (
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestReportedHeldCountsFromTheRead: a report's echo of a held grant is
// counted from the Redis read (its seq), not from when the report left: a
// grant that ended before the report left is not counted again, a grant
// the oracle was not told ends where the read says, and one it already
// counts keeps its expiry.
func TestReportedHeldCountsFromTheRead(t *testing.T) {
	k := quota.Key{Tenant: "f04", Class: "read"}
	d := &deployment{keyID: map[quota.Key]int{k: 0}}
	now := time.Now()
	wire := &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}
	report := func(readAgo time.Duration, rate, burst float64, validMs int64) {
		d.reportedHeld(0, &sluicev1.RegionReport{Region: "us-east", Seq: uint64(now.Add(-readAgo).UnixMicro()),
			Keys: []*sluicev1.KeyDemand{{Key: wire, HeldRate: rate, HeldBurst: burst, HeldValidMs: validMs}}})
	}
	applied := now.Add(-time.Second).UnixMicro()
	d.grantApplied(0, 0, 32, 11, applied)
	// Read 1 s ago with 12 ms left: it ended before the report left.
	report(time.Second+12*time.Millisecond, 32, 11, 12)
	if g := d.seen[[2]int{0, 0}]; g.expiryUS != applied {
		t.Fatalf("a grant that ended before the report left counted again until %v from now", time.UnixMicro(g.expiryUS).Sub(now))
	}
	// A grant never applied to the oracle's knowledge, read 2 s ago with
	// 3 s left: it ends about 1 s from now, not 3 s.
	report(2*time.Second, 30, 10, 3000)
	g := d.seen[[2]int{0, 0}]
	if want := now.Add(time.Second + time.Millisecond).UnixMicro(); g.rate != 30 || g.expiryUS > want+1000 || g.expiryUS < want-1000 {
		t.Fatalf("an echoed grant recorded as %+v, ending %v from now; want 30/s ending 1.001s from now", g, time.UnixMicro(g.expiryUS).Sub(now))
	}
	// The same grant echoed again later, with less left: its expiry stands.
	report(0, 30, 10, 900)
	if g2 := d.seen[[2]int{0, 0}]; g2 != g {
		t.Fatalf("the same grant echoed again moved to %+v from %+v", g2, g)
	}
	// The key's trace shows the grant applied and the one echo counted.
	var echoed int
	for _, e := range d.trace.events[0] {
		if strings.Contains(e.what, "oracle counts the echoed") {
			echoed++
		}
	}
	if n := len(d.trace.events[0]); echoed != 1 || n != 2 {
		t.Fatalf("the key's trace has %d events, %d of them echoes counted; want the grant applied and 1 echo", n, echoed)
	}
}
