package scale

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// The population: key i is class i mod len(classes) of tenant i div
// len(classes). A tenant's tier (and so its keys' limits) follows its
// rank: the top 0.2% are enterprise, the next 4.8% pro, the rest free. How
// hard a key pushes against its limit is heavy-tailed: its peak demand
// over its limit is Pareto-distributed with index 1 (Zipf-like: the k-th
// hungriest key of n pushes about n/k times as hard as the median), so a
// few keys are far over their limits, a thin band is contended, and the
// bulk asks for a small part of their shares. Each key has a home region
// with 40–90% of its demand, a second region with 60% of the rest, and the
// remainder spread evenly. Nothing per key is stored: every quantity is a
// function of i and the seed (which draws the pushes and placements), so 10,000,000 keys cost a few arrays of floats while the
// run calibrates, and only the keys that ever come near the global tier
// are materialized.

type classSpec struct {
	name  string
	share float64 // of the tenant's demand
	rate  float64 // free tier, tokens/s (pro ×10, enterprise ×100)
}

var classes = []classSpec{
	{"read", 0.6, 100},
	{"write", 0.2, 20},
	{"search", 0.15, 50},
	{"export", 0.05, 10},
}

var tiers = []struct {
	name string
	mult float64
}{{"free", 1}, {"pro", 10}, {"enterprise", 100}}

// trackAt is the share of a region's static share above which a key's
// peak demand there makes the simulation model its bucket: below the
// scripts' marking threshold (half the static share), so a key is modeled
// before it could ever be marked.
const trackAt = 0.45

// population is the key space of a spec.
type population struct {
	n, regions int
	tenants    int
	zipf       float64
	// salt is the seed's: each key's push and placement are drawn from a
	// hash of its index and the salt (0 for seed 1).
	salt uint64
	// scale converts the unnormalized demand of a key into tokens/s: it
	// puts exactly the spec's contended fraction above a static share.
	scale float64
}

func (p *population) tenantOf(i int) int { return i / len(classes) }
func (p *population) classOf(i int) int  { return i % len(classes) }

// tierOf: the top 0.2% of tenants are enterprise, the next 4.8% pro.
func (p *population) tierOf(j int) int {
	switch {
	case j < max(1, p.tenants/500):
		return 2
	case j < max(1, p.tenants/20):
		return 1
	}
	return 0
}

func tenantName(j int) string { return fmt.Sprintf("t%07d", j) }

func (p *population) key(i int) quota.Key {
	return quota.Key{Tenant: tenantName(p.tenantOf(i)), Class: classes[p.classOf(i)].name}
}

// limit is key i's rate.
func (p *population) limit(i int) float64 {
	return classes[p.classOf(i)].rate * tiers[p.tierOf(p.tenantOf(i))].mult
}

// raw is key i's total demand at the day's peak before scaling: its
// limit times its Pareto push (from a uniform in (0, 1] drawn from i).
func (p *population) raw(i int) float64 {
	h := mix64(uint64(i) ^ 0x5ca1ab1e ^ p.salt)
	u := (float64(h>>11) + 1) / (1 << 53)
	return p.limit(i) * math.Pow(u, -1/p.zipf)
}

// seedSalt is what seed changes in every key's hash: another seed draws
// another population (seed 1 the one BENCHMARKS.md measures).
func seedSalt(seed uint64) uint64 { return mix64(seed) ^ mix64(1) }

// mix64 is SplitMix64's finalizer: key i's placement.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// placement is key i's home region, its share there, and its second
// region (which gets 60% of the rest; the others share the remainder).
func (p *population) placement(i int) (home int, share float64, second int) {
	h := mix64(uint64(i) ^ p.salt)
	home = int(h % uint64(p.regions))
	share = 0.4 + 0.5*float64((h>>16)&0xffff)/65535
	second = (home + 1 + int((h>>32)%uint64(p.regions-1))) % p.regions
	return home, share, second
}

