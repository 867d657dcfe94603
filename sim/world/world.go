package world

import (
	"fmt"
	"math"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"math/rand/v2"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regionsync"
	"github.com/sluicehq/sluice/sim/engine"
	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/scenario"
	"github.com/sluicehq/sluice/sim/traffic"
)

// origin is true time 0 as a wall-clock date: every node's clock reads
// origin + t + its offset.
func origin() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }

// The client's defaults and rules come from pkg/lease (decide.go).
const (
	reapBudget  = 8
	expirySweep = 10 // epochs between the Model's TTL sweeps
	redisPrefix = luascripts.DefaultPrefix
)

// keyInfo is everything fixed about one driven key.
type keyInfo struct {
	id     int
	key    quota.Key
	res    config.Resolved
	rkeys  luascripts.Keys
	member string              // "tenant|class", the active-key index member
	wire   *sluicev1.QuotaKey  // shared, never modified
	common []luascripts.Common // per region, the static share chosen at call time
}

// World is one simulated deployment. Not safe for concurrent use: it runs
// on the goroutine that calls Run.
type World struct {
	eng    *engine.Engine
	sc     *scenario.Scenario
	cfg    *config.Config
	orc    *oracle.Oracle
	plan   *traffic.Plan
	faults []scenario.Fault

	epoch, refresh, leaseTTL, validity time.Duration
	sessionTTL                         time.Duration
	breakerTimeout                     time.Duration
	breakerFailures                    int
	breakerCooldown                    time.Duration
	classes                            map[string]lease.ClassPolicy

	keys    []*keyInfo
	keyByQK map[quota.Key]*keyInfo
	// keyByMember finds a key by its candidate-set member.
	keyByMember map[string]*keyInfo

	regions []*Region
	global  *Global
	net     *Network
	streams []*streamState

	rngInst  *rand.Rand // instance phases and clock offsets
	rngRoute *rand.Rand // load balancing
	rngEtcd  *rand.Rand // session expiry phases

	freeGrants []*sluicev1.Grant // see Region.grant

	configs configState // config revisions and every view of them (configs.go)

	counters Counters
}

// Counters are diagnostics of a run (plain values).
type Counters struct {
	Events           uint64
	InvalidDecisions int64 // Allow errors (must stay 0)
	AllocatorErrors  int64 // region reports the allocator refused
	ApplyErrors      int64 // grants the lease table refused
	UnservedTokens   int64 // requests that found no live instance
	Replays          int64 // requests and reports delivered again by faults
	LostAnswers      int64 // answers to instances lost by faults after the request applied
	ReplayMismatches int64 // replayed region reports the allocator answered differently (must stay 0)
	Nudges           int64 // nudges the global leader sent that the links delivered
}

// New builds the deployment of sc with the given seed, reporting to orc.
func New(sc *scenario.Scenario, seed uint64, orc *oracle.Oracle, plan *traffic.Plan) (*World, error) {
	cfg := sc.Config
	w := &World{
		eng: engine.New(seed), sc: sc, cfg: cfg, orc: orc, plan: plan,
		epoch: time.Duration(cfg.Epoch), refresh: time.Duration(cfg.Refresh),
		leaseTTL: time.Duration(cfg.LeaseTTL), validity: time.Duration(cfg.GrantValidity),
		sessionTTL:      time.Duration(sc.Topology.SessionTTL),
		breakerTimeout:  lease.DefaultBreakerTimeout,
		breakerFailures: lease.DefaultBreakerFailures,
		breakerCooldown: lease.DefaultBreakerCooldown,
		keyByQK:         map[quota.Key]*keyInfo{},
		keyByMember:     map[string]*keyInfo{},
		classes:         map[string]lease.ClassPolicy{},
	}
	if v := time.Duration(sc.Client.BreakerTimeout); v > 0 {
		w.breakerTimeout = v
	}
	if sc.Client.BreakerFailures > 0 {
		w.breakerFailures = sc.Client.BreakerFailures
	}
	if v := time.Duration(sc.Client.BreakerCooldown); v > 0 {
		w.breakerCooldown = v
	}
	w.rngInst = w.eng.Stream("instances")
	w.rngRoute = w.eng.Stream("routing")
	w.rngEtcd = w.eng.Stream("etcd")
	for name, cl := range cfg.Classes {
		m, err := lease.ParseMode(string(cl.Mode))
		if err != nil {
			return nil, fmt.Errorf("class %s: %w", name, err)
		}
		pol, err := lease.ParsePolicy(string(cl.OnFailure))
		if err != nil {
			return nil, fmt.Errorf("class %s: %w", name, err)
		}
		w.classes[name] = lease.ClassPolicy{Mode: m, OnFailure: pol}
	}
	w.faults = sc.Schedule(seed)

	for i, rs := range sc.Topology.Regions {
		w.regions = append(w.regions, newRegion(w, i, rs))
	}
	for _, k := range plan.Keys {
		if _, err := w.addKey(k); err != nil {
			return nil, err
		}
	}
	w.net = newNetwork(w)
	w.initConfigs()
	w.global = newGlobal(w)
	for _, st := range plan.Streams {
		w.streams = append(w.streams, &streamState{st: st, key: w.keyByQK[st.Key]})
	}
	return w, nil
}

