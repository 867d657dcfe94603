package hierarchy

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// goldenDigest is the SHA-256 of every output of TestGoldenDecisions'
// random epochs: each answer's grants (key, rate and burst bits,
// validity) and static lease, every error, nudge, ReportAgain, lapse
// decision and View along the way, then WaterFill and StaticBursts over
// random regions. It was
// recorded from the allocator before its epoch was made faster, so a
// change that alters a single decision (or a single bit of one) fails
// TestGoldenDecisions. Change it only with a change meant to decide
// differently, and say so in that change. Changed since: a short grant to
// a returning region is checked against its static share instead of its
// floor (lanesFor; only grants to returning regions decide differently);
// a region that reads no demand for a key within a hold of its last
// reading above the unit floor still counts as asking (wantHold, held:
// slow keys' units stayed nowhere), and View shows that HeldDemand; a
// region whose counted share falls (SetLimit, SetRegions) while a grant
// of the key may be live keeps counting at its former share until that
// grant ends (holdLoweredShares: grants at a share leave no record); a
// held grant the allocator cannot place (a pseudo record) has no lower
// bound on its expiry, so a region that acknowledges one may fall back to
// its static share at any time (fence.acknowledge); an acknowledgement
// that frees capacity of a key also nudges every region whose target for
// it is materially above what it may use (nudgeRaises: only the nudges
// changed, the digest without them stayed the same); a report whose demand
// exceeds the region's static share makes a key winding down to its
// static shares contended again at once, not at the next Allocate
// (Report; TestARiseMakesAKeyWindingDownContendedAgain).
const goldenDigest = "b23da19459e502b583fbf1a33e75cc45788d221c847acad7e8b5721295ddf81f"

// goldenWorlds × goldenEpochs random epochs make up the run.
const (
	goldenWorlds = 24
	goldenEpochs = 125
)

func TestGoldenDecisions(t *testing.T) {
	h := sha256.New()
	epochs, grants := 0, 0
	for w := range goldenWorlds {
		g := newGoldenWorld(t, uint64(w)+1, h)
		for range goldenEpochs {
			grants += g.epoch()
			epochs++
		}
	}
	goldenFills(h)
	got := hex.EncodeToString(h.Sum(nil))
	t.Logf("%d epochs, %d grants", epochs, grants)
	if got != goldenDigest {
		t.Fatalf("the allocator's outputs changed: digest %s, recorded %s", got, goldenDigest)
	}
}

// goldenFills hashes WaterFill and StaticBursts over random regions (up to
// 40 of them, more than the allocator's worlds have).
func goldenFills(h hash.Hash) {
	r := goldenRand{s: 77}
	var b []byte
	for range 3000 {
		n := 1 + r.intn(6)
		if r.chance(0.3) {
			n = 1 + r.intn(40)
		}
		regions := make([]Region, n)
		demand := make([]float64, n)
		for i := range regions {
			regions[i] = Region{Name: fmt.Sprintf("r%02d", i), Weight: []float64{1, 2, 0.5, 3.3}[r.intn(4)]}
			if r.chance(0.3) {
				regions[i].MinShare = 0.5 / float64(n) * r.float()
			}
			if r.chance(0.3) {
				regions[i].MaxShare = max(regions[i].MinShare, r.float())
			}
			demand[i] = []float64{0, 10 * r.float(), 100 * r.float(), 50}[r.intn(4)]
		}
		rate := 1 + 200*r.float()
		out := make([]float64, n)
		err := WaterFill(rate, regions, demand, out)
		b = fmt.Appendf(b[:0], "%v", err)
		for _, x := range out {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
		}
		StaticBursts(float64(r.intn(40)), []float64{1, 2.5, 0}[r.intn(3)], regions, out)
		for _, x := range out {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
		}
		h.Write(b)
	}
}

// goldenRand is splitmix64: a generator whose sequence no library release
// can change.
type goldenRand struct{ s uint64 }

func (r *goldenRand) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (r *goldenRand) float() float64        { return float64(r.next()>>11) / (1 << 53) }
func (r *goldenRand) intn(n int) int        { return int(r.next() % uint64(n)) }
func (r *goldenRand) chance(p float64) bool { return r.float() < p }

// goldenHeld is what a model region holds for one key.
type goldenHeld struct {
	rate, burst float64
	expiry      int64 // ns since base, on the region's clock (= the allocator's here)
}

