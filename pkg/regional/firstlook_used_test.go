package regional_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestColdStartFullRetriedFirstLookNeverTrustsADataSetAlreadyAnsweredFrom:
// under -cold-start full the guard's first look at start timed out, and a
// script call of this process then answered from Redis (writing the
// sentinel dated now, the scripts' conservative dating). That data set is
// lost with the lease the call may have issued still out. When the first
// look is retried, the new data set must be dated on the Redis clock, as
// one lost while the process runs: trusting it to start full (0) would
// hand out a second burst beside the lease still out (docs/architecture.md,
// "Redis (or one Redis Cluster node) restarts empty"). A guard whose
// process answered nothing from Redis still trusts a fresh data set full.
func TestColdStartFullRetriedFirstLookNeverTrustsADataSetAlreadyAnsweredFrom(t *testing.T) {
	ctx := context.Background()
	born := luascripts.DefaultPrefix + "born"
	common := luascripts.Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Minute, RestartWait: time.Minute, ReapBudget: 8, DemandWindow: time.Millisecond}
	key := luascripts.KeysFor(luascripts.DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})

	for _, answered := range []bool{true, false} {
		t.Run("answered="+strconv.FormatBool(answered), func(t *testing.T) {
			_, rdb, admin, g := firstLookTimedOut(t)

			if answered {
				// A call of this process (its scripts share the guard's
				// generations, as every server of the process does)
				// answers from the data set and dates it now.
				sc := luascripts.NewWith(g.Generations())
				if _, err := sc.Check(ctx, rdb, key, common, 1); err != nil {
					t.Fatal(err)
				}
				if v, err := admin.Get(ctx, born).Result(); err != nil || v == "0" {
					t.Fatalf("sentinel after the call: %q, %v; want a birth dated now", v, err)
				}
			}
			// The data set is lost.
			if err := admin.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}

			before, err := admin.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Check(ctx, rdb); err != nil {
				t.Fatalf("retried first look: %v", err)
			}
			v, err := admin.Get(ctx, born).Result()
			if err != nil {
				t.Fatalf("sentinel after the retried look: %v", err)
			}
			if !answered {
				if v != "0" {
					t.Fatalf("sentinel of a fresh data set no call answered from: %q; want 0 (trusted to start full under -cold-start full)", v)
				}
				return
			}
			us, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("sentinel %q: %v", v, err)
			}
			if us < before.UnixMicro() {
				t.Fatalf("sentinel after the retried look: %d µs, before the look (%d µs); want the data set dated on the Redis clock at the look, never trusted full", us, before.UnixMicro())
			}
		})
	}
}
