package regionsync

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/rapidfuzz"
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
	conf := NewConfirmations(nil)
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
	if rev, ok := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); !ok || rev != 10 {
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
	if rev, _ := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); rev != 10 {
		t.Fatalf("confirmed %v before us reported the new revision", rev)
	}
	us = report("us", us)
	if rev, _ := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); rev != 20 {
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
	rapid.Check(t, chainNeverOversubscribes)
}

// chainNeverOversubscribes is the property of TestChainNeverOversubscribes.
func chainNeverOversubscribes(t *rapid.T) {
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
	conf := NewConfirmations(nil)
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
			rev, ok := conf.Advance(time.Time{}, chainRegions, 0, time.Time{})
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
		rev, _ := conf.Advance(time.Time{}, chainRegions, 0, time.Time{})
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
}

// TestChainWhenFull: a chain lists at most MaxChain configs and reports
// the confirmed one and the newest MaxConfigs-1 of them; a config adopted
// when it is full replaces the newest one if that was never reported, else
// runs unlisted (counted in Share and Len, the current config, never
// reported) until a confirmation frees room. The zero Chain runs nothing.
func TestChainWhenFull(t *testing.T) {
	if z := (Chain{}); z.Current() != (Revision{}) || z.Confirmed() != 0 || z.Len() != 0 {
		t.Fatalf("zero chain: current %+v, confirmed %d, len %d", z.Current(), z.Confirmed(), z.Len())
	}
	cfg := func(rev int64) *config.Config { return chainConfig(t, [3]float64{1, float64(rev), 1}, 100, 100) }
	small := chainConfig(t, [3]float64{1, 1, 8}, 100, 100) // eu 10/s
	revs := func(c Chain) []int64 { _, r := c.Reported(); return r }
	c := NewChain(1, cfg(1))
	for rev := int64(2); rev <= MaxChain; rev++ {
		c = c.Adopt(rev, cfg(rev))
	}
	if c.Len() != MaxChain || c.Current().Rev != MaxChain {
		t.Fatalf("len %d current %d, want %d", c.Len(), c.Current().Rev, MaxChain)
	}
	c = c.Adopt(20, cfg(20)) // the newest (16) was never reported: replaced
	if got, want := revs(c), []int64{1, 10, 11, 12, 13, 14, 15, 20}; !slices.Equal(got, want) || c.Len() != MaxChain {
		t.Fatalf("after replacing an unreported config: %v (len %d), want %v", got, c.Len(), want)
	}
	c, _ = c.Reported()
	if c.Adopt(20, cfg(1)).Current().Cfg != c.Current().Cfg {
		t.Fatal("adopting the current revision again changed the chain")
	}
	c = c.Adopt(30, small) // the newest reported: runs unlisted
	if got, want := revs(c), []int64{1, 10, 11, 12, 13, 14, 15, 20}; !slices.Equal(got, want) {
		t.Fatalf("an unlisted config was reported: %v", got)
	}
	if c.Len() != MaxChain+1 || c.Current().Rev != 30 || c.Confirmed() != 1 {
		t.Fatalf("unlisted: len %d, current %d, confirmed %d; want %d, 30, 1", c.Len(), c.Current().Rev, c.Confirmed(), MaxChain+1)
	}
	if r, _ := share(t, c, "eu"); r > 10.0001 {
		t.Fatalf("eu's share %v with an unlisted config giving it 10/s", r)
	}
	if c3 := c.Confirm(3); !slices.Equal(revs(c3), []int64{3, 11, 12, 13, 14, 15, 20, 30}) || c3.Len() != 15 {
		t.Fatalf("confirming 3 reports %v (len %d), want the unlisted 30 listed after 20", revs(c3), c3.Len())
	}
	c = c.Confirm(20)
	if got := revs(c); !slices.Equal(got, []int64{20, 30}) || c.Len() != 2 || c.Confirmed() != 20 {
		t.Fatalf("after confirming 20: %v (len %d, confirmed %d), want [20 30]", got, c.Len(), c.Confirmed())
	}
	if r, _ := share(t, c, "eu"); r > 10.0001 {
		t.Fatalf("eu's share %v after the unlisted config was listed, want at most 10", r)
	}
	if c2 := c.Confirm(20); !slices.Equal(revs(c2), []int64{20, 30}) {
		t.Fatalf("confirming the confirmed revision again changed the chain: %v", revs(c2))
	}
}

