package lease_test

import (
	"regexp"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Two processes configured with one instance id: once the region refuses
// a report of one of them as conflicting with the other's, that one ends
// the leases it holds under the old id (a Release under it) and takes a
// new id: the configured one, a dot and 8 random hex digits.
func TestConflictingProcessTakesANewInstanceID(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		a, _, _ := bubbleClient(t, conn)
		b, _, _ := bubbleClient(t, conn)
		if a.InstanceID() != b.InstanceID() {
			t.Fatalf("ids %s and %s, want one shared", a.InstanceID(), b.InstanceID())
		}
		shared := a.InstanceID()
		// Each leases a key of its own, then both the same one.
		mustAllow(t, a, quota.Key{Tenant: "only-a", Class: "read"}, 1)
		mustAllow(t, b, quota.Key{Tenant: "only-b", Class: "read"}, 1)
		synctest.Wait()
		for range 3 {
			mustAllow(t, a, acmeRead, 1)
			mustAllow(t, b, acmeRead, 1)
			synctest.Wait()
			time.Sleep(time.Second) // one periodic Sync each
			synctest.Wait()
		}
		fresh := regexp.MustCompile(`^` + regexp.QuoteMeta(shared) + `\.[0-9a-f]{8}$`)
		renamed := 0
		for _, c := range []interface{ InstanceID() string }{a, b} {
			if id := c.InstanceID(); id != shared {
				if !fresh.MatchString(id) {
					t.Errorf("new id %q, want %q, a dot and 8 hex digits", id, shared)
				}
				renamed++
			}
		}
		if renamed == 0 {
			t.Fatalf("both processes still report as %q after 3 refreshes of conflicting reports", shared)
		}
		released := false
		for _, s := range conn.servedCalls("Release") {
			released = released || s.req.(*sluicev1.ReleaseRequest).InstanceId == shared
		}
		if !released {
			t.Fatalf("no Release under the old id %q before taking a new one", shared)
		}
		closeClient(t, a)
		closeClient(t, b)
	})
}
