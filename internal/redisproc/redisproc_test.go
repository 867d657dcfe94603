package redisproc

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestScriptsRunOnBothKinds: the embedded fallback must run the same
// scripts as a real redis-server, or development mode would lie.
func TestScriptsRunOnBothKinds(t *testing.T) {
	for _, embedded := range []bool{false, true} {
		var p *Proc
		var err error
		if embedded {
			p, err = startEmbedded()
		} else {
			p, err = Start(false)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer p.Stop()
		rdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
		defer rdb.Close()
		ctx := context.Background()
		sc := luascripts.New()
		k := luascripts.KeysFor("sl:", quota.Key{Tenant: "acme", Class: "read"})
		c := luascripts.Common{StaticRate: 10, StaticBurst: 20, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8, DemandWindow: 500 * time.Millisecond}
		lr, err := sc.Acquire(ctx, rdb, k, c, luascripts.Report{Instance: "i1", Seq: 1, Want: 15, Min: 1})
		if err != nil || lr.Granted != 15 {
			t.Fatalf("embedded=%v: acquire %+v %v", embedded, lr, err)
		}
		cr, err := sc.Check(ctx, rdb, k, c, 5)
		if err != nil || !cr.Allowed {
			t.Fatalf("embedded=%v: check %+v %v", embedded, cr, err)
		}
		if err := p.Restart(); err != nil {
			t.Fatal(err)
		}
		if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 0 {
			t.Fatalf("embedded=%v: after restart dbsize %d %v, want an empty server", embedded, n, err)
		}
	}
}
