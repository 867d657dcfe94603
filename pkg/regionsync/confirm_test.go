package regionsync

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

var chainKey = quota.Key{Tenant: "acme", Class: "write"}

var chainRegions = []string{"ap", "eu", "us"}

// chainConfig is a valid config with the given region weights and acme's
// write limit.
func chainConfig(t interface{ Fatalf(string, ...any) }, w [3]float64, rate, burst int) *config.Config {
	y := fmt.Sprintf(`
regions: {ap: {weight: %g}, eu: {weight: %g}, us: {weight: %g}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: %d/s, burst: %d}}}
default_tier: free
`, w[0], w[1], w[2], rate, burst)
	c, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return c
}

func share(t interface{ Fatalf(string, ...any) }, c Chain, region string) (float64, float64) {
	res, err := c.Current().Cfg.Resolve(chainKey)
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	r, b, err := c.Share(region, chainKey, c.Current().Cfg, res)
	if err != nil {
		t.Fatalf("share: %v", err)
	}
	return r, b
}

// TestChainRaisesOnlyAfterConfirmation: a region adopting a larger weight
// keeps its old share until the global tier confirms the new revision,
// which it does only once every region reported it; a smaller weight
// applies at once.
func TestChainRaisesOnlyAfterConfirmation(t *testing.T) {
	old := chainConfig(t, [3]float64{1, 1, 2}, 100, 100) // us 50/s, eu 25/s
	grown := chainConfig(t, [3]float64{1, 2, 1}, 100, 100)
	conf := NewConfirmations()
	eu, us, ap := NewChain(10, old), NewChain(10, old), NewChain(10, old)
	eu = eu.Adopt(20, grown) // eu adopts the change; us is cut off from etcd
	if r, _ := share(t, eu, "eu"); r > 25.0001 {
		t.Fatalf("eu raised its share to %v before confirmation", r)
	}
	report := func(region string, c Chain) Chain {
		c, revs := c.Reported()
		conf.Observe(region, revs)
		return c
	}
	eu, us, ap = report("eu", eu), report("us", us), report("ap", ap)
	if rev, ok := conf.Confirm(chainRegions); !ok || rev != 10 {
		t.Fatalf("confirmed %v %v, want 10", rev, ok)
	}
	eu = eu.Confirm(10)
	if r, _ := share(t, eu, "eu"); r > 25.0001 {
		t.Fatalf("eu raised its share to %v while us runs the old config", r)
	}
	ap = report("ap", ap.Adopt(20, grown))
	us = us.Adopt(20, grown) // us adopts: its decrease applies at once
	if r, _ := share(t, us, "us"); r > 25.0001 {
		t.Fatalf("us kept %v after adopting a smaller weight", r)
	}
	if rev, _ := conf.Confirm(chainRegions); rev != 10 {
		t.Fatalf("confirmed %v before us reported the new revision", rev)
	}
	us = report("us", us)
	if rev, _ := conf.Confirm(chainRegions); rev != 20 {
		t.Fatalf("confirmed %v, want 20", rev)
	}
	eu = eu.Confirm(20)
	if r, _ := share(t, eu, "eu"); r < 49.999 {
		t.Fatalf("eu share %v after confirmation, want 50", r)
	}
	_ = ap
}