// regionShare is key i's share of its demand in region g.
func (p *population) regionShare(i, g int) float64 {
	home, share, second := p.placement(i)
	return shareIn(g, home, share, second, p.regions)
}

func shareIn(g, home int, share float64, second, regions int) float64 {
	switch {
	case g == home:
		return share
	case regions == 2:
		return 1 - share
	case g == second:
		return (1 - share) * 0.6
	}
	return (1 - share) * 0.4 / float64(regions-2)
}

// pressure is key i's peak demand in its home region over its static
// share there (regions weigh the same), before scaling.
func (p *population) pressure(i int) float64 {
	_, share, _ := p.placement(i)
	return p.raw(i) * share * float64(p.regions) / p.limit(i)
}

// newPopulation calibrates the scale so that exactly round(contended·n)
// keys have a peak demand above a static share, and lists the keys to
// model (peak at or above trackAt of a static share).
func newPopulation(s *Spec) (*population, []int) {
	p := &population{n: s.Keys, regions: s.Regions, tenants: (s.Keys + len(classes) - 1) / len(classes), zipf: s.Zipf,
		salt: seedSalt(s.Seed)}
	pr := make([]float32, p.n)
	for i := range pr {
		pr[i] = float32(p.pressure(i))
	}
	sorted := slices.Clone(pr)
	slices.Sort(sorted)
	k := max(1, int(math.Round(s.Contended*float64(p.n))))
	hi := float64(sorted[p.n-k]) // the k-th largest
	lo := 0.0
	if p.n-k-1 >= 0 {
		lo = float64(sorted[p.n-k-1])
	}
	p.scale = 2 / (hi + lo)
	sorted = nil
	var tracked []int
	for i, v := range pr {
		if float64(v)*p.scale >= trackAt {
			tracked = append(tracked, i)
		}
	}
	return p, tracked
}

// curve is region g's demand at t as a share of its peak: a compressed
// day whose peak moves round the regions (region g peaks at g/R of the
// day).
func curve(t, day time.Duration, g, regions int, low float64) float64 {
	ph := float64(t)/float64(day) - float64(g)/float64(regions)
	return low + (1-low)*(1+math.Cos(2*math.Pi*ph))/2
}

// The data plane of keys that are not modeled is counted analytically.
// An instance holds a lease on a key while it saw a request for it
// within one lease TTL, and every holder reports the key in its Sync
// once per refresh: one script call each. With d requests/s spread over
// I instances, the holders number I·(1 − e^(−d·TTL/I)).
func holders(d float64, instances int, leaseTTL time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	in := float64(instances)
	return in * -math.Expm1(-d*leaseTTL.Seconds()/in)
}

// hist holds the unmodeled keys of one region by their peak demand, in
// logarithmic bins: count and sum of demand per bin. Counting their
// script calls per epoch is then a pass over the bins.
type hist struct{ cnt, sum []float64 }

const (
	histLo      = -10.0 // log10 of the smallest binned demand
	histPerDec  = 32
	histDecades = 18
)

func newHist() hist {
	n := histPerDec * histDecades
	return hist{cnt: make([]float64, n), sum: make([]float64, n)}
}

func (h hist) add(d, sign float64) {
	b := 0
	if d > 0 {
		b = int((math.Log10(d) - histLo) * histPerDec)
	}
	b = min(max(b, 0), len(h.cnt)-1)
	h.cnt[b] += sign
	h.sum[b] += sign * d
}

