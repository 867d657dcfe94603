package luascripts

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestGiveBackWaitUnderAGrantedBurst: under a grant from the global tier
// the key's cap is the granted burst, not the static share (the cap is the
// grant's until it expires), so the batch cap a peer keeps,
// max(1, floor(cap/2n)), is a share of the granted burst: with a grant of
// burst 42 and two live leases a holder of 11 holds one above it, and the
// refused peer is told one refresh (its give-back), whatever the static
// burst; a holder of 10 holds none above it, and the peer is told the
// bucket's refill. Lua and Model answer alike.
func TestGiveBackWaitUnderAGrantedBurst(t *testing.T) {
	const dw = 500 * time.Millisecond
	refresh := 2 * dw
	for i, tc := range []struct {
		name        string
		staticBurst float64
		aUsed       int64 // a took the granted 42 and reported this much used
		giveback    bool
	}{
		{"static burst above the grant, a holds 11", 200, 31, true},
		{"static burst above the grant, a holds 10", 200, 32, false},
		{"static burst below the grant, a holds 11", 10, 31, true},
		{"static burst below the grant, a holds 10", 10, 32, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newTwin(t)
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: fmt.Sprintf("granted%d", i)})
			c := Common{StaticRate: 7.0 / 3600, StaticBurst: tc.staticBurst, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8, DemandWindow: dw}
			// A grant of 42/s fills the bucket to the granted burst in a
			// second; the next grant keeps that burst at 7 an hour, so a
			// refill of one token takes minutes.
			w.setRate(k, c, 42, 42, w.now+3600_000_000, w.now)
			w.at(w.now + 1_000_000)
			w.setRate(k, c, 7.0/3600, 42, w.now+3600_000_000, w.now)
			w.at(w.now + 10_000)
			if r := w.acquire(k, c, Report{Instance: "a", Incarnation: 1, Lease: 1, Seq: 1, Want: 42, Min: 1}); r.Granted != 42 {
				t.Fatalf("a's acquire: %+v, want the granted burst 42", r)
			}
			w.at(w.now + 10_000)
			w.sync(k, c, Report{Instance: "a", Incarnation: 1, Lease: 1, Seq: 2, Used: tc.aUsed})
			w.at(w.now + 10_000)
			r := w.acquire(k, c, Report{Instance: "b", Incarnation: 1, Lease: 1, Seq: 1, Want: 1, Min: 1})
			if r.Granted != 0 || r.Live != 2 || r.RetryAfter <= 0 {
				t.Fatalf("b's acquire: %+v, want refused with a wait, 2 live leases", r)
			}
			switch {
			case tc.giveback && r.RetryAfter != refresh:
				t.Errorf("b told to wait %v; want one refresh (%v): a holds one above floor(42/4)", r.RetryAfter, refresh)
			case !tc.giveback && r.RetryAfter <= refresh:
				t.Errorf("b told to wait %v; want the bucket's refill (minutes): a holds no more than floor(42/4)", r.RetryAfter)
			}
		})
	}
}
