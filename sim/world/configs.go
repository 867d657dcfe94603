package world

import (
	"fmt"
	"maps"
	"slices"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/regionsync"
	"github.com/sluicehq/sluice/sim/scenario"
)

// Config changes (drain and restore events) go the way they do in a
// deployment: the operator writes a new revision to etcd; each region's
// regional service adopts it when its watch delivers it (a link delay
// later; not while etcd is down or the region is dead) into its
// regionsync.Chain, whose smallest share the scripts run on, reports the
// chain's revisions, and drops older ones when the global tier confirms a
// revision every region reported; the global leader adopts the newest
// revision whenever it serves a report with etcd up, assumes a revision
// every region reported at once and confirms it one validity and epoch
// later (regionsync.Confirmations.Advance), reserves for each region the
// share under its reported revisions from the assumed one on
// (regionsync.Confirmations.Reserve) while more than one is in play, and
// answers with the confirmed revision (pkg/allocator's Service.Sync).

// configRev is one config revision written to etcd.
type configRev struct {
	rev int64
	cfg *config.Config
}

// regionConfig is a region's regional service's view of the config.
type regionConfig struct {
	chain regionsync.Chain
	rev   int64 // newest adopted
	// rises are the recent confirmations that may have raised shares
	// (pkg/regional's Server.configRises): process memory, lost with a
	// restart.
	rises regionsync.ConfigRises
}

// nodeConfig is a global replica's view (pkg/allocator's Service fields).
type nodeConfig struct {
	alloc      *hierarchy.Allocator // the process it belongs to (boot makes a new one)
	base       map[int]hierarchy.KeyLimit
	applied    *config.Config
	appliedRev int64
	held       map[int64]*config.Config
	conf       *regionsync.Confirmations
}

// configState is the World's config revisions and every view of them.
type configState struct {
	revs    []configRev // written so far, revs[0] the scenario's (revision 0)
	regions []*regionConfig
	nodes   map[*GlobalNode]*nodeConfig
}

func (w *World) initConfigs() {
	w.configs = configState{revs: []configRev{{rev: 0, cfg: w.cfg}}, nodes: map[*GlobalNode]*nodeConfig{}}
	for range w.regions {
		w.configs.regions = append(w.configs.regions, &regionConfig{chain: regionsync.NewChain(0, w.cfg)})
	}
}

// event runs an operator's event now: a new revision written to etcd
// (once etcd is reachable), then adopted by every region as its watch
// delivers it.
func (w *World) event(e scenario.Event) {
	g := w.global
	if !g.etcdUp {
		g.waitEtcd = append(g.waitEtcd, func() { w.event(e) })
		return
	}
	latest := w.configs.revs[len(w.configs.revs)-1]
	cfg := *latest.cfg
	cfg.Regions = maps.Clone(latest.cfg.Regions)
	rg := cfg.Regions[e.Region]
	rg.Drained = e.Kind == scenario.EventDrain
	cfg.Regions[e.Region] = rg
	if err := cfg.Validate(); err != nil {
		// sluicectl refuses it; the scenario validation rules it out.
		panic(fmt.Sprintf("sim: %s %s: the new config is invalid: %v", e.Kind, e.Region, err))
	}
	rev := latest.rev + 1
	w.configs.revs = append(w.configs.revs, configRev{rev: rev, cfg: &cfg})
	w.orc.Note(w.dur(), fmt.Sprintf("config revision %d written: %s %s", rev, e.Kind, e.Region))
	primary := w.regionByName(w.sc.Topology.Global.Primary).idx
	for _, r := range w.regions {
		// etcd runs next to the global primary: the watch delivers it one
		// hop later.
		w.eng.After(w.net.jittered(w.net.base[r.idx][primary]), func() { w.watchConfig(r) })
	}
}

// watchConfig is region r's config watcher delivering the newest
// revision: adopted at once when the region is alive and etcd reachable,
// else retried every epoch (the watch resumes).
func (w *World) watchConfig(r *Region) {
	rc := w.configs.regions[r.idx]
	latest := w.configs.revs[len(w.configs.revs)-1]
	if rc.rev >= latest.rev {
		return
	}
	if w.net.down[r.idx] || !w.global.etcdUp {
		w.eng.After(w.epoch, func() { w.watchConfig(r) })
		return
	}
	rc.rev = latest.rev
	rc.chain = rc.chain.Adopt(latest.rev, latest.cfg)
	w.orc.Note(w.dur(), fmt.Sprintf("%s adopts config revision %d", r.name, latest.rev))
	w.chainShares(r)
}

