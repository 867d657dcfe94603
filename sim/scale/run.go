package scale

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regionsync"
	"github.com/sluicehq/sluice/sim/engine"
)

// Mutation breaks the system on purpose, so a test can show the oracle
// catches it.
type Mutation int

const (
	// Sound runs the shipped decisions.
	Sound Mutation = iota
	// IgnoreAnswer installs twice the rate and burst the global tier
	// granted: the allocator's answer ignored.
	IgnoreAnswer
	// Unfenced installs every grant with its expiry ten validities late:
	// a region keeps a larger old grant after capacity moved away.
	Unfenced
)

// Options tune a run.
type Options struct {
	// Duration overrides the spec's (0: the spec's); the spec's warmup is
	// kept, and a Duration not longer than it is refused.
	Duration time.Duration
	Mutate   Mutation
}

// epoch, validity, lease TTL and refresh of the generated config.
const (
	epoch    = time.Second
	validity = 5 * time.Second
	leaseTTL = 5 * time.Second
	refresh  = time.Second
)

// base is the wall-clock origin of virtual time (every clock agrees).
var base = time.Unix(1_800_000_000, 0)

// key is a modeled key: one whose peak demand comes near a static share.
type key struct {
	i         int // population index
	k         quota.Key
	shard     int
	rate      float64
	burst     float64
	contended bool // peak demand above a static share
	peak      float64
	static    []regionsync.Share // per region
	floor     []regionsync.Share
	common    luascripts.Common // static fields filled per call
	pairs     []*pair           // per region, nil until modeled there
	granted   bool              // some region installed a grant
	// The oracle's central buckets: the fleet's admissions (level) and
	// the ideal bucket fed the same demand.
	level, ideal float64
	admitted     float64 // after warmup
	idealAdm     float64 // after warmup
}

// pair is a modeled (key, region): its Redis keys and the fluid instance
// that leases from its bucket.
type pair struct {
	rk             luascripts.Keys
	pool           float64 // leased, not yet spent
	used, denied   float64 // cumulative
	seq            uint64
	usedR, deniedR int64 // cumulative as last reported
}

type region struct {
	g        int
	name     string
	model    *luascripts.Model
	leader   *regionsync.Leader
	up       bool
	gen      int
	busy     bool
	waiting  bool
	round    *regionsync.Round
	leases   []regionsync.StaticLease // per shard
	perShard []linkStats
	cp       int64 // control-plane Redis commands per report
	cpKeys   int64 // control-plane Redis commands per key (state reads, set_rate)
	byMember map[string]*key
	cand     string    // the candidate set (a single Redis: one)
	modeled  int       // (key, region) buckets modeled
	adm, dem []float64 // per modeled key: the last epoch's admitted and offered tokens
	pend     *pending  // the report in flight
}

type linkStats struct {
	reports, answers, failed int64
	bytesUp, bytesDown       float64
	keys                     float64
}

type shardNode struct {
	s      int
	alloc  *hierarchy.Allocator
	up     bool
	gen    int
	lapsed []string
	// per-epoch tallies
	reports                           int64
	keysIn, bytesIn, bytesOut, grants float64
	allocWall                         time.Duration
	allocMax                          time.Duration
	allocs                            int64
	contendedMax, contendedSum        float64
	contendedN                        int64
}

type sim struct {
	spec    *Spec
	opts    Options
	pop     *population
	cfg     *config.Config
	eng     *engine.Engine
	keys    []*key
	byQK    map[quota.Key]*key
	regions []*region
	shards  []*shardNode
	cold    []hist
	instPer int
	dur     time.Duration
	res     *Result
	mark    time.Duration // scripts' mark interval
	// m is the sampling factor: one modeled key stands for m.
	m float64
}