// TestRevisionsLeftOutOfReportsAreStillHeld: past MaxConfigs listed
// configs, a report leaves out the oldest adopted ones, but the chain
// keeps them: one of them confirmed on an earlier report is still found,
// and a small share under one still bounds the region's.
func TestRevisionsLeftOutOfReportsAreStillHeld(t *testing.T) {
	big := chainConfig(t, [3]float64{1, 2, 1}, 100, 100)   // eu 50/s
	small := chainConfig(t, [3]float64{1, 1, 8}, 100, 100) // eu 10/s
	c := NewChain(1, big).Adopt(2, small)
	c, first := c.Reported()
	if !slices.Equal(first, []int64{1, 2}) {
		t.Fatalf("first report %v, want [1 2]", first)
	}
	for rev := int64(3); rev <= MaxConfigs+2; rev++ {
		c = c.Adopt(rev, big)
		c, _ = c.Reported()
	}
	_, later := c.Reported()
	if slices.Contains(later, 2) || len(later) != MaxConfigs || later[0] != 1 || later[len(later)-1] != MaxConfigs+2 {
		t.Fatalf("report %v, want the confirmed 1 and the newest %d, 2 left out", later, MaxConfigs-1)
	}
	if r, _ := share(t, c, "eu"); r > 10.0001 {
		t.Fatalf("eu's share %v, want at most 10/s: revision 2 is held though not reported", r)
	}
	if c2 := c.Confirm(2); c2.Confirmed() != 2 || c2.Len() != c.Len()-1 {
		t.Fatalf("confirming 2 (on the first report): confirmed %d, len %d; want 2, %d", c2.Confirmed(), c2.Len(), c.Len()-1)
	}
}

// TestChainFullOfSkippedRevisionsConfirmsTheNewest: a region that adopted
// and reported seven revisions the other regions skipped still reports
// the config every region then runs, so that one is confirmed and the
// region's chain shrinks to it.
func TestChainFullOfSkippedRevisionsConfirmsTheNewest(t *testing.T) {
	cfgs := map[int64]*config.Config{}
	for rev := int64(1); rev <= 12; rev++ {
		cfgs[rev] = chainConfig(t, [3]float64{1, float64(rev%3 + 1), 1}, 100, 30)
	}
	eu := NewChain(1, cfgs[1])
	for _, rev := range []int64{2, 3, 4, 5, 6, 7, 10} {
		eu = eu.Adopt(rev, cfgs[rev])
		eu, _ = eu.Reported()
	}
	ap := NewChain(1, cfgs[1]).Adopt(3, cfgs[3])
	us := NewChain(1, cfgs[1])
	conf := NewConfirmations(nil)
	chains := map[string]*Chain{"ap": &ap, "eu": &eu, "us": &us}
	for range 2 {
		for _, name := range chainRegions {
			c, revs := chains[name].Adopt(12, cfgs[12]).Reported()
			*chains[name] = c
			conf.Observe(name, revs)
		}
		rev, _ := conf.Advance(time.Time{}, chainRegions, 0, time.Time{})
		for _, name := range chainRegions {
			*chains[name] = chains[name].Confirm(rev)
		}
	}
	if rev, _ := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); rev != 12 || eu.Len() != 1 || eu.Confirmed() != 12 {
		t.Fatalf("every region runs revision 12: confirmed %d, eu's chain %d configs from %d", rev, eu.Len(), eu.Confirmed())
	}
}