// coldHists bins every unmodeled key's peak demand per region. A key
// contributes to every region but its home and second region the same
// share, so those go to one histogram for all regions, less what the
// region's own home and second keys put there.
func (p *population) coldHists(tracked []int) []hist {
	isTracked := make(map[int]bool, len(tracked))
	for _, i := range tracked {
		isTracked[i] = true
	}
	R := p.regions
	home, second, othersHome, othersSecond := make([]hist, R), make([]hist, R), make([]hist, R), make([]hist, R)
	for g := range R {
		home[g], second[g], othersHome[g], othersSecond[g] = newHist(), newHist(), newHist(), newHist()
	}
	others := newHist()
	for i := range p.n {
		if isTracked[i] {
			continue
		}
		d := p.raw(i) * p.scale
		h, share, s := p.placement(i)
		home[h].add(d*shareIn(h, h, share, s, R), 1)
		second[s].add(d*shareIn(s, h, share, s, R), 1)
		if R > 2 {
			o := d * shareIn(-1, h, share, s, R)
			others.add(o, 1)
			othersHome[h].add(o, 1)
			othersSecond[s].add(o, 1)
		}
	}
	out := make([]hist, R)
	for g := range R {
		h := newHist()
		for b := range h.cnt {
			h.cnt[b] = home[g].cnt[b] + second[g].cnt[b] + others.cnt[b] - othersHome[g].cnt[b] - othersSecond[g].cnt[b]
			h.sum[b] = home[g].sum[b] + second[g].sum[b] + others.sum[b] - othersHome[g].sum[b] - othersSecond[g].sum[b]
			if h.cnt[b] < 0.5 {
				h.cnt[b], h.sum[b] = 0, 0
			}
		}
		out[g] = h
	}
	return out
}

// coldLoad is what region g's unmodeled keys offer (requests/s) and the
// script calls their lease holders make (per second) at demand level c.
func (h hist) coldLoad(c float64, instances int, leaseTTL, refresh time.Duration) (offered, calls float64) {
	for b, n := range h.cnt {
		if n == 0 {
			continue
		}
		d := h.sum[b] / n * c
		offered += n * d
		calls += n * holders(d, instances, leaseTTL) / refresh.Seconds()
	}
	return offered, calls
}

// regionName is region g's name.
func regionName(g int) string { return fmt.Sprintf("region-%02d", g) }

// configYAML is the Sluice config the run uses: equal region weights, the
// population's classes and tiers, the spec's global shards (pkg/shard's
// map assigns keys to them), and every modeled key's tenant above the
// free tier listed.
func (p *population) configYAML(tracked []int, shards int) string {
	var b strings.Builder
	b.WriteString("epoch: 1s\ngrant_validity: 5s\nlease_ttl: 5s\nrefresh: 1s\nregion_lease: 1m\ndefault_tier: free\n")
	fmt.Fprintf(&b, "global_shards: %d\nregions:\n", shards)
	for g := range p.regions {
		fmt.Fprintf(&b, "  %s: {weight: 1}\n", regionName(g))
	}
	b.WriteString("classes:\n")
	for _, c := range classes {
		fmt.Fprintf(&b, "  %s: {mode: lease, on_failure: local}\n", c.name)
	}
	b.WriteString("tiers:\n")
	for _, t := range tiers {
		fmt.Fprintf(&b, "  %s: {", t.name)
		for ci, c := range classes {
			if ci > 0 {
				b.WriteString(", ")
			}
			r := c.rate * t.mult
			fmt.Fprintf(&b, "%s: {rate: %g/s, burst: %d}", c.name, r, int64(2*r))
		}
		b.WriteString("}\n")
	}
	var listed []int
	seen := map[int]bool{}
	for _, i := range tracked {
		j := p.tenantOf(i)
		if p.tierOf(j) > 0 && !seen[j] {
			seen[j] = true
			listed = append(listed, j)
		}
	}
	sort.Ints(listed)
	if len(listed) > 0 {
		b.WriteString("tenants:\n")
		for _, j := range listed {
			fmt.Fprintf(&b, "  %s: {tier: %s}\n", tenantName(j), tiers[p.tierOf(j)].name)
		}
	}
	return b.String()
}

// parseConfig parses and validates the generated config.
func parseConfig(y string) (*config.Config, error) {
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		return nil, fmt.Errorf("the generated config: %w", err)
	}
	return cfg, nil
}
