package lease_test

import (
	"context"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestNeverForTokensOutInLeasesIsAWait: a peer holds the whole cap of a
// small key (the tiny tier's read: burst 10 at 1/s) in its lease, so the
// region answers another instance's request for one token "never" (the
// cap less the tokens out in leases holds none). Tokens out in leases come
// back, so the instance does not pass the "never" on: it denies with a
// wait until it asks the region again (its next refresh), and once the
// peer releases its lease the same request is admitted. (A real regional
// server and Redis; the peer speaks the lease protocol directly.)
func TestNeverForTokensOutInLeasesIsAWait(t *testing.T) {
	e := startRegion(t)
	ctx := context.Background()
	peer := sluicev1.NewLeaseServiceClient(e.reg.Dial(t))
	key := &sluicev1.QuotaKey{Tenant: smallRead.Tenant, Class: smallRead.Class}
	const peerID, incarnation = "peer", 1
	resp, err := peer.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: peerID, Incarnation: incarnation,
		Report: &sluicev1.KeyReport{Key: key, Seq: 1, Want: 10, Min: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if g := resp.GetGrant(); g.GetGranted() != 10 {
		t.Fatalf("the peer was granted %d tokens, want the whole cap 10", g.GetGranted())
	}

	c, _, _ := newClient(t, e)
	refresh := c.Table().Options().Refresh
	d := mustAllow(t, c, smallRead, 1)
	if d.Allowed || d.RetryNever || d.RetryAfter <= 0 || d.RetryAfter > refresh {
		t.Fatalf("one token while a peer's lease holds the cap: %+v; want denied with a RetryAfter of at most the refresh %v, no RetryNever", d, refresh)
	}

	if _, err := peer.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: peerID, Incarnation: incarnation,
		Reports: []*sluicev1.KeyReport{{Key: key, Seq: 2, Returned: 10}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the request to be admitted once the peer released its lease", func() bool {
		d := mustAllow(t, c, smallRead, 1)
		if !d.Allowed && d.RetryNever {
			t.Fatalf("after the peer's release: %+v, RetryNever", d)
		}
		return d.Allowed && !d.Degraded
	})
}