// Run simulates spec.
func Run(spec *Spec, opts Options) (*Result, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if d, w := opts.Duration, time.Duration(spec.Warmup); d > 0 && w > 0 && d <= w {
		// As a virtual run's: the written warmup is kept, so a shorter
		// run measures what the scenario measures, only less of it.
		return nil, fmt.Errorf("%w: duration %v is not longer than the scenario's warmup, %v, which is kept (measures start after it): nothing would be measured; run longer than %v", ErrInvalid, d, w, w)
	}
	wall := time.Now()
	s := &sim{spec: spec, opts: opts, dur: time.Duration(spec.Duration), mark: regionsync.MarkEvery(epoch)}
	if opts.Duration > 0 {
		s.dur = opts.Duration
	}
	var all []int
	s.pop, all = newPopulation(spec)
	s.m = float64(max(spec.Sample, 1))
	tracked := all
	if spec.Sample > 1 {
		tracked = nil
		for _, i := range all {
			if mix64(uint64(i)^0x5a3b1e)%uint64(spec.Sample) == 0 {
				tracked = append(tracked, i)
			}
		}
	}
	cfg, err := parseConfig(s.pop.configYAML(tracked, spec.Shards))
	if err != nil {
		return nil, err
	}
	s.cfg = cfg
	s.instPer = spec.Instances / spec.Regions
	s.cold = s.pop.coldHists(all)
	s.res = newResult(spec, s.dur)
	s.res.Tracked, s.res.TrackedAll = len(tracked), len(all)
	s.res.ContendedAll = max(1, int(math.Round(spec.Contended*float64(spec.Keys))))
	s.res.Scale = s.pop.scale
	if err := s.build(tracked); err != nil {
		return nil, err
	}
	s.res.SetupWall = time.Since(wall)
	s.eng = engine.New(spec.Seed)
	s.start()
	s.eng.RunUntil(engine.At(s.dur))
	s.finish()
	s.res.Wall = time.Since(wall)
	return s.res, nil
}

func (s *sim) build(tracked []int) error {
	R := s.spec.Regions
	s.byQK = make(map[quota.Key]*key, len(tracked))
	restart := luascripts.RestartWait(leaseTTL, validity, epoch)
	for _, i := range tracked {
		qk := s.pop.key(i)
		res, err := s.cfg.Resolve(qk)
		if err != nil {
			return fmt.Errorf("key %s: %w", qk, err)
		}
		if got := res.Limit.Rate; got != s.pop.limit(i) {
			return fmt.Errorf("key %s: the config gives rate %v, the population %v", qk, got, s.pop.limit(i))
		}
		k := &key{i: i, k: qk, shard: s.cfg.ShardMap().Of(qk), rate: res.Limit.Rate, burst: float64(res.Limit.Burst),
			pairs: make([]*pair, R), static: make([]regionsync.Share, R), floor: make([]regionsync.Share, R)}
		k.peak = s.pop.pressure(i) * s.pop.scale
		k.contended = k.peak > 1
		for g := range R {
			rate, burst, err := s.cfg.StaticShareOf(regionName(g), res)
			if err != nil {
				return err
			}
			k.static[g] = regionsync.Share{Rate: rate, Burst: burst}
			k.floor[g] = regionsync.FloorOf(k.static[g], res)
		}
		k.common = luascripts.Common{LeaseTTL: leaseTTL, Reclaim: res.Class.Reclaim != config.ReclaimNone, ReapBudget: 16,
			DemandWindow: s.cfg.DemandWindow(), RestartWait: restart, MarkEvery: s.mark,
			ShareFill: luascripts.FillTime(res.Limit.Rate, float64(res.Limit.Burst))}
		k.level, k.ideal = k.burst, k.burst
		s.keys = append(s.keys, k)
		s.byQK[qk] = k
		if k.contended {
			s.res.ContendedKeys++
		}
	}
	startUS := base.UnixMicro()
	for g := range R {
		r := &region{g: g, name: regionName(g), model: luascripts.NewModel(), leader: regionsync.NewLeader(), up: true,
			leases: make([]regionsync.StaticLease, s.spec.Shards), perShard: make([]linkStats, s.spec.Shards),
			byMember: map[string]*key{}, cand: luascripts.KeysFor(luascripts.DefaultPrefix, quota.Key{Tenant: "x", Class: "x"}).Cand,
			adm: make([]float64, len(s.keys)), dem: make([]float64, len(s.keys))}
		// The run starts with every region holding a static lease from
		// each shard, as after a first answered report.
		for i := range r.leases {
			r.leases[i] = regionsync.StaticLease{UntilUS: startUS + time.Duration(s.cfg.RegionLease).Microseconds()}
		}
		r.model.StampBorn(startUS-restart.Microseconds()-time.Hour.Microseconds(), luascripts.BornKeys(luascripts.DefaultPrefix, false)[0], false)
		s.regions = append(s.regions, r)
	}
	for i := range s.spec.Shards {
		n := &shardNode{s: i, up: true}
		s.boot(n, base)
		s.shards = append(s.shards, n)
	}
	return nil
}

