package regional

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestActiveKeysCountsEachLeaseUntilItsTTL pins the index's arithmetic at
// its edges: a release takes exactly one lease off the count a reply
// showed, a reply of no (or a negative) lease count holds none, a count is
// live until one TTL after its reply and not at it, and a prune keeps an
// unserved key while one lease is live on it and drops it at the TTL.
func TestActiveKeysCountsEachLeaseUntilItsTTL(t *testing.T) {
	const ttl = time.Second
	t0 := time.Unix(1000, 0)
	k := quota.Key{Tenant: "t", Class: "read"}
	for _, tc := range []struct {
		name     string
		live     int64 // the lease reply's count at t0
		releases int
		at       time.Duration // when the count is read and the key pruned, after t0
		leases   int64         // live leases counted at t0+at
		kept     bool          // the key survives the second prune at t0+at
	}{
		{name: "one release of three leaves two", live: 3, releases: 1, at: 0, leases: 2, kept: true},
		{name: "two releases of three leave one", live: 3, releases: 2, at: 0, leases: 1, kept: true},
		{name: "releases past the count leave none", live: 1, releases: 2, at: 0, leases: 0, kept: false},
		{name: "one lease is live and keeps its key", live: 1, at: 0, leases: 1, kept: true},
		{name: "one lease a nanosecond before its TTL", live: 1, at: ttl - time.Nanosecond, leases: 1, kept: true},
		{name: "one lease at its TTL is gone", live: 1, at: ttl, leases: 0, kept: false},
		{name: "a reply of no lease holds none", live: 0, at: 0, leases: 0, kept: false},
		{name: "a negative count holds none", live: -2, at: 0, leases: 0, kept: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newActiveKeys()
			a.touch(t0, k, tc.live)
			for range tc.releases {
				a.release(k)
			}
			now := t0.Add(tc.at)
			if got := a.leases(now, ttl); got != tc.leases {
				t.Fatalf("%d live leases %v after a reply of %d and %d releases, want %d", got, tc.at, tc.live, tc.releases, tc.leases)
			}
			a.prune(now, ttl) // the key was served since the last prune: kept
			if got := a.size(); got != 1 {
				t.Fatalf("the first prune left %d keys, want the served key", got)
			}
			a.prune(now, ttl)
			if got, want := a.size() == 1, tc.kept; got != want {
				t.Fatalf("key kept by the second prune %v: %v, want %v", tc.at, got, want)
			}
		})
	}
}

// TestActiveKeysForgetsAStrictKeyAfterOneIdlePrune: a key served by a
// strict check (no lease count) is kept through the prune that follows
// and dropped by the next one unless served again in between.
func TestActiveKeysForgetsAStrictKeyAfterOneIdlePrune(t *testing.T) {
	const ttl = time.Second
	now := time.Unix(1000, 0)
	k := quota.Key{Tenant: "t", Class: "read"}
	a := newActiveKeys()
	a.mark(k)
	a.prune(now, ttl)
	a.mark(k)
	a.prune(now, ttl)
	if got := a.size(); got != 1 {
		t.Fatalf("%d keys after a prune that followed a check, want 1", got)
	}
	if got := a.leases(now, ttl); got != 0 {
		t.Fatalf("%d live leases on a checked key, want 0", got)
	}
	a.prune(now, ttl)
	if got := a.size(); got != 0 {
		t.Fatalf("%d keys after an idle prune, want 0", got)
	}
}