type goldenRegion struct {
	name    string
	seq     uint64
	held    map[quota.Key]goldenHeld
	demand  map[quota.Key]float64
	quietTo int // epoch until which it sends nothing
	last    *Report
}

type goldenWorld struct {
	tb      testing.TB
	r       goldenRand
	h       hash.Hash
	a       *Allocator
	base    time.Time
	now     int64
	epochNS int64
	regions []Region
	state   []*goldenRegion
	keys    []quota.Key
	limits  map[quota.Key]KeyLimit
	nextKey int
	n       int // epochs run
	buf     []byte
	// steady: regions read their demand exactly (no noise), so the inputs
	// of a key's targets often repeat (TestTargetMemoMatchesRecomputation).
	steady bool
}

func newGoldenWorld(tb testing.TB, seed uint64, h hash.Hash) *goldenWorld {
	g := &goldenWorld{tb: tb, r: goldenRand{s: seed * 0x2545f4914f6cdd1d}, h: h, base: time.Unix(1_700_000_000, 0), limits: map[quota.Key]KeyLimit{}}
	nr := 1 + g.r.intn(6)
	if g.r.chance(0.15) {
		nr = 8 + g.r.intn(8) // more than a dozen: the water level sorts differently
	}
	g.regions = g.randomRegions(nr, nil)
	nr = len(g.regions)
	epoch := time.Duration(200+g.r.intn(4)*400) * time.Millisecond
	g.epochNS = int64(epoch)
	opts := Options{Regions: g.regions, Epoch: epoch, Validity: time.Duration(1+g.r.intn(6)) * epoch}
	if g.r.chance(0.5) {
		opts.RegionLease = opts.Validity + time.Duration(g.r.intn(4))*epoch
	}
	if g.r.chance(0.3) {
		opts.DemandAlpha = 0.1 + 0.9*g.r.float()
	}
	if g.r.chance(0.3) {
		opts.SilenceTimeout = time.Duration(1+g.r.intn(4)) * epoch
	}
	if g.r.chance(0.2) {
		opts.Lapsed = []string{g.regions[g.r.intn(nr)].Name, "gone"}
	}
	a, err := NewAllocator(opts, g.base)
	if err != nil {
		tb.Fatal(err)
	}
	g.a = a
	for _, r := range g.regions {
		g.state = append(g.state, &goldenRegion{name: r.Name, held: map[quota.Key]goldenHeld{}, demand: map[quota.Key]float64{}})
	}
	nKeys := 3 + g.r.intn(25)
	if seed%8 == 0 {
		nKeys = 1100 + g.r.intn(200) // enough to renumber slots when most go
	}
	for range nKeys {
		g.addKey()
	}
	return g
}

// randomRegions draws nr regions, keeping some names of prev.
func (g *goldenWorld) randomRegions(nr int, prev []Region) []Region {
	for {
		var out []Region
		used := map[string]bool{}
		for i := range nr {
			name := fmt.Sprintf("r%d", g.r.intn(9+nr))
			if i < len(prev) && g.r.chance(0.7) {
				name = prev[i].Name
			}
			if used[name] {
				continue
			}
			used[name] = true
			r := Region{Name: name, Weight: []float64{1, 1, 2, 3, 0.5, 1.7}[g.r.intn(6)]}
			if g.r.chance(0.2) {
				r.MinShare = 0.1 * g.r.float()
			}
			if g.r.chance(0.2) {
				r.MaxShare = max(r.MinShare, 0.3+0.7*g.r.float())
			}
			if g.r.chance(0.1) {
				r.Drained = true
			}
			out = append(out, r)
		}
		if len(out) > 0 && ValidateRegions(out) == nil {
			return out
		}
	}
}