// TestConfirmationsObserveAndReserve: Observe says whether a region's
// revisions changed (a first report always does) and keeps the newest
// MaxConfigs; the confirmed revision never goes back; Reserve is the
// smallest share under the region's held revisions from the confirmed
// one on, and the largest under any held config for a region never heard
// from or reporting none held.
func TestConfirmationsObserveAndReserve(t *testing.T) {
	conf := NewConfirmations(nil)
	for _, c := range []struct {
		region string
		revs   []int64
		change bool
	}{
		{"eu", []int64{10}, true}, {"eu", []int64{10}, false}, {"eu", []int64{10, 20}, true},
		{"ap", nil, true}, {"ap", nil, false}, {"ap", []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, true},
	} {
		if got := conf.Observe(c.region, c.revs); got != c.change {
			t.Errorf("Observe(%s, %v) = %v, want %v", c.region, c.revs, got, c.change)
		}
	}
	if got, _ := conf.Reported("ap"); !slices.Equal(got, []int64{3, 4, 5, 6, 7, 8, 9, 10}) {
		t.Errorf("a long list kept as %v, want its newest %d", got, MaxConfigs)
	}
	// One revision more than MaxConfigs: the oldest is dropped too.
	conf.Observe("na", []int64{1, 2, 3, 4, 5, 6, 7, 8, 9})
	if got, _ := conf.Reported("na"); !slices.Equal(got, []int64{2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Errorf("a list one over the bound kept as %v, want its newest %d", got, MaxConfigs)
	}
	if _, heard := conf.Reported("us"); heard {
		t.Error("a region never heard from has reported")
	}
	cfgs := map[int64]*config.Config{
		10: chainConfig(t, [3]float64{1, 1, 2}, 100, 100), // eu 25/s
		20: chainConfig(t, [3]float64{1, 2, 1}, 100, 100), // eu 50/s
		30: chainConfig(t, [3]float64{1, 3, 1}, 100, 100), // eu 60/s
	}
	under := func(rev int64, region ...string) float64 {
		r, _ := ShareUnder(cfgs[rev], append(region, "eu")[0], chainKey)
		return r
	}
	conf = NewConfirmations(nil)
	conf.Observe("eu", []int64{10, 20, 40})
	if r, _ := conf.Reserve(cfgs, "eu", chainKey); r != under(10) {
		t.Errorf("reserve %v with nothing confirmed, want the smallest held, %v", r, under(10))
	}
	if r, _ := conf.Reserve(cfgs, "us", chainKey); r != max(under(10, "us"), under(20, "us"), under(30, "us")) || r != under(10, "us") {
		t.Errorf("reserve %v for a region never heard from, want the largest share of any held config", r)
	}
	conf.Observe("us", []int64{10, 20})
	conf.Observe("ap", []int64{20})
	if rev, ok := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); !ok || rev != 20 {
		t.Fatalf("confirmed %d %v, want 20", rev, ok)
	}
	if r, _ := conf.Reserve(cfgs, "eu", chainKey); r != under(20) {
		t.Errorf("reserve %v once 20 is confirmed, want its share %v (10 dropped, 20 counted)", r, under(20))
	}
	conf.Observe("ap", []int64{40})
	if r, _ := conf.Reserve(cfgs, "ap", chainKey); r != max(under(10, "ap"), under(20, "ap"), under(30, "ap")) || r != under(10, "ap") {
		t.Errorf("reserve %v for a region running only a config not held, want the largest", r)
	}
	conf.Observe("ap", []int64{10})
	if rev, ok := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); !ok || rev != 20 {
		t.Fatalf("confirmed %d %v after the regions share only an older revision, want 20 kept", rev, ok)
	}
}

// TestConfirmationsOfAStaticConfig: a static config's revision 0 is
// confirmed once every region reports it, and a later revision every
// region reports replaces it.
func TestConfirmationsOfAStaticConfig(t *testing.T) {
	conf := NewConfirmations(nil)
	for _, r := range chainRegions {
		conf.Observe(r, []int64{0})
	}
	if rev, ok := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); !ok || rev != 0 {
		t.Fatalf("confirmed %d %v, want revision 0", rev, ok)
	}
	for _, r := range chainRegions {
		conf.Observe(r, []int64{0, 5})
	}
	if rev, ok := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); !ok || rev != 5 {
		t.Fatalf("confirmed %d %v, want 5", rev, ok)
	}
}