func (w *World) addKey(k quota.Key) (*keyInfo, error) {
	res, err := w.cfg.Resolve(k)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", k, err)
	}
	ki := &keyInfo{
		id: len(w.keys), key: k, res: res, rkeys: luascripts.KeysFor(redisPrefix, k), member: k.Tenant + "|" + k.Class,
		wire: &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class},
	}
	for _, r := range w.regions {
		rate, burst, err := w.cfg.StaticShareOf(r.name, res)
		if err != nil {
			return nil, fmt.Errorf("key %s: %w", k, err)
		}
		ki.common = append(ki.common, luascripts.Common{
			StaticRate: rate, StaticBurst: burst, LeaseTTL: w.leaseTTL,
			Reclaim: res.Class.Reclaim != config.ReclaimNone, ReapBudget: reapBudget,
			DemandWindow: w.cfg.DemandWindow(),
			MarkEvery:    regionsync.MarkEvery(w.epoch),
			// The regional service always runs with its restart guard.
			RestartWait: luascripts.RestartWait(w.leaseTTL, w.validity, w.epoch),
			ShareFill:   luascripts.FillTime(res.Limit.Rate, float64(res.Limit.Burst)),
		})
	}
	w.keys = append(w.keys, ki)
	w.keyByQK[k] = ki
	w.keyByMember[ki.member] = ki
	return ki, nil
}

// OracleSetup describes the deployment to the oracle.
func OracleSetup(sc *scenario.Scenario, plan *traffic.Plan) (oracle.Setup, error) {
	cfg := sc.Config
	s := oracle.Setup{
		Epoch: time.Duration(cfg.Epoch), Duration: time.Duration(sc.Duration), Warmup: time.Duration(sc.Warmup),
		ConvergenceTolerance: sc.Expect.ConvergenceTolerance, DemandAlpha: cfg.DemandAlpha,
		Recovery: time.Duration(sc.Expect.Recovery),
	}
	if v := sc.Expect.RecoveredVsIdealMin; v != nil {
		s.RecoveredLevel = *v
	}
	if v := sc.Expect.ConvergenceEpochsMax; v != nil {
		// Watched long enough to judge the target.
		s.ConvergenceHorizon = max(oracle.DefaultConvergenceHorizon, int(math.Ceil(*v)))
	}
	for _, r := range sc.Topology.Regions {
		s.Regions = append(s.Regions, oracle.Region{Name: r.Name, Weight: cfg.Regions[r.Name].Weight,
			MinShare: cfg.Regions[r.Name].MinShare, MaxShare: cfg.Regions[r.Name].MaxShare})
	}
	idx := map[quota.Key]int{}
	for i, k := range plan.Keys {
		res, err := cfg.Resolve(k)
		if err != nil {
			return s, fmt.Errorf("key %s: %w", k, err)
		}
		ok := oracle.Key{Key: k, Rate: res.Limit.Rate, Burst: float64(res.Limit.Burst),
			Closed: res.Class.OnFailure == config.OnFailureClosed}
		for _, r := range sc.Topology.Regions {
			rate, burst, err := cfg.StaticShareOf(r.Name, res)
			if err != nil {
				return s, err
			}
			floorRate, floorBurst, err := cfg.FloorOf(r.Name, res)
			if err != nil {
				return s, err
			}
			ok.StaticRate = append(ok.StaticRate, rate)
			ok.StaticBurst = append(ok.StaticBurst, burst)
			ok.FloorRate = append(ok.FloorRate, floorRate)
			ok.FloorBurst = append(ok.FloorBurst, floorBurst)
		}
		s.Keys = append(s.Keys, ok)
		idx[k] = i
	}
	demand := func(k quota.Key, at time.Duration) []float64 {
		d := make([]float64, len(sc.Topology.Regions))
		for _, st := range plan.Streams {
			if st.Key == k {
				d[st.Region] += st.Rate(at) * float64(st.Cost)
			}
		}
		return d
	}
	for _, sh := range plan.Shifts {
		s.Shifts = append(s.Shifts, oracle.Shift{At: sh.At, Key: idx[sh.Key], Demand: demand(sh.Key, sh.At)})
	}
	for _, f := range sc.Focus {
		k, _ := scenario.ParseKey(f)
		if i, ok := idx[k]; ok {
			s.Focus = append(s.Focus, i)
		}
	}
	if len(s.Focus) == 0 {
		s.Focus = topKeys(sc, plan, idx, 3)
	}
	return s, nil
}