func (g *goldenWorld) randomLimit() KeyLimit {
	nr := len(g.regions)
	l := KeyLimit{Rate: []float64{10, 100, 1000, 5000, 1 + 300*g.r.float()}[g.r.intn(5)]}
	switch g.r.intn(4) {
	case 0:
		l.Burst = float64(1 + g.r.intn(5))
	case 1:
		l.Burst = 2 * l.Rate
	default:
		l.Burst = 1 + 3000*g.r.float()
	}
	if g.r.chance(0.3) {
		l.Unit = []float64{1, 2.5, 10, 0.5}[g.r.intn(4)]
	}
	if g.r.chance(0.4) {
		l.FloorShare = []float64{0.5, 1, 0.25 * g.r.float()}[g.r.intn(3)]
	}
	some := func(total float64) []float64 {
		v := make([]float64, nr)
		for i := range v {
			v[i] = total * g.r.float() / float64(nr)
		}
		return v
	}
	if g.r.chance(0.08) {
		l.StaticRate = some(l.Rate)
	}
	if g.r.chance(0.08) {
		l.StaticBurst = some(l.Burst)
	}
	if g.r.chance(0.05) {
		l.FloorRate = some(l.Rate / 2)
	}
	if g.r.chance(0.05) {
		l.FloorBurst = some(l.Burst / 2)
	}
	return l
}

func (g *goldenWorld) addKey() {
	k := quota.Key{Tenant: fmt.Sprintf("t%05d", g.nextKey), Class: []string{"read", "write"}[g.r.intn(2)]}
	g.nextKey++
	l := g.randomLimit()
	g.out("setlimit", g.a.SetLimit(k, l))
	g.keys = append(g.keys, k)
	g.limits[k] = l
	for _, st := range g.state {
		st.demand[k] = g.randomDemand(l)
	}
}

func (g *goldenWorld) randomDemand(l KeyLimit) float64 {
	switch g.r.intn(4) {
	case 0:
		return 0
	case 1:
		return l.Rate * 0.05 * g.r.float()
	case 2:
		return l.Rate * g.r.float()
	}
	return l.Rate * 2 * g.r.float()
}

func (g *goldenWorld) wall(t int64) time.Time { return g.base.Add(time.Duration(t)) }

// out folds values into the digest.
func (g *goldenWorld) out(tag string, vs ...any) {
	b := append(g.buf[:0], tag...)
	b = append(b, 0)
	for _, v := range vs {
		switch x := v.(type) {
		case nil:
			b = append(b, 'n')
		case error:
			b = append(b, x.Error()...)
			b = append(b, 0)
		case string:
			b = append(b, x...)
			b = append(b, 0)
		case []string:
			for _, s := range x {
				b = append(b, s...)
				b = append(b, 0)
			}
			b = append(b, 1)
		case bool:
			b = append(b, map[bool]byte{false: 'f', true: 't'}[x])
		case int:
			b = binary.LittleEndian.AppendUint64(b, uint64(x))
		case uint64:
			b = binary.LittleEndian.AppendUint64(b, x)
		case time.Duration:
			b = binary.LittleEndian.AppendUint64(b, uint64(x))
		case time.Time:
			b = binary.LittleEndian.AppendUint64(b, uint64(x.Sub(g.base)))
		case float64:
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
		case []float64:
			for _, f := range x {
				b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
			}
			b = append(b, 2)
		case quota.Key:
			b = append(b, x.Tenant...)
			b = append(b, 0)
			b = append(b, x.Class...)
			b = append(b, 0)
		default:
			g.tb.Fatalf("golden: cannot hash %T", v)
		}
	}
	g.buf = b
	g.h.Write(b)
}

// epoch runs one allocation epoch with reports from the regions in a
// random order, lost and retried answers, silences, config changes and
// leader changes, and returns how many grants were answered.
func (g *goldenWorld) epoch() int {
	g.n++
	g.now += g.epochNS + int64(g.r.intn(20))*int64(time.Millisecond)
	g.maybeChange()
	g.a.Allocate(g.wall(g.now))
	g.out("epoch", g.a.Epoch(), g.a.Learning(g.wall(g.now)))
	grants := 0
	order := make([]int, len(g.state))
	for i := range order {
		order[i] = i
	}
	for i := len(order) - 1; i > 0; i-- {
		j := g.r.intn(i + 1)
		order[i], order[j] = order[j], order[i]
	}
	for _, ri := range order {
		st := g.state[ri]
		if g.n < st.quietTo {
			continue
		}
		if g.r.chance(0.03) {
			st.quietTo = g.n + 1 + g.r.intn(25) // silent, sometimes long enough to lapse
			continue
		}
		window := g.epochNS
		if g.r.chance(0.1) {
			window = g.epochNS * int64(2+g.r.intn(6)) / 4 // late, or covering more than an epoch
		}
		grants += g.report(ri, window)
		if g.r.chance(0.15) {
			// An early report (an acknowledgement or a nudge's answer).
			grants += g.report(ri, g.epochNS/4)
		}
	}
	g.out("nudges", g.a.TakeNudges())
	for _, r := range g.regions {
		g.out("again", g.a.ReportAgain(r.Name))
		seq, ok := g.a.LastSeq(r.Name)
		g.out("lastseq", seq, ok)
	}
	g.persist()
	if g.n%10 == 0 || len(g.keys) < 50 && g.n%3 == 0 {
		g.view()
	}
	return grants
}