// TestConfirmationsWithNoCommonRevision: regions that all reported but
// share no revision confirm nothing new: the last confirmed revision
// stays, and with none there is none.
func TestConfirmationsWithNoCommonRevision(t *testing.T) {
	conf := NewConfirmations(nil)
	for i, r := range chainRegions {
		conf.Observe(r, []int64{int64(i + 1)})
	}
	if rev, ok := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); ok || rev != 0 {
		t.Fatalf("confirmed %d %v with no revision in common, want none", rev, ok)
	}
	for _, r := range chainRegions {
		conf.Observe(r, []int64{4})
	}
	if rev, ok := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); !ok || rev != 4 {
		t.Fatalf("confirmed %d %v, want 4", rev, ok)
	}
	for i, r := range chainRegions {
		conf.Observe(r, []int64{int64(i + 5)})
	}
	if rev, ok := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); !ok || rev != 4 {
		t.Fatalf("confirmed %d %v with no revision in common, want 4 kept", rev, ok)
	}
}

// TestChainAdoptsOntoNoConfig: adopting the revision the chain's current
// entry carries changes nothing only when that entry holds a config; a
// chain running no config (the zero Chain, or one started on none) adopts
// a config at the same revision and runs it.
func TestChainAdoptsOntoNoConfig(t *testing.T) {
	cfg := chainConfig(t, [3]float64{1, 1, 2}, 100, 100)
	for _, c := range []struct {
		name  string
		chain Chain
		len   int
	}{
		{"the zero chain", Chain{}.Adopt(0, cfg), 1},
		{"a chain started on no config", NewChain(5, nil).Adopt(5, cfg), 2},
	} {
		if cur := c.chain.Current(); cur.Cfg != cfg || c.chain.Len() != c.len {
			t.Errorf("%s: current %+v, len %d; want the adopted config, len %d", c.name, cur, c.chain.Len(), c.len)
		}
	}
	if c := NewChain(5, cfg).Adopt(5, chainConfig(t, [3]float64{1, 2, 1}, 100, 100)); c.Current().Cfg != cfg || c.Len() != 1 {
		t.Errorf("adopting the running revision again: current %+v, len %d; want unchanged", c.Current(), c.Len())
	}
}

// TestChainConfirmsOnlyARevisionItRan: a listed revision without a config
// (adopted as none) is never confirmed: the chain keeps its confirmed
// revision and every config adopted since.
func TestChainConfirmsOnlyARevisionItRan(t *testing.T) {
	a := chainConfig(t, [3]float64{1, 1, 2}, 100, 100)
	b := chainConfig(t, [3]float64{1, 2, 1}, 100, 100)
	c := NewChain(1, a).Adopt(2, nil).Adopt(3, b)
	got := c.Confirm(2)
	_, revs := got.Reported()
	if got.Confirmed() != 1 || !slices.Equal(revs, []int64{1, 2, 3}) {
		t.Fatalf("confirming a revision held without a config: confirmed %d, revisions %v; want 1 and [1 2 3]", got.Confirmed(), revs)
	}
	if got := c.Confirm(3); got.Confirmed() != 3 || got.Len() != 1 {
		t.Fatalf("confirming 3: confirmed %d, len %d; want 3, 1", got.Confirmed(), got.Len())
	}
}