func (s *sim) boot(n *shardNode, now time.Time) {
	var regions []hierarchy.Region
	for g := range s.spec.Regions {
		regions = append(regions, hierarchy.Region{Name: regionName(g), Weight: 1})
	}
	a, err := hierarchy.NewAllocator(hierarchy.Options{Regions: regions, Epoch: epoch, Validity: validity,
		DemandAlpha: s.cfg.DemandAlpha, RegionLease: time.Duration(s.cfg.RegionLease)}, now)
	if err != nil {
		panic("scale: allocator options refused: " + err.Error())
	}
	a.BecomeLeader(now, n.lapsed...)
	n.alloc = a
}

func (s *sim) now() time.Time     { return base.Add(time.Duration(s.eng.Now())) }
func (s *sim) nowUS() int64       { return s.now().UnixMicro() }
func (s *sim) t() time.Duration   { return time.Duration(s.eng.Now()) }
func (s *sim) day() time.Duration { return time.Duration(s.spec.Day) }
func (s *sim) warm() bool         { return s.t() > time.Duration(s.spec.Warmup) }
func (s *sim) level(g int, t time.Duration) float64 {
	return curve(t, s.day(), g, s.spec.Regions, s.spec.DiurnalLow)
}

// demand is modeled key k's demand in region g at t (tokens/s).
func (s *sim) demand(k *key, g int, t time.Duration) float64 {
	return s.pop.raw(k.i) * s.pop.scale * s.pop.regionShare(k.i, g) * s.level(g, t)
}

// common is what the regional service hands the scripts for k in r: the
// static share while the static lease of k's shard is valid, else the
// floor.
func (s *sim) common(r *region, k *key, nowUS int64) luascripts.Common {
	c := k.common
	sh := regionsync.Choose(nowUS, r.leases[k.shard], regionsync.StaticMargin(epoch), k.static[r.g], k.floor[r.g])
	c.StaticRate, c.StaticBurst = sh.Rate, sh.Burst
	// Scripts run at the instant of the choice, so the deadline the
	// regional service gives them never passes.
	c.DeadlineUS = regionsync.ScriptDeadline(nowUS, r.leases[k.shard], regionsync.StaticMargin(epoch))
	return c
}

func (s *sim) start() {
	for e := int64(0); time.Duration(e)*epoch < s.dur; e++ {
		at := engine.At(time.Duration(e) * epoch)
		s.eng.At(at, s.tick)
		// Each shard's allocation loop ticks half an epoch off the
		// regions' reports.
		s.eng.At(at.Add(epoch/2), s.allocate)
	}
	for _, f := range s.spec.Faults {
		f := f
		s.eng.At(engine.At(time.Duration(f.At)), func() { s.fault(f) })
	}
}

func (s *sim) fault(f Fault) {
	ttl := time.Duration(s.spec.SessionTTL)
	switch f.Kind {
	case RegionLeaderLoss:
		r := s.regions[f.Region]
		r.up = false
		r.gen++
		r.busy, r.waiting = false, false
		s.res.note(s.t(), fmt.Sprintf("%s loses its region leader; a new one is elected %v later", r.name, ttl))
		s.eng.After(ttl, func() {
			r.up = true
			r.leader.Elected()
		})
	case ShardLeaderLoss:
		n := s.shards[f.Shard]
		n.up = false
		n.gen++
		s.res.note(s.t(), fmt.Sprintf("global shard %d loses its leader; a new one (fresh, learning) is elected %v later", f.Shard, ttl))
		s.eng.After(ttl, func() {
			n.up = true
			s.boot(n, s.now())
		})
	}
}

