package luascripts

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// A share of 10/s, burst 100, whose floor is nothing (partition_share 0:
// the default of local and closed classes) or a quarter.
var risingShare = Common{StaticRate: 10, StaticBurst: 100, LeaseTTL: 5 * time.Second, ReapBudget: 8,
	DemandWindow: 500 * time.Millisecond, RestartWait: 6 * time.Second}

// risingFloors are risingShare's floors at partition_share 0 and 0.25.
var risingFloors = []struct {
	name   string
	fr, fb float64
}{
	{"partition_share 0", 0, 0},
	{"partition_share 0.25", 2.5, 25},
}

// risen is c handed after the region came back from its floor (fr, fb)
// at riseUS.
func risen(c Common, riseUS int64, fr, fb float64) Common {
	c.RiseUS, c.FloorRate, c.FloorBurst = riseUS, fr, fb
	return c
}

// floorOf is c on its floor: what the region hands its scripts while it is
// drained or off its static lease.
func floorOf(c Common, fr, fb float64) Common {
	c.StaticRate, c.StaticBurst = fr, fb
	return c
}

// TestComingBackFromAFloorCreditsTheFloorBeforeTheRise: a region drained
// (or off its static lease) ran its keys on their floor, and the global tier
// gave the rest of their share to the other regions. When the share comes
// back, a bucket idle across the floor is credited the floor until the rise
// and the share only since, and a key missing then is born as one idle
// since long before: the region hands out at most its floor's burst plus
// r·t since the rise, never its whole static burst the others may just have
// spent in its place (invariant 1; lib.lua, "Coming back from a floor").
// Without the rise (the scripts before it) both buckets came back full.
func TestComingBackFromAFloorCreditsTheFloorBeforeTheRise(t *testing.T) {
	for _, tc := range risingFloors {
		t.Run(tc.name, func(t *testing.T) {
			r := newAwaitedRig(t)
			idle := KeysFor(DefaultPrefix, quota.Key{Tenant: "idle", Class: "read"})
			missing := KeysFor(DefaultPrefix, quota.Key{Tenant: "missing", Class: "read"})
			r.stampLongAgo(idle)
			// Spent on the static share, then the region drops to its floor
			// and the key idles there for an hour (a call on the floor
			// clamps it there; one that never comes changes nothing).
			if lr := r.acquire(idle, risingShare, Report{Instance: "i-1", Seq: 1, Lease: 1, Want: 100, Min: 1}); lr.Granted != 100 {
				t.Fatalf("first batch on the share: %+v", lr)
			}
			r.release(idle, risingShare, Report{Instance: "i-1", Seq: 2, Lease: 1, Used: 100})
			r.advance(time.Hour)
			rise := r.now
			r.advance(2 * time.Second)
			c := risen(risingShare, rise, tc.fr, tc.fb)
			want := int64(tc.fb + 10*2)
			if lr := r.acquire(idle, c, Report{Instance: "i-1", Seq: 3, Lease: 3, Want: 100, Min: 1}); lr.Granted != want {
				t.Fatalf("idle bucket 2 s after the rise: granted %d, want its floor's burst %v + 2 s at 10/s = %d", lr.Granted, tc.fb, want)
			}
			r.release(idle, c, Report{Instance: "i-1", Seq: 4, Lease: 3, Used: want})
			if lr := r.acquire(missing, c, Report{Instance: "i-1", Seq: 1, Lease: 1, Want: 100, Min: 1}); lr.Granted != want {
				t.Fatalf("key born 2 s after the rise: granted %d, want %d", lr.Granted, want)
			}
			// A fill time (burst ÷ rate = 10 s) after the rise the rise no
			// longer matters: a bucket idle since is full again.
			r.advance(10 * time.Second)
			if lr := r.acquire(idle, c, Report{Instance: "i-2", Seq: 1, Lease: 1, Want: 100, Min: 1}); lr.Granted != 100 {
				t.Fatalf("idle bucket a fill time after the rise: granted %d, want its whole burst", lr.Granted)
			}
		})
	}
}

// TestARiseClampsABucketFullBeforeTheFloor: a bucket full at the static cap
// when its region dropped to the floor, idle since, held more than the floor
// while the global tier counted the region there; a call on the floor would
// have clamped it, and the refill across the rise does the same.
func TestARiseClampsABucketFullBeforeTheFloor(t *testing.T) {
	r := newAwaitedRig(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "full", Class: "read"})
	r.stampLongAgo(k)
	if st := r.state(k, risingShare); st.Tokens != 100 {
		t.Fatalf("a key of a data set born a day ago holds %v, want its burst", st.Tokens)
	}
	r.advance(time.Minute)
	rise := r.now
	if cr := r.check(k, risen(risingShare, rise, 2.5, 25), 1); !cr.Allowed || cr.Remaining != 24 {
		t.Fatalf("full bucket at the rise: %+v, want clamped to the floor's 25, one admitted", cr)
	}
	// A rise before the bucket's last refill changes nothing: it was
	// refilled on the share since.
	r.advance(time.Second)
	if st := r.state(k, risen(risingShare, rise, 0, 0)); st.Tokens != 34 {
		t.Fatalf("a second after the rise: %v tokens, want 24 + 10", st.Tokens)
	}
}