// report sends region ri's report (window long) and applies the answer.
func (g *goldenWorld) report(ri int, window int64) int {
	st := g.state[ri]
	g.now += int64(1+g.r.intn(30)) * int64(time.Millisecond)
	sendAt := g.now
	if st.last != nil && g.r.chance(0.05) {
		// A retry of the previous report, whose answer was lost.
		ans, err := g.a.Report(g.wall(sendAt), *st.last)
		g.out("retry", err)
		g.answer(ans, err)
		return len(ans.Grants)
	}
	rep := Report{Region: st.name}
	st.seq++
	rep.Seq = st.seq
	if g.r.chance(0.02) && st.seq > 2 {
		rep.Seq = st.seq - 2 // stale
	}
	keys := slices.Clone(g.keys)
	if g.r.chance(0.3) {
		for i := len(keys) - 1; i > 0; i-- {
			j := g.r.intn(i + 1)
			keys[i], keys[j] = keys[j], keys[i]
		}
	}
	for _, k := range keys {
		if g.r.chance(0.1) {
			continue // not reported this time
		}
		l, known := g.limits[k]
		if !known {
			continue
		}
		kd := KeyDemand{Key: k, Window: time.Duration(window)}
		d := st.demand[k] * (0.8 + 0.4*g.r.float())
		if g.steady {
			d = st.demand[k]
		}
		kd.Admitted = d * time.Duration(window).Seconds()
		if g.r.chance(0.2) {
			if denied := kd.Admitted * 0.3 * g.r.float(); !g.steady {
				kd.Denied = denied
			}
		}
		if h, ok := st.held[k]; ok && h.expiry > sendAt {
			kd.HeldRate, kd.HeldBurst = h.rate, h.burst
			kd.HeldValid = time.Duration(h.expiry-sendAt) / time.Millisecond * time.Millisecond
			if g.r.chance(0.02) {
				kd.HeldRate *= 1.5 // an inexact echo
			}
			kd.Holding = h.burst * g.r.float()
			if g.r.chance(0.1) {
				kd.Holding = h.burst * 2 * g.r.float()
			}
		} else {
			kd.Holding = l.Burst * 0.5 * g.r.float()
		}
		if g.r.chance(0.01) {
			kd.SetDemandRate(l.Rate * g.r.float())
		}
		rep.Keys = append(rep.Keys, kd)
	}
	if g.r.chance(0.02) {
		for i := range 1 + g.r.intn(3) {
			rep.Keys = append(rep.Keys, KeyDemand{Key: quota.Key{Tenant: fmt.Sprintf("unknown%d", g.r.intn(30)+i*30), Class: "read"}, Admitted: 1, Window: time.Second})
		}
	}
	if g.r.chance(0.01) && len(rep.Keys) > 0 {
		rep.Keys[g.r.intn(len(rep.Keys))].Admitted = math.NaN() // refused whole
	}
	if g.r.chance(0.01) && len(rep.Keys) > 1 {
		rep.Keys = append(rep.Keys, rep.Keys[0]) // duplicate: refused
	}
	recvAt := sendAt + int64(g.r.intn(15))*int64(time.Millisecond)
	ans, err := g.a.Report(g.wall(recvAt), rep)
	g.out("report", err)
	if err == nil {
		st.last = &rep
	} else {
		st.seq = max(st.seq, rep.Seq)
	}
	if err != nil || g.r.chance(0.06) {
		g.answer(ans, err) // lost on the way: hashed, not applied
		return len(ans.Grants)
	}
	g.answer(ans, err)
	for _, gr := range ans.Grants {
		st.held[gr.Key] = goldenHeld{rate: gr.Rate, burst: gr.Burst, expiry: sendAt + int64(gr.Valid)}
	}
	return len(ans.Grants)
}

func (g *goldenWorld) answer(ans Answer, err error) {
	g.out("answer", err, ans.StaticLease, len(ans.Grants))
	for _, gr := range ans.Grants {
		g.out("g", gr.Key, gr.Rate, gr.Burst, gr.Valid)
	}
}

