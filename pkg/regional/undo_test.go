package regional_test

import (
	"context"
	"strings"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
)

// TestUndoOnlyRequestsCreateNothing: requests that can only undo create
// no state. A Release of a key never used here, and a Sync from an
// instance the region has never seen whose report asks for nothing, leave
// Redis byte for byte as it was (no bucket, no lease record); and such a
// Sync on a key in use does not count as a live instance, so it shrinks
// nobody's share of the local fallback. (A Release on a never-used key
// once created its bucket; a Sync from an invented id a lease record.)
func TestUndoOnlyRequestsCreateNothing(t *testing.T) {
	reg := regiontest.Start(t, regiontest.MustConfig(t, oneRegion), "local")
	client := sluicev1.NewLeaseServiceClient(reg.Dial(t))
	ctx := context.Background()
	// One key in use by one instance.
	resp, err := client.Acquire(ctx, &sluicev1.AcquireRequest{InstanceId: "i-real",
		Report: &sluicev1.KeyReport{Key: qk("acme", "read"), Seq: 1, Lease: 1, Want: 5}})
	if err != nil || resp.GetGrant().GetGranted() != 5 {
		t.Fatalf("acquire: %v %v", resp, err)
	}
	before, err := redistest.Snapshot(ctx, reg.RDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Release(ctx, &sluicev1.ReleaseRequest{InstanceId: "i-invented",
		Reports: []*sluicev1.KeyReport{{Key: qk("never-used", "read"), Seq: 7, Lease: 3, Used: 4, Returned: 9}}}); err != nil {
		t.Fatal(err)
	}
	sr, err := client.Sync(ctx, &sluicev1.SyncRequest{InstanceId: "i-invented", Reports: []*sluicev1.KeyReport{
		{Key: qk("never-used-either", "read"), Seq: 7, Lease: 3, Used: 4},
		{Key: qk("acme", "read"), Seq: 7, Lease: 3, Used: 4},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range sr.GetGrants() {
		if g.GetGranted() != 0 || g.GetTtlMs() != 0 {
			t.Fatalf("a report of an unknown lease asking for nothing was answered with a lease: %v", g)
		}
	}
	after, err := redistest.Snapshot(ctx, reg.RDB)
	if err != nil {
		t.Fatal(err)
	}
	// The key in use is refilled and its TTLs refreshed by the Sync that
	// reads it; nothing else may appear, and no lease record.
	for _, k := range []string{"sl:{acme|read}:b", "sl:{acme|read}:l", "sl:{acme|read}:x"} {
		delete(before, k)
		delete(after, k)
	}
	if err := redistest.Unchanged(before, after); err != nil {
		t.Fatalf("undo-only requests changed Redis: %v", err)
	}
	var ids []string
	for _, f := range reg.RDB.HKeys(ctx, "sl:{acme|read}:b").Val() {
		if id, ok := strings.CutPrefix(f, "#"); ok {
			ids = append(ids, id)
		}
	}
	if len(ids) != 1 || ids[0] != "i-real" {
		t.Fatalf("lease records on the key in use: %v, want only the real instance's", ids)
	}
}