// reportBytes is what a report part of the whole key space weighs: its
// header, plus its keys' bytes scaled by the sampling factor.
func (s *sim) reportBytes(part *sluicev1.RegionReport) float64 {
	full := proto.Size(part)
	keys := part.Keys
	part.Keys = nil
	hdr := proto.Size(part)
	part.Keys = keys
	return float64(hdr) + s.m*float64(full-hdr)
}

// answerBytes is reportBytes for an answer.
func (s *sim) answerBytes(g *sluicev1.RegionGrants) float64 {
	full := proto.Size(g)
	grants := g.Grants
	g.Grants = nil
	hdr := proto.Size(g)
	g.Grants = grants
	return float64(hdr) + s.m*float64(full-hdr)
}

// parallel runs f(0..n-1) on up to GOMAXPROCS goroutines. Every f(i)
// touches only its own region's or shard's state, so the result does not
// depend on the schedule.
func parallel(n int, f func(i int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				f(i)
			}
		})
	}
	wg.Wait()
}

// tick is one epoch: the data plane of the past epoch, the oracle's
// instant checks, then every region leader's epoch report.
func (s *sim) tick() {
	s.dataPlane()
	s.checkSums()
	var batch []*region
	for _, r := range s.regions {
		if !r.up {
			continue
		}
		if r.busy {
			r.waiting = true
			continue
		}
		batch = append(batch, r)
	}
	s.send(batch, regionsync.Epoch)
}

// dataPlane runs the past epoch's demand against every modeled bucket
// (one fluid instance per (key, region) spending what it leased, then
// syncing: usage, demand reading and a new lease through the Model) and
// counts what the unmodeled (key, region)s admit, which is all they are
// asked for: their demand stays below half their static share. Regions
// run in parallel; the oracle then sums each key over regions.
func (s *sim) dataPlane() {
	t := s.t()
	nowUS := s.nowUS()
	dt := epoch.Seconds()
	parallel(len(s.regions), func(g int) {
		r := s.regions[g]
		rs := &s.res.Regions[g]
		contended := 0
		for ki, k := range s.keys {
			d := 0.0
			if t > 0 {
				d = s.demand(k, g, t-epoch/2)
			}
			next := s.demand(k, g, t+epoch/2)
			p := k.pairs[g]
			if p == nil && next >= trackAt*k.static[g].Rate {
				p = s.pair(r, k)
			}
			r.dem[ki] = d * dt
			rs.dataCalls += s.m * holders(d, s.instPer, leaseTTL) / refresh.Seconds() * dt
			rs.offered += s.m * d * dt
			if p == nil {
				// Never marked: its demand is below half its rate.
				rate := regionsync.Choose(nowUS, r.leases[k.shard], regionsync.StaticMargin(epoch), k.static[g], k.floor[g]).Rate
				r.adm[ki] = min(d, rate) * dt
				continue
			}
			if d > k.static[g].Rate {
				contended++
			}
			want := d * dt
			used := min(p.pool, want)
			p.pool -= used
			p.used += used
			p.denied += want - used
			r.adm[ki] = used
			p.seq++
			ask := int64(math.Ceil(max(0, 1.5*next*refresh.Seconds()-p.pool)))
			rep := luascripts.Report{Instance: "f", Incarnation: 1, Lease: 1, Seq: p.seq,
				Used: max(int64(p.used), p.usedR), Denied: max(int64(p.denied), p.deniedR), Want: ask, Min: 1, BuiltUS: nowUS}
			p.usedR, p.deniedR = rep.Used, rep.Denied
			lr := r.model.Sync(nowUS, p.rk, s.common(r, k, nowUS), rep)
			p.pool += float64(lr.Granted)
		}
		off, calls := s.cold[g].coldLoad(s.level(g, t-epoch/2), s.instPer, leaseTTL, refresh)
		if t > 0 {
			rs.offered += off * dt
			rs.dataCalls += calls * dt
			rs.contendedSum += s.m * float64(contended)
			rs.contendedMax = max(rs.contendedMax, s.m*float64(contended))
			rs.epochs++
		}
	})
	warm := s.warm()
	for ki, k := range s.keys {
		total, adm := 0.0, 0.0
		for _, r := range s.regions {
			total += r.dem[ki]
			adm += r.adm[ki]
		}
		s.conform(k, total, adm, warm)
	}
}