// maybeChange applies the occasional config change or leader change.
func (g *goldenWorld) maybeChange() {
	switch {
	case g.r.chance(0.05):
		for _, st := range g.state { // demand shifts
			for _, k := range g.keys {
				if g.r.chance(0.3) {
					st.demand[k] = g.randomDemand(g.limits[k])
				}
			}
		}
	case g.r.chance(0.03) && len(g.keys) > 0:
		k := g.keys[g.r.intn(len(g.keys))]
		l := g.randomLimit()
		g.out("change", g.a.SetLimit(k, l))
		g.limits[k] = l
	case g.r.chance(0.03):
		g.addKey()
	case len(g.keys) > 1000 && g.n > 8 || g.r.chance(0.03) && len(g.keys) > 1:
		// Forget keys: most of them in the big worlds (slots renumber).
		n := 1
		if len(g.keys) > 1000 {
			n = len(g.keys) * 9 / 10
		}
		for range n {
			i := g.r.intn(len(g.keys))
			g.a.RemoveKey(g.keys[i])
			delete(g.limits, g.keys[i])
			g.keys = slices.Delete(g.keys, i, i+1)
		}
	case g.r.chance(0.01):
		nr := 1 + g.r.intn(6)
		g.setRegions(g.randomRegions(nr, g.regions))
	case g.r.chance(0.01):
		lapsed := g.a.LapsedSet()
		g.a.BecomeLeader(g.wall(g.now), lapsed...)
		g.out("leader", lapsed)
	}
}

// setRegions reconfigures the regions, keeping the model regions of the
// names kept.
func (g *goldenWorld) setRegions(regions []Region) {
	err := g.a.SetRegions(regions)
	g.out("regions", err)
	if err != nil {
		return
	}
	old := map[string]*goldenRegion{}
	for _, st := range g.state {
		old[st.name] = st
	}
	g.regions, g.state = regions, nil
	for _, r := range regions {
		st := old[r.Name]
		if st == nil {
			st = &goldenRegion{name: r.Name, held: map[quota.Key]goldenHeld{}, demand: map[quota.Key]float64{}}
			for _, k := range g.keys {
				st.demand[k] = g.randomDemand(g.limits[k])
			}
		}
		g.state = append(g.state, st)
	}
	// Limits with per-region shares are dropped by SetRegions; set
	// them again without.
	for _, k := range g.keys {
		l := g.limits[k]
		if l.StaticRate != nil || l.StaticBurst != nil || l.FloorRate != nil || l.FloorBurst != nil {
			l.StaticRate, l.StaticBurst, l.FloorRate, l.FloorBurst = nil, nil, nil, nil
			g.limits[k] = l
			g.out("reset", g.a.SetLimit(k, l))
		}
	}
}

// persist makes pending lapses durable, as the daemon does.
func (g *goldenWorld) persist() {
	now := g.wall(g.now)
	pending := g.a.PendingLapses(now)
	g.out("pending", pending, g.a.LapsedSet())
	for _, name := range pending {
		ok, err := g.a.LapseDurable(now, name)
		g.out("lapse", ok, err)
	}
	_, err := g.a.LapseDurable(now, "nowhere")
	g.out("lapse", err)
}

func (g *goldenWorld) view() {
	v := g.a.View(g.wall(g.now))
	g.out("view", v.At, v.Epoch, v.Learning, v.LearningUntil, len(v.Regions), len(v.Keys))
	for _, r := range v.Regions {
		g.out("rv", r.Name, r.Weight, r.Reported, r.LastReport, r.LastReportAge, r.LastSeq, r.Silent,
			r.UnknownKeyCount, string(r.State), r.StaticLease, r.Floored)
		for _, k := range r.UnknownKeys {
			g.out("uk", k)
		}
	}
	for _, k := range v.Keys {
		g.out("kv", k.Key, k.Contended, k.Active, k.Limit.Rate, k.Limit.Burst)
		for _, r := range k.Regions {
			g.out("kr", r.Demand, r.StaticRate, r.StaticBurst, r.TargetRate, r.TargetBurst,
				r.GrantedRate, r.GrantedBurst, r.GrantExpiry, r.ReservedRate, r.ReservedBurst, r.FloorRate, r.FloorBurst)
		}
	}
}
