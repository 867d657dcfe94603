package luascripts

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestLoweredCapReleasesAndADepositLandsOnce: the burst transfer's two
// ends on a real redis-server and on Model (docs/architecture.md, "Burst
// transfer"). A grant that lowers the cap below the bucket's tokens
// reports the tokens it clipped as released; a deposit is added by the
// first install of its answer only, while its grant is in force, up to
// the cap, and never as a fraction of a micro-token.
func TestLoweredCapReleasesAndADepositLandsOnce(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 0.001, StaticBurst: 100, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	// A fresh bucket holds its static cap: 100.
	if st := w.state(k, c); st.Tokens != 100 {
		t.Fatalf("fresh bucket holds %v, want 100", st.Tokens)
	}
	issued := w.now
	r := w.setRate(k, c, 0, 40, w.now+60_000_000, issued)
	if !r.Applied || r.Released != 60 || r.Tokens != 40 {
		t.Fatalf("cap 100 -> 40: %+v, want applied, 60 released, 40 tokens", r)
	}
	// The same answer installed again clips nothing more and adds no
	// deposit, even one it names.
	if r := w.setRateDeposit(k, c, 0, 40, w.now+60_000_000, issued, 25); !r.Applied || r.Released != 0 || r.Tokens != 40 {
		t.Fatalf("same answer again with a deposit: %+v, want 40 tokens, nothing released", r)
	}
	// Spend 30 through a check so the bucket has room below its cap.
	if cr := w.check(k, c, 30); !cr.Allowed {
		t.Fatalf("check of 30 refused: %+v", cr)
	}
	w.at(w.now + 1_000)
	issued = w.now
	// A newer answer raises the cap by its deposit and adds it once.
	if r := w.setRateDeposit(k, c, 0, 65, w.now+60_000_000, issued, 25.0000004); !r.Applied || r.Released != 0 || r.Tokens != 35 {
		t.Fatalf("deposit 25.0000004 on 10 tokens, cap 65: %+v, want 35 tokens (whole micro-tokens only)", r)
	}
	if r := w.setRateDeposit(k, c, 0, 65, w.now+60_000_000, issued, 25); r.Tokens != 35 {
		t.Fatalf("deposit of the same answer added again: %+v", r)
	}
	// A deposit beyond the cap's room fills the bucket to the cap and no
	// further.
	w.at(w.now + 1_000)
	if r := w.setRateDeposit(k, c, 0, 50, w.now+60_000_000, w.now, 500); !r.Applied || r.Tokens != 50 {
		t.Fatalf("deposit 500 under cap 50: %+v, want 50 tokens", r)
	}
	// An older answer is not applied: it neither releases nor deposits.
	if r := w.setRateDeposit(k, c, 0, 10, w.now+60_000_000, issued-1, 5); r.Applied || r.Released != 0 || r.Tokens != 50 {
		t.Fatalf("stale answer: %+v, want not applied and 50 tokens", r)
	}
	// An answer that arrives after its grant ended is installed (it
	// orders later answers) but adds no deposit: its room was reserved
	// only under that grant. Spend 40 first so the static cap of 100
	// would have room for it.
	if cr := w.check(k, c, 40); !cr.Allowed {
		t.Fatalf("check of 40 refused: %+v", cr)
	}
	w.at(w.now + 2_000)
	if r := w.setRateDeposit(k, c, 0, 80, w.now-1, w.now-1_000, 30); !r.Applied || r.Tokens != 10 {
		t.Fatalf("deposit 30 of an answer whose grant ended 1µs ago: %+v, want applied and 10 tokens", r)
	}
	// A newer one still in force at its install adds it.
	if r := w.setRateDeposit(k, c, 0, 80, w.now+1, w.now-500, 30); !r.Applied || r.Tokens != 40 {
		t.Fatalf("deposit 30 of an answer whose grant ends 1µs after its install: %+v, want 40 tokens", r)
	}
}

