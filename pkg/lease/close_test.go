package lease_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"github.com/sluicehq/sluice/pkg/lease"
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
			// Its ctx still live, the release is the one problem named.
			if multi, ok := err.(interface{ Unwrap() []error }); releaseFails && (!ok || len(multi.Unwrap()) != 1) {
				t.Fatalf("a failed release under a live ctx: Close returned %q; want the release's error alone", err)
			}
		})
	}
}

// TestCloseWithNothingToSendIgnoresItsContext: a Close whose ctx is
// already done, on a client holding nothing the region must hear of, has
// lost nothing to it and returns nil (the ctx's end is named only beside
// a report or release it cut short); an Allow after it fails with
// ErrClosed, whatever its own ctx.
func TestCloseWithNothingToSendIgnoresItsContext(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		if err := c.Close(done); err != nil {
			t.Fatalf("Close with a done ctx and nothing to release: %v; want nil", err)
		}
		// Closed, it says so before anything else, whatever the ctx.
		if _, err := c.Allow(done, acmeRead, 1); !errors.Is(err, lease.ErrClosed) {
			t.Fatalf("Allow after Close with a done ctx: %v; want ErrClosed", err)
		}
	})
}