func (s *sim) pair(r *region, k *key) *pair {
	p := &pair{rk: luascripts.KeysFor(luascripts.DefaultPrefix, k.k)}
	k.pairs[r.g] = p
	r.byMember[p.rk.Member] = k
	r.modeled++
	return p
}

// conform is the oracle's fluid check of one key's epoch: what the fleet
// admitted against a central bucket of rate r and burst b (admitted over
// any run of whole epochs ≤ b + r·t), and the ideal central bucket fed the
// same demand.
func (s *sim) conform(k *key, demand, adm float64, warm bool) {
	dt := epoch.Seconds()
	k.level = min(k.burst, k.level+k.rate*dt) - adm
	tol := 1e-6 * (k.burst + k.rate*s.t().Seconds())
	if k.level < -tol-1e-6 {
		s.res.Oracle.ConformViolations++
		s.res.Oracle.MaxExcess = max(s.res.Oracle.MaxExcess, -k.level)
		if s.res.Oracle.FirstConform == "" {
			s.res.Oracle.FirstConform = fmt.Sprintf("%v: %s admitted %.3f tokens over b + r·t", s.t(), k.k, -k.level)
		}
		k.level = 0 // judge the next epochs afresh
	}
	k.ideal = min(k.burst, k.ideal+k.rate*dt)
	ideal := min(demand, k.ideal)
	k.ideal -= ideal
	if warm && k.contended {
		k.admitted += adm
		k.idealAdm += ideal
	}
}

// checkSums is the oracle's instant check for every key some region holds
// a grant for: Σ over regions of the rate each bucket may refill at now
// (its grant while valid on the region's clock, else its static share
// while its shard's static lease holds, else its floor) ≤ r, and the same
// for caps ≤ b.
func (s *sim) checkSums() {
	nowUS := s.nowUS()
	for _, k := range s.keys {
		if !k.granted {
			continue
		}
		s.checkKey(k, nowUS)
	}
}

func (s *sim) checkKey(k *key, nowUS int64) {
	sumR, sumB := 0.0, 0.0
	for g, r := range s.regions {
		sh := regionsync.Choose(nowUS, r.leases[k.shard], regionsync.StaticMargin(epoch), k.static[g], k.floor[g])
		rate, cap := sh.Rate, sh.Burst
		if p := k.pairs[g]; p != nil {
			if b, ok := r.model.PeekBucket(p.rk); ok && b.GrantExpiryUS > nowUS {
				rate, cap = b.GrantRate, b.GrantBurst
			}
		}
		sumR += rate
		sumB += cap
	}
	o := &s.res.Oracle
	o.SumChecks++
	R := float64(len(s.regions))
	if sumR > k.rate*(1+1e-9)+1e-6*R {
		o.RateViolations++
		if o.FirstRate == "" {
			o.FirstRate = fmt.Sprintf("%v: %s Σ rates %.6f > r %.6f", s.t(), k.k, sumR, k.rate)
		}
	}
	if sumB > k.burst*(1+1e-9)+1e-6*R {
		o.CapViolations++
		if o.FirstCap == "" {
			o.FirstCap = fmt.Sprintf("%v: %s Σ caps %.6f > b %.6f", s.t(), k.k, sumB, k.burst)
		}
	}
	o.MaxRateRatio = max(o.MaxRateRatio, sumR/k.rate)
	o.MaxCapRatio = max(o.MaxCapRatio, sumB/k.burst)
}

// pending is a region's report in flight.
type pending struct {
	gen     int
	sendUS  int64
	held    regionsync.Held
	parts   []*sluicev1.RegionReport
	answers []*sluicev1.RegionGrants
	// shardGen is each shard's leadership the part was sent to.
	shardGen []int
	applied  []quota.Key // keys whose grant set_rate applied
}