// TestChainNeverOversubscribes: regions adopt a sequence of configs
// (weights and limits) at different times, some skipping revisions and one
// perhaps never adopting anything; reports and answers are lost, delayed
// and reordered. At every instant Σ static rates ≤ r and Σ static caps ≤ b
// under the newest confirmed config (which every region still honours),
// and the global tier's reserve for each region is at least what it uses.
func TestChainNeverOversubscribes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nCfg := rapid.IntRange(2, 12).Draw(t, "configs")
		cfgs := make([]*config.Config, nCfg) // revision i+1 = cfgs[i]
		for i := range cfgs {
			var w [3]float64
			for j := range w {
				w[j] = float64(rapid.IntRange(1, 5).Draw(t, "w"))
			}
			cfgs[i] = chainConfig(t, w, rapid.IntRange(1, 200).Draw(t, "rate"), rapid.IntRange(1, 40).Draw(t, "burst"))
		}
		held := map[int64]*config.Config{}
		for i, c := range cfgs {
			held[int64(i+1)] = c
		}
		stuck := rapid.IntRange(-1, 2).Draw(t, "stuck") // a region that never adopts (-1: none)
		chains := make([]Chain, 3)
		adopted := make([]int, 3) // index into cfgs of each region's newest
		for i := range chains {
			chains[i] = NewChain(1, cfgs[0])
		}
		conf := NewConfirmations()
		var inflight []struct {
			region int
			rev    int64
			ok     bool
		}
		newest := int64(1) // newest confirmed revision (the start counts)
		check := func(step string) {
			z := held[newest]
			res, err := z.Resolve(chainKey)
			if err != nil {
				t.Fatalf("resolve: %v", err)
			}
			var sr, sb float64
			for i, name := range chainRegions {
				r, b := share(t, chains[i], name)
				sr += r
				sb += b
				if _, heard := conf.Reported(name); heard {
					rr, rb := conf.Reserve(held, name, chainKey)
					if r > rr*(1+1e-12)+1e-12 || b > rb+1e-12 {
						t.Fatalf("%s: %s uses %v/%v above the global reserve %v/%v", step, name, r, b, rr, rb)
					}
				}
			}
			if sr > res.Limit.Rate*(1+1e-9) || sb > float64(res.Limit.Burst)+1e-9 {
				t.Fatalf("%s: Σ static %v/s, %v tokens above r=%v b=%v of confirmed revision %d",
					step, sr, sb, res.Limit.Rate, res.Limit.Burst, newest)
			}
		}
		check("start")
		steps := rapid.IntRange(1, 80).Draw(t, "steps")
		for s := range steps {
			i := rapid.IntRange(0, 2).Draw(t, "region")
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0: // adopt a later config, perhaps skipping some
				if i == stuck || adopted[i] == nCfg-1 {
					continue
				}
				adopted[i] = rapid.IntRange(adopted[i]+1, nCfg-1).Draw(t, "to")
				chains[i] = chains[i].Adopt(int64(adopted[i]+1), cfgs[adopted[i]])
			case 1: // report; the answer carries the confirmation (or is lost)
				c, revs := chains[i].Reported()
				chains[i] = c
				if rapid.Bool().Draw(t, "report lost") {
					continue
				}
				conf.Observe(chainRegions[i], revs)
				rev, ok := conf.Confirm(chainRegions)
				if ok && rev > newest {
					newest = rev
				}
				inflight = append(inflight, struct {
					region int
					rev    int64
					ok     bool
				}{i, rev, ok})
			case 2: // deliver some answer in flight (any order)
				if len(inflight) == 0 {
					continue
				}
				j := rapid.IntRange(0, len(inflight)-1).Draw(t, "answer")
				a := inflight[j]
				inflight = append(inflight[:j], inflight[j+1:]...)
				if a.ok {
					chains[a.region] = chains[a.region].Confirm(a.rev)
				}
			case 3: // drop an answer
				if len(inflight) > 0 {
					inflight = inflight[1:]
				}
			}
			check(fmt.Sprintf("step %d", s))
		}
		// Liveness: once every region runs the last config, reports and
		// hears back, all run exactly its shares.
		if stuck >= 0 {
			return
		}
		for round := 0; round < 2; round++ {
			for i := range chains {
				chains[i] = chains[i].Adopt(int64(nCfg), cfgs[nCfg-1])
				c, revs := chains[i].Reported()
				chains[i] = c
				conf.Observe(chainRegions[i], revs)
			}
			rev, _ := conf.Confirm(chainRegions)
			for i := range chains {
				chains[i] = chains[i].Confirm(rev)
			}
		}
		for i, name := range chainRegions {
			r, b := share(t, chains[i], name)
			wr, wb := ShareUnder(cfgs[nCfg-1], name, chainKey)
			if r != wr || b != wb {
				t.Fatalf("%s runs %v/%v after everyone adopted the last config, want %v/%v", name, r, b, wr, wb)
			}
		}
	})
}
