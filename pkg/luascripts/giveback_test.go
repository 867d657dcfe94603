package luascripts

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestRefusedPeerWaitsForTheHoldersGiveBack: on a key of 7 an hour with a
// burst of 7, instance a took the whole burst while it was alone and spent
// one. b's
// acquire finds the bucket empty: its wait is not the bucket's refill of
// one token (514 s) but about one refresh (twice the demand window), when
// a's next Sync gives back its pool above the batch cap of two live
// instances (max(1, floor(7/4)) = 1). Once a holds no more than that, the
// honest wait is the refill again. Lua and Model answer alike.
func TestRefusedPeerWaitsForTheHoldersGiveBack(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sc := newVirtual()
	m := NewModel()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "hour"})
	c := Common{StaticRate: 7.0 / 3600, StaticBurst: 7, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8, DemandWindow: 500 * time.Millisecond}
	refresh := 2 * c.DemandWindow
	now := int64(1_700_000_000_000_000)
	call := func(what string, sync bool, r Report) LeaseReply {
		t.Helper()
		sc.setNow(now)
		var lr, want LeaseReply
		var err error
		if sync {
			lr, err = sc.Sync(ctx, rdb, k, c, r)
			want = m.Sync(now, k, c, r)
		} else {
			lr, err = sc.Acquire(ctx, rdb, k, c, r)
			want = m.Acquire(now, k, c, r)
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if lr != want {
			t.Fatalf("%s: lua %+v, model %+v", what, lr, want)
		}
		return lr
	}
	a := Report{Instance: "a", Incarnation: 1, Lease: 1, Seq: 1, Want: 7, Min: 1}
	if lr := call("a's acquire", false, a); lr.Granted != 7 {
		t.Fatalf("a's acquire granted %d, want the whole burst 7", lr.Granted)
	}
	// a spent one and reported it: it holds 6, the bucket nothing.
	now += 10_000
	a.Seq, a.Used, a.Want = 2, 1, 0
	call("a's report", true, a)
	now += 10_000
	b := Report{Instance: "b", Incarnation: 1, Lease: 1, Seq: 1, Want: 1, Min: 1}
	lr := call("b's acquire", false, b)
	if lr.Granted != 0 || lr.Live != 2 {
		t.Fatalf("b's acquire: %+v, want refused with 2 live leases", lr)
	}
	if lr.RetryAfter != refresh {
		t.Errorf("b told to wait %v while a holds 6 of a burst of 7 with a peer; want one refresh (%v)", lr.RetryAfter, refresh)
	}

	// a gives back five at its Sync, keeping 1: b's next acquire is
	// served from the bucket.
	now += 200_000
	a.Seq, a.Returned = 3, 5
	call("a's sync", true, a)
	now += 10_000
	b.Seq = 2
	if lr := call("b's second acquire", true, b); lr.Granted != 1 {
		t.Fatalf("b's acquire after a's give-back: %+v, want 1 granted", lr)
	}
	// The bucket holds 4; b spends them all (its pool of 5 is above its
	// batch cap too, but its own tokens are not a peer's to wait for).
	now += 10_000
	b.Seq, b.Used, b.Want = 3, 1, 4
	if lr := call("b takes the rest", true, b); lr.Granted != 4 {
		t.Fatalf("b's top-up: %+v, want the 4 left", lr)
	}
	// Now a holds 1, its share: a third instance's wait is the refill.
	now += 10_000
	b.Seq, b.Used, b.Want = 4, 5, 0
	call("b reports", true, b)
	cr := Report{Instance: "c", Incarnation: 1, Lease: 1, Seq: 1, Want: 1, Min: 1}
	lr = call("c's acquire", false, cr)
	if lr.Granted != 0 || lr.RetryAfter < time.Minute {
		t.Errorf("c's acquire while every holder holds at most its share: %+v, want refused with the bucket's refill wait (minutes)", lr)
	}
}
