package redisproc

import (
	"context"
	"errors"
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

// TestStartOnATakenPortIsTold: a redis-server that cannot bind its port
// (another process took it after it was found free) is errPortTaken, which
// StartWith answers with a fresh port; a start never takes another
// process's server for its own.
func TestStartOnATakenPortIsTold(t *testing.T) {
	first, err := StartWith()
	if errors.Is(err, ErrNoRedisServer) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer first.Stop()
	second := &Proc{port: first.port}
	err = second.start()
	if !errors.Is(err, errPortTaken) {
		second.Stop()
		t.Fatalf("start on a port redis-server %s holds: %v; want errPortTaken", first.Addr(), err)
	}
	// The first server is untouched.
	c := redis.NewClient(&redis.Options{Addr: first.Addr()})
	defer c.Close()
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("the first server after the failed start: %v", err)
	}
}
