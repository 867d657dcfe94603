package luascripts

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// extremeConfig is the sample config pushed to the bounds validation
// accepts: the longest intervals, and one tier per corner of the limits
// (the largest burst with the slowest rate it allows, the largest burst
// with the largest rate, the smallest burst with the largest rate).
func extremeConfig(t *testing.T) *config.Config {
	t.Helper()
	c := config.Default()
	c.Epoch = config.Duration(config.MaxInterval / 4)
	c.GrantValidity = config.Duration(config.MaxInterval)
	c.RegionLease = config.Duration(config.MaxRegionLease)
	c.LeaseTTL = config.Duration(config.MaxInterval)
	c.Refresh = config.Duration(config.MaxInterval/2 - time.Millisecond)
	// The least-weighted region's share of the rate must refill the burst
	// within MaxFill; a hair above the slowest such rate.
	least := math.Inf(1)
	sum := 0.0
	for _, r := range c.Regions {
		least = min(least, r.Weight)
		sum += r.Weight
	}
	slow := config.MaxBurst / (config.MaxFill.Seconds() * least / sum) * (1 + 1e-9)
	for class := range c.Classes {
		c.Tiers["slow"] = mergeLimit(c.Tiers["slow"], class, config.LimitSpec{Rate: config.Rate(slow), Burst: config.MaxBurst})
		c.Tiers["fast"] = mergeLimit(c.Tiers["fast"], class, config.LimitSpec{Rate: config.MaxRate, Burst: config.MaxBurst})
		c.Tiers["tiny"] = mergeLimit(c.Tiers["tiny"], class, config.LimitSpec{Rate: config.MaxRate, Burst: 1})
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("the extreme config is refused: %v", err)
	}
	return c
}

func mergeLimit(t config.Tier, class string, l config.LimitSpec) config.Tier {
	if t == nil {
		t = config.Tier{}
	}
	t[class] = l
	return t
}

// TestMaxAcceptedValuesRunEveryScript runs every script, in every region,
// on the extreme values the config accepts, through long clock jumps, on
// real Redis: none may fail, every TTL must be what the twin says, and
// the replies must match the twin's.
func TestMaxAcceptedValuesRunEveryScript(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sc := newVirtual()
	m := NewModel()
	cfg := extremeConfig(t)
	now := int64(1_700_000_000_000_000)

	step := func(what string, got, want any, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: script failed: %v", what, err)
		}
		if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
			t.Fatalf("%s: lua %+v, model %+v", what, got, want)
		}
	}
	for _, tier := range []string{"slow", "fast", "tiny"} {
		for region := range cfg.Regions {
			l := cfg.Tiers[tier]["read"]
			rate, burst, err := cfg.StaticShare(region, float64(l.Rate), l.Burst)
			if err != nil {
				t.Fatal(err)
			}
			c := Common{
				StaticRate: rate, StaticBurst: burst, LeaseTTL: time.Duration(cfg.LeaseTTL), Reclaim: true,
				ReapBudget: 8, DemandWindow: cfg.DemandWindow(),
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("%s/%s: %v", tier, region, err)
			}
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: tier + "-" + region, Class: "read"})
			name := func(op string) string { return tier + "/" + region + ": " + op }
			for i, jump := range []int64{0, 1, int64(time.Duration(cfg.LeaseTTL) / time.Microsecond), 400 * 24 * 3600 * 1e6, 10 * 365 * 24 * 3600 * 1e6} {
				now += jump
				sc.setNow(now)
				r := Report{Instance: "i-1", Seq: uint64(2*i + 1), Want: quota.MaxWant, Min: 1}
				got, err := sc.Acquire(ctx, rdb, k, c, r)
				step(name("acquire"), got, m.Acquire(now, k, c, r), err)
				cost := int64(min(quota.MaxCost, l.Burst))
				gc, err := sc.Check(ctx, rdb, k, c, cost)
				step(name("check"), gc, m.Check(now, k, c, cost), err)
				exp, issued := now+int64(time.Duration(cfg.GrantValidity)/time.Microsecond), now
				gs, err := sc.SetRate(ctx, rdb, k, c, float64(l.Rate), l.Burst, exp, issued, 0)
				step(name("set_rate"), gs, m.SetRate(now, k, c, float64(l.Rate), l.Burst, exp, issued, 0), err)
				r = Report{Instance: "i-1", Seq: uint64(2*i + 2), Used: got.Granted / 2, Want: quota.MaxWant, Min: quota.MaxWant}
				gy, err := sc.Sync(ctx, rdb, k, c, r)
				step(name("sync"), gy, m.Sync(now, k, c, r), err)
				st, err := sc.State(ctx, rdb, k, c)
				step(name("state"), st, m.State(now, k, c), err)
				rp, err := sc.Reap(ctx, rdb, k, c)
				step(name("reap"), rp, m.Reap(now, k, c), err)
			}
			r := Report{Instance: "i-1", Seq: 99, Returned: 1}
			rr, err := sc.Release(ctx, rdb, k, c, r)
			step(name("release"), rr, m.Release(now, k, c, r), err)
			want, _ := m.LastTTL(k.Bucket)
			got, err := rdb.PTTL(ctx, k.Bucket).Result()
			if err != nil || got <= 0 || got > want {
				t.Fatalf("%s: PTTL %v (%v), model says %v", name("ttl"), got, err, want)
			}
		}
	}
}

// TestScriptFailureChangesNothing: a script that fails must not have
// written anything, or the caller's retry debits again. A burst of 2^53
// at 1 token/s (which validation used to accept) made the bucket's TTL
// overflow PEXPIRE after the bucket was written: every strict check
// failed and took its cost anyway.
func TestScriptFailureChangesNothing(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sc := New()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "huge", Class: "export"})
	c := Common{StaticRate: 1 - 1e-12, StaticBurst: (1 << 53) * (1 - 1e-12), LeaseTTL: 5 * time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	admitted := 0
	for call := 1; call <= 3; call++ {
		before, err := redistest.Dump(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		cr, err := sc.Check(ctx, rdb, k, c, 1)
		if err != nil {
			after, derr := redistest.Dump(ctx, rdb)
			if derr != nil {
				t.Fatal(derr)
			}
			if after != before {
				t.Fatalf("check %d failed (%v) after changing Redis: its retry debits again\nbefore: %s\nafter:  %s", call, err, before, after)
			}
			continue
		}
		if cr.Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("%d of 3 checks admitted on a full bucket of 2^53 tokens", admitted)
	}
}
