package lease_test

import (
	"context"
	"testing"
	"testing/synctest"
)

// Close says when the final Release did not reach the region (the leases
// it would have ended are left to expire), and says nothing when it did.
func TestCloseReportsAFailedRelease(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	for _, releaseFails := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			c, _, _ := bubbleClient(t, conn)
			mustAllow(t, c, acmeRead, 1)
			synctest.Wait() // acquired and refilled: nothing pending
			if releaseFails {
				conn.setFault("Release", unreachable)
				defer conn.setFault("Release", healthy)
			}
			err := c.Close(context.Background())
			if (err != nil) != releaseFails {
				t.Fatalf("release fails %v: Close returned %v", releaseFails, err)
			}
		})
	}
}