// send has every region of batch send a report of kind now (pkg/regional's
// Leader.syncOnce and syncShards, on virtual time): candidates and key
// states read from the region's Model, the report built by regionsync and
// split by shard; each shard answers half a round trip later, and the
// grants are installed a round trip after sending. The round then says
// what each region sends next.
func (s *sim) send(batch []*region, kind regionsync.Kind) {
	if len(batch) == 0 {
		return
	}
	parallel(len(batch), func(i int) { s.report(batch[i], kind) })
	rtt := time.Duration(s.spec.RTT)
	s.eng.After(rtt/2, func() {
		parallel(len(s.shards), func(i int) {
			n := s.shards[i]
			for _, r := range batch {
				if r.pend == nil || r.pend.parts[i] == nil || !n.up || n.gen != r.pend.shardGen[i] {
					continue
				}
				r.pend.answers[i] = s.serve(n, r.pend.parts[i])
			}
		})
	})
	s.eng.After(rtt, func() {
		var live []*region
		for _, r := range batch {
			if r.pend != nil && r.up && r.gen == r.pend.gen {
				live = append(live, r)
			} else if r.pend != nil && r.gen == r.pend.gen {
				r.busy = false
			}
		}
		answers := make([]regionsync.Answer, len(live))
		got := make([]bool, len(live))
		parallel(len(live), func(i int) { answers[i], got[i] = s.answered(live[i]) })
		nowUS := s.nowUS()
		type next struct {
			kind regionsync.Kind
			wait time.Duration
		}
		groups := map[next][]*region{}
		var order []next
		var epochs []*region
		for i, r := range live {
			for _, qk := range r.pend.applied {
				k := s.byQK[qk]
				k.granted = true
				s.checkKey(k, nowUS)
			}
			r.pend = nil
			kind, wait, more := regionsync.Kind(0), time.Duration(0), false
			if got[i] {
				kind, wait, more = r.round.Next(answers[i])
			}
			if !more {
				r.busy = false
				if r.waiting {
					r.waiting = false
					epochs = append(epochs, r)
				}
				continue
			}
			nx := next{kind, wait}
			if _, ok := groups[nx]; !ok {
				order = append(order, nx)
			}
			groups[nx] = append(groups[nx], r)
		}
		s.send(epochs, regionsync.Epoch)
		for _, nx := range order {
			regs := groups[nx]
			gens := make([]int, len(regs))
			for j, r := range regs {
				gens[j] = r.gen
			}
			s.eng.After(nx.wait, func() {
				var still []*region
				for j, r := range regs {
					if r.up && r.busy && r.gen == gens[j] {
						still = append(still, r)
					}
				}
				s.send(still, nx.kind)
			})
		}
	})
}