// TestUnlistedConfigBoundsRequestsUnderOthers: a config running unlisted
// (the chain full) bounds the share and the floor of a request served
// under any other config the chain holds, not only under itself.
func TestUnlistedConfigBoundsRequestsUnderOthers(t *testing.T) {
	big := partitionConfig(t, [3]float64{1, 1, 2}, "0.5", 1)   // eu 25/s
	small := partitionConfig(t, [3]float64{1, 1, 8}, "0.5", 1) // eu 10/s
	c := NewChain(1, big)
	for rev := int64(2); rev <= MaxChain; rev++ {
		c = c.Adopt(rev, big)
	}
	c, _ = c.Reported()
	c = c.Adopt(30, small)
	if c.Current().Rev != 30 || c.Len() != MaxChain+1 {
		t.Fatalf("current %d, len %d: want 30 running unlisted", c.Current().Rev, c.Len())
	}
	res, err := big.Resolve(chainKey)
	if err != nil {
		t.Fatal(err)
	}
	wantRate, wantBurst := ShareUnder(small, "eu", chainKey)
	if r, b, err := c.Share("eu", chainKey, big, res); err != nil || r != wantRate || b != wantBurst {
		t.Errorf("share under a listed config %v/%v (%v), want the unlisted one's %v/%v", r, b, err, wantRate, wantBurst)
	}
	wantRate, wantBurst = FloorUnder(small, "eu", chainKey)
	if r, b, err := c.Floor("eu", chainKey, big, res); err != nil || r != wantRate || b != wantBurst {
		t.Errorf("floor under a listed config %v/%v (%v), want the unlisted one's %v/%v", r, b, err, wantRate, wantBurst)
	}
}

// TestReserveTakesRateAndBurstEachOnTheirOwn: the reserve's rate and burst
// are each the smallest under a region's held revisions (and each the
// largest under any held config for a region never heard from), even when
// the smallest rate and the smallest burst come from different configs.
func TestReserveTakesRateAndBurstEachOnTheirOwn(t *testing.T) {
	cfgs := map[int64]*config.Config{
		10: chainConfig(t, [3]float64{1, 1, 2}, 100, 40), // eu 25/s, burst 10
		20: chainConfig(t, [3]float64{1, 1, 2}, 40, 100), // eu 10/s, burst 25
	}
	r10, b10 := ShareUnder(cfgs[10], "eu", chainKey)
	r20, b20 := ShareUnder(cfgs[20], "eu", chainKey)
	if !(r20 < r10 && b10 < b20) {
		t.Fatalf("eu's shares 10: %v/%v, 20: %v/%v; want the smaller rate under 20 and the smaller burst under 10", r10, b10, r20, b20)
	}
	conf := NewConfirmations(nil)
	conf.Observe("eu", []int64{10, 20})
	if r, b := conf.Reserve(cfgs, "eu", chainKey); r != r20 || b != b10 {
		t.Errorf("reserve of a region holding both: %v/%v, want %v/%v (the smallest of each)", r, b, r20, b10)
	}
	if r, b := conf.Reserve(cfgs, "ap", chainKey); r != r10 || b != b20 {
		t.Errorf("reserve of a region never heard from: %v/%v, want %v/%v (the largest of each)", r, b, r10, b20)
	}
}

// TestChainAnsweredConfirmsOnlyAKnownRevision: an answer changes the chain
// only when it says a revision is confirmed (confirmed_known); a revision
// number alone confirms nothing.
func TestChainAnsweredConfirmsOnlyAKnownRevision(t *testing.T) {
	c := NewChain(1, chainConfig(t, [3]float64{1, 1, 2}, 100, 100)).Adopt(2, chainConfig(t, [3]float64{1, 2, 1}, 100, 100))
	c, _ = c.Reported()
	if got := c.Answered(&sluicev1.RegionGrants{ConfirmedRevision: 2}); got.Confirmed() != 1 || got.Len() != 2 {
		t.Errorf("an answer with revision 2 not known: confirmed %d, len %d; want 1, 2", got.Confirmed(), got.Len())
	}
	if got := c.Answered(&sluicev1.RegionGrants{ConfirmedRevision: 2, ConfirmedKnown: true}); got.Confirmed() != 2 || got.Len() != 1 {
		t.Errorf("an answer confirming 2: confirmed %d, len %d; want 2, 1", got.Confirmed(), got.Len())
	}
}

