package luascripts

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestGiveBackWaitBoundaries pins each term of giveback_ms (Lua and
// Model, which must answer alike): a refused instance is told to ask again
// after one refresh (twice the demand window) exactly when the bucket's
// whole tokens plus what the other live leases hold above their batch cap
// max(1, floor(cap/2n)) cover its need, the refused instance's own lease
// (granted less used less returned) not counting as a peer's; else it is
// told the bucket's refill; and never later than the refill when that is
// sooner.
func TestGiveBackWaitBoundaries(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	const dw = 500 * time.Millisecond
	refresh := 2 * dw
	slow := func(burst float64) Common {
		return Common{StaticRate: 7.0 / 3600, StaticBurst: burst, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8, DemandWindow: dw}
	}
	type rig struct {
		call func(what string, sync bool, r Report) LeaseReply
		seq  map[string]uint64
	}
	// report sends instance who's report (used and returned cumulative)
	// asking for want, at least min.
	report := func(g *rig, who string, sync bool, used, returned, want, min int64) LeaseReply {
		g.seq[who]++
		return g.call(who, sync, Report{Instance: who, Incarnation: 1, Lease: 1, Seq: g.seq[who], Used: used, Returned: returned, Want: want, Min: min})
	}
	sc := newVirtual()
	m := NewModel()
	now := int64(1_700_000_000_000_000)
	for i, tc := range []struct {
		name string
		c    Common
		// run drives the key and returns the refused reply to judge.
		run func(g *rig) LeaseReply
		// giveback: the reply must name one refresh; else a wait other
		// than one refresh (the refill), below it when fast.
		giveback, fast bool
	}{
		{"a peer holds one above its cap of floor(42/4)=10", slow(42), func(g *rig) LeaseReply {
			report(g, "a", false, 0, 0, 42, 1)
			report(g, "a", true, 31, 0, 0, 0) // a holds 11
			return report(g, "b", false, 0, 0, 1, 1)
		}, true, false},
		{"a peer holds just its cap of 10", slow(42), func(g *rig) LeaseReply {
			report(g, "a", false, 0, 0, 42, 1)
			report(g, "a", true, 32, 0, 0, 0) // a holds 10
			return report(g, "b", false, 0, 0, 1, 1)
		}, false, false},
		{"the excess of one does not cover a need of two", slow(42), func(g *rig) LeaseReply {
			report(g, "a", false, 0, 0, 42, 1)
			report(g, "a", true, 31, 0, 0, 0)
			return report(g, "b", false, 0, 0, 2, 2)
		}, false, false},
		{"each peer keeps at least one", slow(7), func(g *rig) LeaseReply {
			// Four live: floor(7/8) = 0, so each keeps 1; a holds 2
			// and c, d none: 2 - 3 < 1.
			report(g, "a", false, 0, 0, 7, 1)
			report(g, "a", true, 5, 0, 0, 0)
			report(g, "c", false, 0, 0, 1, 1)
			report(g, "d", false, 0, 0, 1, 1)
			return report(g, "b", false, 0, 0, 1, 1)
		}, false, false},
		{"the refused instance's own tokens are not a peer's", slow(42), func(g *rig) LeaseReply {
			report(g, "a", false, 0, 0, 30, 1)
			report(g, "b", false, 0, 0, 12, 1)
			report(g, "a", true, 20, 0, 0, 0) // a holds 10, b 12
			return report(g, "b", true, 0, 0, 13, 1)
		}, false, false},
		{"what it returned is not its own", slow(42), func(g *rig) LeaseReply {
			// b holds 12 - 2 = 10, the bucket 2; a holds 11: the
			// bucket's 2 and a's excess 1 cover a need of 3.
			report(g, "a", false, 0, 0, 30, 1)
			report(g, "b", false, 0, 0, 12, 1)
			report(g, "a", true, 19, 0, 0, 0)
			return report(g, "b", true, 0, 2, 13, 3)
		}, true, false},
		{"the bucket's whole tokens count, up to the need", slow(42), func(g *rig) LeaseReply {
			// As above with a need of 4: 2 + 1 < 4.
			report(g, "a", false, 0, 0, 30, 1)
			report(g, "b", false, 0, 0, 12, 1)
			report(g, "a", true, 19, 0, 0, 0)
			return report(g, "b", true, 0, 2, 14, 4)
		}, false, false},
		{"a refill sooner than a refresh stays", Common{StaticRate: 10, StaticBurst: 10, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8, DemandWindow: dw}, func(g *rig) LeaseReply {
			// a spent one of the burst it took, so the bucket has room
			// for the peer's need (a holder of the whole cap leaves none,
			// and the peer is told never).
			report(g, "a", false, 0, 0, 10, 1)
			report(g, "a", true, 1, 0, 0, 0)
			return report(g, "b", false, 0, 0, 1, 1)
		}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A key of its own, in one store and Model for all.
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: fmt.Sprintf("giveback%d", i)})
			g := &rig{seq: map[string]uint64{}}
			g.call = func(what string, sync bool, r Report) LeaseReply {
				t.Helper()
				now += 10_000
				sc.setNow(now)
				var lr, want LeaseReply
				var err error
				if sync {
					lr, err = sc.Sync(ctx, rdb, k, tc.c, r)
					want = m.Sync(now, k, tc.c, r)
				} else {
					lr, err = sc.Acquire(ctx, rdb, k, tc.c, r)
					want = m.Acquire(now, k, tc.c, r)
				}
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if lr != want {
					t.Fatalf("%s: lua %+v, model %+v", what, lr, want)
				}
				return lr
			}
			lr := tc.run(g)
			if lr.Granted != 0 || lr.RetryAfter <= 0 {
				t.Fatalf("the last request: %+v; want refused with a wait", lr)
			}
			switch {
			case tc.giveback && lr.RetryAfter != refresh:
				t.Errorf("told to wait %v; want one refresh (%v), the peers' give-back", lr.RetryAfter, refresh)
			case !tc.giveback && !tc.fast && lr.RetryAfter <= refresh:
				t.Errorf("told to wait %v; want the bucket's refill (minutes): the peers' excess does not cover the need", lr.RetryAfter)
			case tc.fast && lr.RetryAfter >= refresh:
				t.Errorf("told to wait %v; want the bucket's refill, sooner than a refresh (%v)", lr.RetryAfter, refresh)
			}
		})
	}
}