// report reads the candidates and the selected keys' states and builds
// the report of kind, split by shard.
func (s *sim) report(r *region, kind regionsync.Kind) {
	if kind == regionsync.Epoch {
		r.round = regionsync.NewRound(epoch)
	}
	r.busy = true
	sendUS := s.nowUS()
	rs := &s.res.Regions[r.g]
	// Redis TIME and the static lease; the candidate sets (read, and
	// trimmed on an epoch report).
	r.cp++
	since := regionsync.CandidatesSince(sendUS, epoch)
	var cands []quota.Key
	for m, sc := range r.model.Candidates(r.cand) {
		if sc < since {
			continue
		}
		if k := r.byMember[m]; k != nil {
			cands = append(cands, k.k)
		}
	}
	r.cp++
	if kind == regionsync.Epoch {
		r.model.TrimCandidates(r.cand, since)
		r.cp++
	}
	keys := r.leader.Select(cands)
	reads := make([]regionsync.KeyRead, 0, len(keys))
	for _, qk := range keys {
		k := s.byQK[qk]
		p := k.pairs[r.g]
		if p == nil {
			continue
		}
		c := s.common(r, k, sendUS)
		r.cpKeys++
		reads = append(reads, regionsync.KeyRead{Key: qk, State: r.model.State(sendUS, p.rk, c), StaticRate: c.StaticRate})
	}
	rep, held := r.leader.Report(r.name, sendUS, epoch, kind, reads)
	if kind == regionsync.Epoch {
		rs.reportedSum += s.m * float64(len(reads))
		rs.reportedMax = max(rs.reportedMax, s.m*float64(len(reads)))
		rs.reports++
	}
	pd := &pending{gen: r.gen, sendUS: sendUS, held: held, parts: make([]*sluicev1.RegionReport, len(s.shards)),
		answers: make([]*sluicev1.RegionGrants, len(s.shards)), shardGen: make([]int, len(s.shards))}
	for i := range pd.parts {
		pd.parts[i] = &sluicev1.RegionReport{Region: rep.GetRegion(), Seq: rep.GetSeq(), StaticValidMs: r.leases[i].ValidMs(sendUS)}
	}
	for _, kd := range rep.GetKeys() {
		i := s.byQK[quota.Key{Tenant: kd.GetKey().GetTenant(), Class: kd.GetKey().GetClass()}].shard
		pd.parts[i].Keys = append(pd.parts[i].Keys, kd)
	}
	for i, part := range pd.parts {
		ls := &r.perShard[i]
		ls.reports++
		ls.keys += s.m * float64(len(part.Keys))
		ls.bytesUp += s.reportBytes(part)
		n := s.shards[i]
		pd.shardGen[i] = n.gen
		if !n.up {
			ls.failed++
			pd.parts[i] = nil
		}
	}
	r.pend = pd
}

// answered takes in r's answers: each shard's static lease, then its
// grants installed. got is false when no shard answered (the sync failed).
func (s *sim) answered(r *region) (a regionsync.Answer, got bool) {
	pd := r.pend
	for i, g := range pd.answers {
		if g == nil {
			continue
		}
		got = true
		ls := &r.perShard[i]
		ls.answers++
		ls.bytesDown += s.answerBytes(g)
		if l, err := r.leases[i].Answered(g, pd.sendUS); err == nil {
			if l.UntilUS > r.leases[i].UntilUS {
				r.cp++ // the longer lease stored in Redis
			}
			r.leases[i] = l
		}
		ai := s.install(r, g, pd.sendUS, pd.held)
		a.Lowered = a.Lowered || ai.Lowered
		if ai.Again > 0 && (a.Again == 0 || ai.Again < a.Again) {
			a.Again = ai.Again
		}
	}
	return a, got
}

// install is pkg/regional's Leader.install: regionsync says what to
// install; each goes to the Model's set_rate.
func (s *sim) install(r *region, g *sluicev1.RegionGrants, sendUS int64, held regionsync.Held) regionsync.Answer {
	installs, _ := regionsync.Installs(g, sendUS, held)
	applied := make([]bool, len(installs))
	nowUS := s.nowUS()
	for i, in := range installs {
		k := s.byQK[in.Key]
		if k == nil {
			continue
		}
		p := k.pairs[r.g]
		if p == nil {
			p = s.pair(r, k)
		}
		rate, burst, exp := in.Rate, in.Burst, in.ExpiryUS
		switch s.opts.Mutate {
		case IgnoreAnswer:
			rate, burst = 2*rate, 2*burst
		case Unfenced:
			exp += 10 * validity.Microseconds()
		}
		r.cpKeys++
		c := s.common(r, k, nowUS)
		installs[i].FromStatic(c.StaticRate)
		sr := r.model.SetRate(nowUS, p.rk, c, rate, burst, exp, in.FenceUS, in.Deposit)
		if sr.Applied {
			applied[i] = true
			installs[i].Released = sr.Released
			r.pend.applied = append(r.pend.applied, in.Key)
		}
	}
	r.leader.Installed(installs, applied)
	return regionsync.Outcome(g, installs, applied)
}