// topKeys are the n keys with the most expected offered tokens.
func topKeys(sc *scenario.Scenario, plan *traffic.Plan, idx map[quota.Key]int, n int) []int {
	total := make([]float64, len(plan.Keys))
	dur := time.Duration(sc.Duration)
	for _, st := range plan.Streams {
		// At least 1ns a sample: a run under 50ns has a zero fiftieth.
		for t := time.Duration(0); t < dur; t += max(dur/50, 1) {
			total[idx[st.Key]] += st.Rate(t) * float64(st.Cost)
		}
	}
	var out []int
	used := make([]bool, len(total))
	for len(out) < n && len(out) < len(total) {
		best := -1
		for i, v := range total {
			if !used[i] && (best < 0 || v > total[best]) {
				best = i
			}
		}
		used[best] = true
		out = append(out, best)
	}
	return out
}

// Run simulates the whole scenario.
func (w *World) Run() Counters {
	end := engine.At(time.Duration(w.sc.Duration))
	for _, r := range w.regions {
		r.start()
	}
	w.global.start()
	for _, s := range w.streams {
		w.startStream(s)
	}
	for i := range w.faults {
		f := w.faults[i]
		w.eng.At(engine.At(time.Duration(f.At)), func() { w.inject(f) })
	}
	w.scheduleEvents()
	// Grant expiries and other timers of the oracle need a clock even when
	// nothing happens: tick it every epoch.
	var tick func()
	tick = func() {
		w.orc.Advance(w.dur())
		w.eng.After(w.epoch, tick)
	}
	w.eng.After(0, tick)
	w.eng.RunUntil(end)
	w.counters.Events = w.eng.Events()
	return w.counters
}

// Elapsed is the virtual time simulated so far.
func (w *World) Elapsed() time.Duration { return w.dur() }

// Stop ends Run before its next event (an interrupted run: what it
// measured is partial). Safe to call from any goroutine.
func (w *World) Stop() { w.eng.Stop() }

// dur is the current virtual time as a duration since the start.
func (w *World) dur() time.Duration { return time.Duration(w.eng.Now()) }

// clockAt is a node's clock reading at the current instant.
func (w *World) clockAt(offset time.Duration) time.Time {
	return origin().Add(time.Duration(w.eng.Now()) + offset)
}

// trueTimeOf converts a Redis time (µs on a clock with the given offset)
// into virtual time.
func trueTimeOf(us int64, offset time.Duration) time.Duration {
	return time.Duration(us)*time.Microsecond - time.Duration(origin().UnixNano()) - offset
}