// TestUnheldIsWhatReserveWouldTakeAndLacks: Unheld lists the revisions of
// a region's latest report not held, from the confirmed one on, etcd
// revisions only; once they are held, Reserve takes them, and a region
// running a config whose share exceeds every held one is reserved that.
func TestUnheldIsWhatReserveWouldTakeAndLacks(t *testing.T) {
	cfgs := map[int64]*config.Config{
		10: chainConfig(t, [3]float64{1, 1, 2}, 100, 100), // eu 25/s
		20: chainConfig(t, [3]float64{1, 2, 1}, 100, 100), // eu 50/s
	}
	x := chainConfig(t, [3]float64{1, 3, 1}, 100, 100) // eu 60/s
	conf := NewConfirmations(nil)
	if got := conf.Unheld(cfgs, "eu"); got != nil {
		t.Fatalf("unheld %v for a region never heard from, want none", got)
	}
	conf.Observe("eu", []int64{0, 30})
	if got := conf.Unheld(cfgs, "eu"); !slices.Equal(got, []int64{30}) {
		t.Fatalf("unheld %v, want [30] (0 is a static config, never in etcd)", got)
	}
	if r, _ := conf.Reserve(cfgs, "eu", chainKey); r < 49.999 || r > 50.001 {
		t.Fatalf("reserve %v with 30 not held, want the largest held share 50", r)
	}
	cfgs[30] = x
	if got := conf.Unheld(cfgs, "eu"); got != nil {
		t.Fatalf("unheld %v once 30 is held, want none", got)
	}
	if r, _ := conf.Reserve(cfgs, "eu", chainKey); r < 59.999 || r > 60.001 {
		t.Fatalf("reserve %v with 30 held, want eu's share under it, 60", r)
	}
	// Revisions older than the confirmed one bound nothing: not listed,
	// held or not (15 is not held).
	for _, region := range chainRegions {
		conf.Observe(region, []int64{15, 20, 40})
	}
	if rev, ok := conf.Advance(time.Time{}, chainRegions, 0, time.Time{}); !ok || rev != 40 {
		t.Fatalf("confirmed %d %v, want 40", rev, ok)
	}
	if got := conf.Unheld(cfgs, "eu"); !slices.Equal(got, []int64{40}) {
		t.Fatalf("unheld %v once 40 is confirmed, want [40] (15 and 20 are older)", got)
	}
}

// TestUnheldFromTheFirstEtcdRevision: every etcd revision (from 1) of a
// report that is not held is listed; 0, a static config, never is.
func TestUnheldFromTheFirstEtcdRevision(t *testing.T) {
	conf := NewConfirmations(nil)
	conf.Observe("eu", []int64{0, 1, 2})
	if got := conf.Unheld(map[int64]*config.Config{2: chainConfig(t, [3]float64{1, 1, 1}, 100, 100)}, "eu"); !slices.Equal(got, []int64{1}) {
		t.Fatalf("unheld %v, want [1]", got)
	}
}

// FuzzChainNeverOversubscribes searches chainNeverOversubscribes with the
// fuzzer choosing the configs, the regions' adoptions and every loss, delay
// and reordering.
func FuzzChainNeverOversubscribes(f *testing.F) {
	rapidfuzz.AddSeeds(f, 32, 1<<16)
	f.Fuzz(rapid.MakeFuzz(chainNeverOversubscribes))
}

// TestConfirmsOnlyAHeldRevision: a revision every region reported is
// confirmed only once the global tier holds its config; until then the
// newest held one they share is.
func TestConfirmsOnlyAHeldRevision(t *testing.T) {
	held := map[int64]bool{1: true}
	conf := NewConfirmations(func(rev int64) bool { return held[rev] })
	regions := []string{"a", "b"}
	conf.Observe("a", []int64{1, 2})
	conf.Observe("b", []int64{1, 2})
	if rev, ok := conf.Advance(time.Time{}, regions, 0, time.Time{}); !ok || rev != 1 {
		t.Fatalf("revision 2 not held: confirmed %d (%v), want 1", rev, ok)
	}
	held[2] = true
	if rev, ok := conf.Advance(time.Time{}, regions, 0, time.Time{}); !ok || rev != 2 {
		t.Fatalf("revision 2 held: confirmed %d (%v), want 2", rev, ok)
	}
	delete(held, 2)
	if rev, ok := conf.Advance(time.Time{}, regions, 0, time.Time{}); !ok || rev != 2 {
		t.Fatalf("a confirmation never goes back: confirmed %d (%v), want 2", rev, ok)
	}
}