// chainShares recomputes region r's static share of every key from its
// chain (the smallest among its configs) and tells the oracle, with the
// floor the regional service runs on off lease.
func (w *World) chainShares(r *Region) {
	rc := w.configs.regions[r.idx]
	cur := rc.chain.Current().Cfg
	for _, k := range w.keys {
		res, err := cur.Resolve(k.key)
		if err != nil {
			continue
		}
		rate, burst, err := rc.chain.Share(r.name, k.key, cur, res)
		if err != nil {
			continue
		}
		c := &k.common[r.idx]
		c.AwaitingShare = burst == 0 && rc.chain.Awaiting(r.name, k.key, cur, res)
		c.ShareFill = luascripts.FillTime(res.Limit.Rate, float64(res.Limit.Burst))
		if c.StaticRate == rate && c.StaticBurst == burst {
			continue
		}
		c.StaticRate, c.StaticBurst = rate, burst
		fl := regionsync.FloorOf(regionsync.Share{Rate: rate, Burst: burst}, res)
		w.orc.StaticShares(w.dur(), r.idx, k.id, rate, burst, fl.Rate, fl.Burst)
	}
}

// restartedConfigs is region r's regional service starting again: it
// runs the newest revision, with no history (regionsync.NewChain).
func (w *World) restartedConfigs(r *Region) {
	latest := w.configs.revs[len(w.configs.revs)-1]
	w.configs.regions[r.idx] = &regionConfig{chain: regionsync.NewChain(latest.rev, latest.cfg), rev: latest.rev}
	w.chainShares(r)
}

// reportConfigs puts region r's chain revisions on its report (Leader:
// report.ConfigRevisions = reportedChain()).
func (w *World) reportConfigs(r *Region, rep *sluicev1.RegionReport) {
	rc := w.configs.regions[r.idx]
	var revs []int64
	rc.chain, revs = rc.chain.Reported()
	rep.ConfigRevisions = revs
}

// answeredConfigs applies the confirmed revision of an answer to region
// r's chain (followConfirmations): a raised share applies only now.
func (w *World) answeredConfigs(r *Region, g *sluicev1.RegionGrants) {
	if g == nil {
		return
	}
	rc := w.configs.regions[r.idx]
	before, old := rc.chain.Len(), rc.chain
	rc.chain = rc.chain.Answered(g)
	if regionsync.DrainLifted(r.name, old, rc.chain) && r.redisUp {
		// The leader stores the rise before the raised share applies
		// (pkg/regional, answered).
		r.riseUS = max(r.riseUS, r.redisNowUS())
	}
	rc.rises = rc.rises.Confirmed(old, rc.chain, r.redisNowUS())
	if rc.chain.Len() != before {
		w.chainShares(r)
	}
}

// --- The global replica's side. ---

func (n *GlobalNode) configView() *nodeConfig {
	w := n.g.w
	nc := w.configs.nodes[n]
	if nc == nil || nc.alloc != n.alloc {
		// A fresh process (boot): its allocator runs the scenario's config.
		nc = &nodeConfig{alloc: n.alloc, base: map[int]hierarchy.KeyLimit{}, applied: w.cfg, appliedRev: 0,
			held: map[int64]*config.Config{0: w.cfg}}
		nc.conf = regionsync.NewConfirmations(func(rev int64) bool { _, ok := nc.held[rev]; return ok })
		w.configs.nodes[n] = nc
		for _, r := range w.cfg.Regions {
			if r.Drained {
				if err := n.alloc.SetRegions(allocRegions(w.cfg)); err != nil {
					panic("sim: regions from a validated config were refused: " + err.Error())
				}
				break
			}
		}
	}
	return nc
}

// configLead is Service.promote's fresh Confirmations: what regions
// reported to an earlier term may predate confirmations another leader
// issued since, and a revision it assumed then was not counted by the
// leaders in between.
func (n *GlobalNode) configLead() {
	nc := n.configView()
	nc.conf = regionsync.NewConfirmations(func(rev int64) bool { _, ok := nc.held[rev]; return ok })
	n.pruneHeld(nc)
	n.configLimits(nc)
}