// serve is pkg/allocator's Service.Sync on shard n: the part decoded and
// checked against the config, every key's limit set, the allocator's
// answer encoded.
func (s *sim) serve(n *shardNode, part *sluicev1.RegionReport) *sluicev1.RegionGrants {
	rep, limits, err := regionsync.DecodeReport(s.cfg, part, math.MaxInt)
	if err != nil {
		panic("scale: a region report was refused: " + err.Error())
	}
	at := s.now()
	if err := n.alloc.SetReportLimits(rep, limits); err != nil {
		panic("scale: a configured limit was refused: " + err.Error())
	}
	ans, err := n.alloc.Report(at, rep)
	if err != nil {
		panic("scale: the allocator refused a report: " + err.Error())
	}
	n.alloc.TakeNudges() // nudges only hasten reports; the run does without
	out := regionsync.EncodeGrants(rep, ans.Grants, n.alloc.Learning(at), n.alloc.Epoch(), n.alloc.ReportAgain(rep.Region))
	out.StaticLeaseMs = ans.StaticLease.Milliseconds()
	n.reports++
	n.keysIn += s.m * float64(len(rep.Keys))
	n.bytesIn += s.reportBytes(part)
	n.bytesOut += s.answerBytes(out)
	n.grants += s.m * float64(len(ans.Grants))
	return out
}

// allocate is pkg/allocator's Service.step on every shard that has a
// leader: one allocation, lapses persisted, keys nobody named for longer
// than any grant can live forgotten.
func (s *sim) allocate() {
	now := s.now()
	// Not at the first allocation: before any epoch of demand was
	// reported the allocator finds nothing contended, a reading of no
	// data (a run of 30 epochs or less has no sample and reads n/a).
	sample := s.t() >= epoch && int64(s.t()/epoch)%30 == 0
	for _, n := range s.shards {
		if !n.up {
			continue
		}
		w := time.Now()
		n.alloc.Allocate(now)
		d := time.Since(w)
		n.allocWall += d
		n.allocMax = max(n.allocMax, d)
		n.allocs++
		pending := n.alloc.PendingLapses(now)
		for _, r := range pending {
			if !slices.Contains(n.lapsed, r) {
				n.lapsed = append(n.lapsed, r)
			}
			n.alloc.LapseDurable(now, r)
			s.res.note(s.t(), fmt.Sprintf("global shard %d: region %s's static lease lapsed", n.s, r))
		}
		n.alloc.ForgetIdle(now, time.Time{})
		if sample {
			c := 0
			for _, kv := range n.alloc.View(now).Keys {
				if kv.Contended {
					c++
				}
			}
			n.contendedMax = max(n.contendedMax, s.m*float64(c))
			n.contendedSum += s.m * float64(c)
			n.contendedN++
		}
	}
}

func (s *sim) finish() {
	o := &s.res.Oracle
	for _, k := range s.keys {
		o.Admitted += k.admitted
		o.Ideal += k.idealAdm
	}
	secs := s.dur.Seconds()
	for g, r := range s.regions {
		rs := &s.res.Regions[g]
		rs.Name = r.name
		s.res.Modeled += r.modeled
		rs.ControlCalls = (float64(r.cp) + s.m*float64(r.cpKeys)) / secs
		for i := range r.perShard {
			ls := r.perShard[i]
			rs.Reports += ls.reports
			rs.Answers += ls.answers
			rs.BytesUp += ls.bytesUp
			rs.BytesDown += ls.bytesDown
			rs.Failed += ls.failed
			s.res.Links = append(s.res.Links, LinkResult{Region: r.name, Shard: i, Reports: ls.reports, Answers: ls.answers,
				Failed: ls.failed, BytesUp: ls.bytesUp, BytesDown: ls.bytesDown, Keys: ls.keys})
		}
	}
	for _, n := range s.shards {
		sr := ShardResult{Shard: n.s, Reports: n.reports, KeysIn: n.keysIn, BytesIn: n.bytesIn, BytesOut: n.bytesOut,
			Grants: n.grants, ContendedMax: n.contendedMax, ContendedSamples: n.contendedN, AllocMax: n.allocMax}
		if n.allocs > 0 {
			sr.AllocMean = n.allocWall / time.Duration(n.allocs)
		}
		if n.contendedN > 0 {
			sr.ContendedMean = n.contendedSum / float64(n.contendedN)
		}
		s.res.Shards = append(s.res.Shards, sr)
	}
	s.res.Events = s.eng.Events()
}