// TestConfirmationWaitsForGrantsSizedBefore: a revision every region
// reported is assumed at once (Reserve counts each region at its share
// under it) and confirmed only once it has been assumed for the wait and
// the grants of an earlier allocator have ended; a revision every region
// already reports as confirmed to it is confirmed at once; an older
// assumed revision whose wait ended is confirmed while a newer one waits.
func TestConfirmationWaitsForGrantsSizedBefore(t *testing.T) {
	drained := chainConfig(t, [3]float64{1, 1, 2}, 100, 100) // eu 25/s
	grown := chainConfig(t, [3]float64{1, 2, 1}, 100, 100)   // eu 50/s
	cfgs := map[int64]*config.Config{10: drained, 20: grown, 30: grown}
	const wait = time.Second
	t0 := time.Unix(1000, 0)
	conf := NewConfirmations(nil)
	report := func(revs ...int64) {
		for _, r := range chainRegions {
			conf.Observe(r, revs)
		}
	}
	step := func(at time.Duration, notBefore time.Time, wantRev int64, wantOK bool, wantAssumed int64) {
		t.Helper()
		rev, ok := conf.Advance(t0.Add(at), chainRegions, wait, notBefore)
		if rev != wantRev || ok != wantOK {
			t.Fatalf("at %v: confirmed %d (%v), want %d (%v)", at, rev, ok, wantRev, wantOK)
		}
		if a, _ := conf.Assumed(); a != wantAssumed {
			t.Fatalf("at %v: assumed %d, want %d", at, a, wantAssumed)
		}
	}
	// Every region on 10, reported as confirmed to it: confirmed at once.
	report(10)
	step(0, time.Time{}, 10, true, 10)
	if r, _ := conf.Reserve(cfgs, "eu", chainKey); r > 25.001 {
		t.Fatalf("eu reserved %v/s on 10, want its 25/s", r)
	}
	// 20 raises eu: assumed at once, confirmed one wait later.
	report(10, 20)
	step(100*time.Millisecond, time.Time{}, 10, true, 20)
	if r, _ := conf.Reserve(cfgs, "eu", chainKey); r < 49.99 {
		t.Fatalf("eu reserved %v/s while 20 waits, want its 50/s under 20", r)
	}
	step(wait, time.Time{}, 10, true, 20)
	// An earlier allocator's grants keep it waiting past its own wait.
	step(wait+100*time.Millisecond, t0.Add(2*wait), 10, true, 20)
	// 30 is reported before 20's wait ends: 20 is still confirmed on
	// time, 30 one wait after it was assumed.
	report(10, 20, 30)
	step(wait+150*time.Millisecond, time.Time{}, 20, true, 30)
	step(2*wait, time.Time{}, 20, true, 30)
	step(2*wait+150*time.Millisecond, time.Time{}, 30, true, 30)
	// A confirmation never goes back; regions reporting only 30 first.
	report(30)
	step(3*wait, time.Time{}, 30, true, 30)
}

// TestStepSaysWhatMoved: Step reports the assumed revision moving when
// every region reports a new one, the confirmed one moving a wait later,
// and nothing in between.
func TestStepSaysWhatMoved(t *testing.T) {
	conf := NewConfirmations(nil)
	t0 := time.Unix(1000, 0)
	for _, r := range chainRegions {
		conf.Observe(r, []int64{10, 20})
	}
	for _, c := range []struct {
		at                        time.Duration
		assumedMoved, confirmMove bool
	}{{0, true, false}, {500 * time.Millisecond, false, false}, {time.Second, false, true}, {2 * time.Second, false, false}} {
		a, r := conf.Step(t0.Add(c.at), chainRegions, time.Second, time.Time{})
		if a != c.assumedMoved || r != c.confirmMove {
			t.Fatalf("at %v: assumed moved %v, confirmed moved %v; want %v, %v", c.at, a, r, c.assumedMoved, c.confirmMove)
		}
	}
}