// configBefore is Service.applyConfigLocked at a Sync: the replica adopts
// the newest revision when etcd is reachable (drained flags go to the
// allocator's regions), then observes the report's revisions, re-setting
// every tracked key's limit when the reserves may have changed.
func (n *GlobalNode) configBefore(req *sluicev1.RegionReport, rep hierarchy.Report) {
	w := n.g.w
	nc := n.configView()
	if last, ok := n.alloc.LastSeq(rep.Region); ok && rep.Seq < last {
		return // refused as stale before it touches anything
	}
	if latest := w.configs.revs[len(w.configs.revs)-1]; w.global.etcdUp && latest.rev > nc.appliedRev {
		nc.applied, nc.appliedRev = latest.cfg, latest.rev
		nc.held[latest.rev] = latest.cfg
		n.pruneHeld(nc)
		if err := n.alloc.SetRegions(allocRegions(latest.cfg)); err != nil {
			panic("sim: regions from a validated config were refused: " + err.Error())
		}
		n.configLimits(nc)
	}
	observed := nc.conf.Observe(req.GetRegion(), req.GetConfigRevisions())
	// Service.advanceLocked: the two-step confirmation moves on.
	assumedMoved, confirmedMoved := nc.conf.Step(n.now(), configRegionNames(nc.applied), w.validity+w.epoch, n.learnFloor)
	if observed || assumedMoved || confirmedMoved {
		before := len(nc.held)
		n.pruneHeld(nc)
		if before > 1 || len(nc.held) > 1 {
			n.configLimits(nc)
		}
	}
}

// configTrack is Service.limitLocked for a key of a report, whose limit
// the report decoded to l.
func (n *GlobalNode) configTrack(k *keyInfo, l hierarchy.KeyLimit) {
	nc := n.configView()
	nc.base[k.id] = l
	if len(nc.held) > 1 {
		n.setLimit(nc, k)
	}
}

// configAnswer is the confirmed revision on an answer.
func (n *GlobalNode) configAnswer(out *sluicev1.RegionGrants) {
	nc := n.configView()
	out.ConfirmedRevision, out.ConfirmedKnown = nc.conf.Confirmed()
}

// configLimits is Service.setLimitsLocked: every tracked key's limit with
// the reserves.
func (n *GlobalNode) configLimits(nc *nodeConfig) {
	for _, id := range n.tracked {
		n.setLimit(nc, n.g.w.keys[id])
	}
}

func (n *GlobalNode) setLimit(nc *nodeConfig, k *keyInfo) {
	l, ok := nc.base[k.id]
	if !ok {
		return
	}
	if len(nc.held) > 1 {
		names := configRegionNames(nc.applied)
		l.StaticRate, l.StaticBurst = make([]float64, len(names)), make([]float64, len(names))
		for i, name := range names {
			l.StaticRate[i], l.StaticBurst[i] = nc.conf.Reserve(nc.held, name, k.key)
		}
	}
	if err := n.alloc.SetLimit(k.key, l); err != nil {
		panic("sim: a configured limit was refused: " + err.Error())
	}
}

// pruneHeld is Service.pruneHeldLocked.
func (n *GlobalNode) pruneHeld(nc *nodeConfig) {
	names := configRegionNames(nc.applied)
	confirmed, known := nc.conf.Assumed()
	inPlay := func(rev int64) bool {
		if rev == nc.appliedRev {
			return true
		}
		if known && rev < confirmed {
			return false
		}
		for _, name := range names {
			revs, heard := nc.conf.Reported(name)
			if !heard || slices.Contains(revs, rev) {
				return true
			}
		}
		return false
	}
	for rev := range nc.held {
		if !inPlay(rev) {
			delete(nc.held, rev)
		}
	}
}

// allocRegions are cfg's regions as the allocator takes them (name order).
func allocRegions(cfg *config.Config) []hierarchy.Region {
	var out []hierarchy.Region
	for _, name := range configRegionNames(cfg) {
		r := cfg.Regions[name]
		out = append(out, hierarchy.Region{Name: name, Weight: r.Weight, MinShare: r.MinShare, MaxShare: r.MaxShare, Drained: r.Drained})
	}
	return out
}

func configRegionNames(cfg *config.Config) []string {
	return slices.Sorted(maps.Keys(cfg.Regions))
}

// scheduleEvents schedules the scenario's events.
func (w *World) scheduleEvents() {
	for _, e := range w.sc.Events {
		w.eng.After(time.Duration(e.At), func() { w.event(e) })
	}
}