// TestADepositAfterTheClockWentBackNeedsItsGrantInForceThen: a grant's
// end is judged for its deposit at the latest time the bucket has seen,
// not only at the call's clock: after the clock went back (a failover to
// a replica whose clock is behind), an answer whose grant ended before a
// call the bucket already saw adds no deposit, although the clock says
// the grant still holds. The global tier counted the deposit's room only
// until that end. (The latest time is that of the bucket's last save: a
// state read that changes nothing writes nothing.) (The simulator's oracle, which judges a bucket's cap at
// its latest time, found a bucket of 244 tokens over a static cap of 222
// after such a deposit in the chaos scenario.)
func TestADepositAfterTheClockWentBackNeedsItsGrantInForceThen(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 0.001, StaticBurst: 100, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	w.state(k, c)
	t0 := w.now
	if r := w.setRate(k, c, 0, 40, t0+60_000_000, t0); !r.Applied || r.Tokens != 40 {
		t.Fatalf("cap 100 -> 40: %+v", r)
	}
	if cr := w.check(k, c, 30); !cr.Allowed {
		t.Fatalf("check of 30 refused: %+v", cr)
	}
	t1 := t0 + 10_000
	w.at(t1)
	if cr := w.check(k, c, 1); !cr.Allowed { // the bucket is saved at t1
		t.Fatalf("check of 1 refused: %+v", cr)
	}
	w.at(t1 - 5_000)
	if r := w.setRateDeposit(k, c, 0, 80, t1-1, t1-6_000, 30); !r.Applied || r.Tokens != 9 {
		t.Fatalf("deposit 30 of a grant that ended 1µs before the bucket's latest call, the clock back 5ms: %+v, want applied and 9 tokens", r)
	}
	if r := w.setRateDeposit(k, c, 0, 80, t1+1_000_000, t1-5_500, 30); !r.Applied || r.Tokens != 39 {
		t.Fatalf("deposit 30 of a grant in force past the bucket's latest call: %+v, want 39 tokens", r)
	}
}

// TestLeaseReturnsAboveAGrantsCapAreReleased: tokens a lease gives back
// above the cap of the grant in force are released (field rl), the next
// state read takes them once, and they are dropped with the grant: by the
// install of another grant, or when it expired before the read.
func TestLeaseReturnsAboveAGrantsCapAreReleased(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 0.001, StaticBurst: 100, LeaseTTL: 10 * time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	lease := func(seq uint64, want int64) Report {
		return Report{Instance: "i-1", Incarnation: 7, Lease: 1, Seq: seq, Want: want, Min: 1}
	}
	w.setRate(k, c, 0, 100, w.now+60_000_000, w.now)
	if r := w.acquire(k, c, lease(1, 60)); r.Granted != 60 {
		t.Fatalf("acquire: %+v, want 60 granted", r)
	}
	// The cap falls to 10 while the lease holds 60: the bucket's 40 are
	// clipped by the install (its own reply), nothing else yet.
	w.at(w.now + 1_000)
	if r := w.setRate(k, c, 0, 10, w.now+60_000_000, w.now); r.Released != 40 || r.Tokens != 0 {
		t.Fatalf("cap 100 -> 10: %+v, want 40 released, 0 tokens", r)
	}
	// The lease gives its 60 back: 10 fit under the cap, 50 are released.
	w.at(w.now + 1_000)
	back := lease(2, 0)
	back.Returned = 60
	w.release(k, c, back)
	if st := w.state(k, c); st.Released != 50 || st.Tokens != 10 {
		t.Fatalf("state after the return: %+v, want 50 released, 10 tokens", st)
	}
	if st := w.state(k, c); st.Released != 0 {
		t.Fatalf("second state read: %+v, want nothing released (taken once)", st)
	}

	// Released, then the grant expires before a read: gone.
	w.at(w.now + 1_000)
	w.setRateDeposit(k, c, 0, 100, w.now+2_000, w.now, 90)
	if r := w.acquire(k, c, Report{Instance: "i-2", Incarnation: 7, Lease: 1, Seq: 1, Want: 60, Min: 1}); r.Granted != 60 {
		t.Fatalf("acquire: %+v, want 60 granted", r)
	}
	w.at(w.now + 1_000)
	w.setRate(k, c, 0, 10, w.now+2_000, w.now)
	back = Report{Instance: "i-2", Incarnation: 7, Lease: 1, Seq: 2, Returned: 60}
	w.release(k, c, back)
	w.at(w.now + 5_000)
	if st := w.state(k, c); st.Released != 0 {
		t.Fatalf("state after the grant ended: %+v, want nothing released", st)
	}

	// Released, then another grant is installed: dropped with the old one.
	w.at(w.now + 1_000)
	w.setRateDeposit(k, c, 0, 100, w.now+60_000_000, w.now, 100)
	if r := w.acquire(k, c, Report{Instance: "i-3", Incarnation: 7, Lease: 1, Seq: 1, Want: 60, Min: 1}); r.Granted == 0 {
		t.Fatalf("acquire: %+v, want a grant", r)
	}
	w.at(w.now + 1_000)
	w.setRate(k, c, 0, 0, w.now+60_000_000, w.now)
	w.release(k, c, Report{Instance: "i-3", Incarnation: 7, Lease: 1, Seq: 2, Returned: 60})
	w.at(w.now + 1_000)
	w.setRate(k, c, 0, 5, w.now+60_000_000, w.now)
	if st := w.state(k, c); st.Released != 0 {
		t.Fatalf("state after another grant: %+v, want what the old one released dropped", st)
	}
}