// TestARiseIsOnlyEverLessCredit: the floor is taken at most the share (a
// floor above it, which no caller passes, changes nothing), a rise in the
// future (another Redis node's clock) credits the floor up to now, and a
// rise of 0 is none. On the floor itself the rise changes nothing.
func TestARiseIsOnlyEverLessCredit(t *testing.T) {
	r := newAwaitedRig(t)
	keys := func(name string) Keys { return KeysFor(DefaultPrefix, quota.Key{Tenant: name, Class: "read"}) }
	a, b, c, d := keys("a"), keys("b"), keys("c"), keys("d")
	r.stampLongAgo(a)
	if st := r.state(a, risen(risingShare, r.now-int64(time.Second/time.Microsecond), 1e6, 1e6)); st.Tokens != 100 {
		t.Fatalf("floor above the share: %v tokens, want the share's 100", st.Tokens)
	}
	if st := r.state(b, risen(risingShare, r.now+1000, 0, 0)); st.Tokens != 0 {
		t.Fatalf("rise after now: %v tokens, want the floor's 0", st.Tokens)
	}
	if st := r.state(c, risen(risingShare, 0, 0, 0)); st.Tokens != 100 {
		t.Fatalf("no rise: %v tokens, want full", st.Tokens)
	}
	if st := r.state(d, risen(floorOf(risingShare, 2.5, 25), r.now, 2.5, 25)); st.Tokens != 25 {
		t.Fatalf("on the floor: %v tokens, want the floor's full 25", st.Tokens)
	}
}

// TestARiseClampsTokensReclaimedFromALeaseThatEndedOnTheFloor: a lease
// taken on the static share and left unspent ends while the region is on
// its floor; the key idles there, so nothing reaps the lease until the
// first call after the rise. Reaped on the floor, its tokens would have
// gone back into a bucket capped at the floor's burst; they must not come
// back at the static cap after the rise, which would hand out at once what
// the global tier gave the other regions meanwhile.
func TestARiseClampsTokensReclaimedFromALeaseThatEndedOnTheFloor(t *testing.T) {
	for _, tc := range risingFloors {
		t.Run(tc.name, func(t *testing.T) {
			r := newAwaitedRig(t)
			share := risingShare
			share.Reclaim = true
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: "leased", Class: "read"})
			r.stampLongAgo(k)
			if lr := r.acquire(k, share, Report{Instance: "i-1", Seq: 1, Lease: 1, Want: 100, Min: 1}); lr.Granted != 100 {
				t.Fatalf("lease on the share: %+v", lr)
			}
			// The lease (5 s) ends on the floor; the rise comes before the
			// bucket's TTL (21 s) ends.
			r.advance(15 * time.Second)
			rise := r.now
			r.advance(time.Second)
			c := risen(share, rise, tc.fr, tc.fb)
			want := int64(tc.fb + 10*1)
			if lr := r.acquire(k, c, Report{Instance: "i-2", Seq: 1, Lease: 1, Want: 100, Min: 1}); lr.Granted > want {
				t.Fatalf("a second after the rise: granted %d, want at most the floor's burst %v + 1 s at 10/s = %d", lr.Granted, tc.fb, want)
			}
		})
	}
}

// TestARiseCreditsTheFloorRateAndFollowsAGrant: time before the rise is
// credited at the floor's rate, not the share's (an emptied bucket idle 4 s
// before the rise holds 4 s at 2.5/s, not at 10/s); and a bucket whose
// grant ended before the rise is credited the grant while it ran, then the
// floor until the rise (nothing at a floor of 0), then the share.
func TestARiseCreditsTheFloorRateAndFollowsAGrant(t *testing.T) {
	r := newAwaitedRig(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "rate", Class: "read"})
	r.stampLongAgo(k)
	if lr := r.acquire(k, risingShare, Report{Instance: "i-1", Seq: 1, Lease: 1, Want: 100, Min: 1}); lr.Granted != 100 {
		t.Fatalf("first batch: %+v", lr)
	}
	r.release(k, risingShare, Report{Instance: "i-1", Seq: 2, Lease: 1, Used: 100})
	r.advance(4 * time.Second)
	if st := r.state(k, risen(risingShare, r.now, 2.5, 25)); st.Tokens != 10 {
		t.Fatalf("4 s on a floor of 2.5/s: %v tokens, want 10", st.Tokens)
	}

	g := KeysFor(DefaultPrefix, quota.Key{Tenant: "granted", Class: "read"})
	r.stampLongAgo(g)
	if sr := r.setRate(g, risingShare, 20, 80, r.now+int64(2*time.Second/time.Microsecond), r.now); !sr.Applied {
		t.Fatalf("grant: %+v", sr)
	}
	if cr := r.check(g, risingShare, 80); !cr.Allowed {
		t.Fatalf("spending the grant's burst: %+v", cr)
	}
	r.advance(time.Minute)
	rise := r.now
	r.advance(time.Second)
	if st := r.state(g, risen(risingShare, rise, 0, 0)); st.Tokens != 10 {
		t.Fatalf("a grant that ended before a floor of 0, a second after the rise: %v tokens, want 10 (the grant's 40 gone with the floor)", st.Tokens)
	}
}
