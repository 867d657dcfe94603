package world

import (
	"slices"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// Global is the global tier: allocator replicas (a primary and an optional
// standby) of pkg/allocator's daemon, one of them elected leader through
// etcd, and etcd itself as a model of sessions.
//
// The model follows pkg/allocator's elector: a replica refreshes its
// session lease every TTL/6 and grants only until TTL/2 after the send
// time of its newest confirmed refresh. So when etcd becomes unreachable
// the leader stops granting between TTL/3 and TTL/2 later, and resumes
// when etcd is back (its lease survived: etcd renews leases when it comes
// back). A replica that dies leaves its election key until its lease runs
// out, between 5/6 and all of the TTL later (the TTL after etcd is back if
// etcd was down); then the next live replica wins and starts in learning
// mode. Region leaders (pkg/regional's Leader, sessions refreshed by the
// etcd client every TTL/3) lose leadership when their session lapses and
// are re-elected once the old key's lease ran out.
//
// Global and GlobalNode are not safe for concurrent use: only the goroutine
// running the World touches them.
type Global struct {
	w        *World
	nodes    []*GlobalNode
	leader   *GlobalNode
	etcdUp   bool
	etcdBack time.Duration // when etcd last came back
	waitEtcd []func()      // elections waiting for etcd
	// lapsed is the durable lapsed set in etcd (pkg/allocator's lapsed.go):
	// written by the leader while etcd is up, read by every new leader.
	lapsed []string
}

// GlobalNode is one allocator replica (pkg/allocator's Service). See
// Global for concurrency.
type GlobalNode struct {
	g       *Global
	name    string
	region  int // where it runs: its clock and network position
	alive   bool
	leading bool // holds the election
	paused  bool // leads, but its lease refresh lapsed: not granting
	gen     int
	alloc   *hierarchy.Allocator
	known   []bool // key ids with a limit set in alloc
	tracked []int  // key ids in alloc, in first-report order
	// learnFloor is Service.learnFloor: set only when the epoch, validity
	// or demand alpha change, which a run never does, so it stays zero.
	learnFloor time.Time
}

func newGlobal(w *World) *Global {
	g := &Global{w: w, etcdUp: true}
	idx := map[string]int{}
	for i, r := range w.regions {
		idx[r.name] = i
	}
	spec := w.sc.Topology.Global
	g.nodes = append(g.nodes, g.newNode("global-a@"+spec.Primary, idx[spec.Primary]))
	if spec.Standby != "" {
		g.nodes = append(g.nodes, g.newNode("global-b@"+spec.Standby, idx[spec.Standby]))
	}
	return g
}

func (g *Global) newNode(name string, region int) *GlobalNode {
	n := &GlobalNode{g: g, name: name, region: region, alive: true}
	n.boot()
	return n
}

// boot is a process start: a fresh allocator (pkg/allocator builds it at
// start, regions in name order).
func (n *GlobalNode) boot() {
	w := n.g.w
	var regions []hierarchy.Region
	for _, r := range w.regions {
		cr := w.cfg.Regions[r.name]
		regions = append(regions, hierarchy.Region{Name: r.name, Weight: cr.Weight, MinShare: cr.MinShare, MaxShare: cr.MaxShare})
	}
	slices.SortFunc(regions, func(a, b hierarchy.Region) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	a, err := hierarchy.NewAllocator(hierarchy.Options{
		Regions: regions, Epoch: w.epoch, Validity: w.validity, DemandAlpha: w.cfg.DemandAlpha,
		RegionLease: time.Duration(w.cfg.RegionLease),
	}, n.now())
	if err != nil {
		panic("sim: allocator options from a validated config were refused: " + err.Error())
	}
	n.alloc = a
	n.known = make([]bool, len(w.keys))
	n.tracked = nil
}

func (g *Global) start() { g.elect(0) }

// sessionExpiry is how long after a replica stopped refreshing its lease
// etcd expires it: the TTL minus the time since its last refresh.
func (w *World) sessionExpiry(refreshes int) time.Duration {
	ttl := w.sessionTTL
	return ttl - time.Duration(w.rngEtcd.Int64N(int64(ttl)/int64(refreshes)+1))
}

// elect makes the first live replica leader after delay, if there is no
// leader then and etcd is up.
func (g *Global) elect(delay time.Duration) {
	g.w.eng.After(delay, func() {
		if g.leader != nil {
			return
		}
		if !g.etcdUp {
			g.waitEtcd = append(g.waitEtcd, func() { g.elect(g.w.sessionTTL) })
			return
		}
		for _, n := range g.nodes {
			if n.alive {
				n.becomeLeader()
				return
			}
		}
	})
}

func (n *GlobalNode) now() time.Time { return n.g.w.clockAt(n.g.w.regions[n.region].offset) }

// granting is Service.leaderAt: leads and its lease refresh is current.
func (n *GlobalNode) granting() bool { return n.alive && n.leading && !n.paused }

func (n *GlobalNode) becomeLeader() {
	w := n.g.w
	n.leading, n.paused = true, false
	n.gen++
	n.g.leader = n
	// pkg/allocator's elector reads the lapsed set once it has won.
	n.alloc.BecomeLeader(n.now(), n.g.lapsed...)
	n.configLead()
	gen := n.gen
	var tick func()
	tick = func() {
		if !n.leading || n.gen != gen {
			return
		}
		if !n.paused {
			n.step()
		}
		w.eng.After(w.epoch, tick)
	}
	// The allocation loop ticks from the process start: any phase.
	w.eng.After(time.Duration(w.rngEtcd.Int64N(int64(w.epoch)))+1, tick)
	w.orc.Note(w.dur(), "global leader: "+n.name)
}

// step is Service.step: one allocation, then forget keys nobody named for
// longer than any grant can live (hierarchy.Allocator.ForgetIdle, as the
// service).
func (n *GlobalNode) step() {
	w := n.g.w
	now := n.now()
	n.alloc.Allocate(now)
	n.persistLapses(now)
	if n.alloc.ForgetIdle(now, n.learnFloor) == 0 {
		return
	}
	keep := n.tracked[:0]
	for _, id := range n.tracked {
		if _, held := n.alloc.LastNamed(w.keys[id].key); !held {
			n.known[id] = false
			continue
		}
		keep = append(keep, id)
	}
	n.tracked = keep
}

// persistLapses is pkg/allocator's persistLapses: pending lapses are
// written to etcd with the rest of the lapsed set (at once, when etcd is
// up: the simulator has no write latency), and only then counted at the
// regions' floors; the set shrinks lazily with a later write.
func (n *GlobalNode) persistLapses(now time.Time) {
	g := n.g
	if !g.etcdUp {
		return
	}
	pending := n.alloc.PendingLapses(now)
	set := n.alloc.LapsedSet()
	for _, r := range pending {
		if !slices.Contains(set, r) {
			set = append(set, r)
		}
	}
	slices.Sort(set)
	if len(pending) == 0 && (len(set) >= len(g.lapsed) || slices.Equal(set, g.lapsed)) {
		return
	}
	g.lapsed = set
	for _, r := range pending {
		if ok, err := n.alloc.LapseDurable(now, r); err == nil && ok {
			g.w.orc.Note(g.w.dur(), "global tier: region "+r+"'s static lease lapsed; its share above its floor is re-divided")
		}
	}
}

func (n *GlobalNode) stepDown() {
	if !n.leading {
		return
	}
	n.leading, n.paused = false, false
	n.gen++
	if n.g.leader == n {
		n.g.leader = nil
	}
}

// leaderForClients is the replica a region's allocator client reaches:
// the Client tries the replicas and follows "not leader" redirects, so it
// finds the leader whenever there is one.
func (g *Global) leaderForClients() *GlobalNode {
	if g.leader != nil && g.leader.granting() {
		return g.leader
	}
	return nil
}

// serve is Service.Sync: the report is decoded and checked as the service
// does, every reported key gets its limit, then the allocator answers.
func (n *GlobalNode) serve(req *sluicev1.RegionReport) (*sluicev1.RegionGrants, bool) {
	if !n.granting() {
		return nil, false
	}
	w := n.g.w
	rep, limits, err := regionsync.DecodeReport(w.cfg, req, regionsync.DefaultMaxKeys)
	if err != nil {
		w.counters.AllocatorErrors++
		return nil, false
	}
	at := n.now()
	n.configBefore(req, rep)
	applied := n.configView().applied
	for i, kd := range rep.Keys {
		limits[i].FloorShare = applied.PartitionShareOf(kd.Key.Class)
	}
	for i, kd := range rep.Keys {
		n.track(w.keyByQK[kd.Key], limits[i])
		n.configTrack(w.keyByQK[kd.Key], limits[i])
	}
	ans, err := n.alloc.Report(at, rep)
	if err != nil {
		w.counters.AllocatorErrors++
		return nil, false
	}
	n.nudge(n.alloc.TakeNudges()) // Service.Sync: before the answer
	w.orc.GrantsSent(len(ans.Grants))
	out := regionsync.EncodeGrants(rep, ans.Grants, n.alloc.Learning(at), n.alloc.Epoch(), n.alloc.ReportAgain(rep.Region))
	out.StaticLeaseMs = ans.StaticLease.Milliseconds()
	n.configAnswer(out)
	return out, true
}

// track gives a key new to the allocator its limit; the allocator keeps
// when a report or an answer last named it.
func (n *GlobalNode) track(k *keyInfo, limit hierarchy.KeyLimit) {
	if !n.known[k.id] {
		if err := n.alloc.SetLimit(k.key, limit); err != nil {
			panic("sim: a configured limit was refused: " + err.Error())
		}
		n.known[k.id] = true
		n.tracked = append(n.tracked, k.id)
	}
}

// crash kills replica n; if it led, the next live replica is elected once
// its lease runs out. It comes back after restartAfter as a fresh process.
func (n *GlobalNode) crash(restartAfter time.Duration) {
	if !n.alive {
		return
	}
	g := n.g
	w := g.w
	wasLeader := n.leading
	n.stepDown()
	n.alive = false
	if wasLeader {
		g.elect(w.sessionExpiry(6))
	}
	if restartAfter > 0 {
		w.eng.After(restartAfter, func() {
			n.alive = true
			n.boot()
			g.elect(0)
		})
	}
}

// etcdDown makes etcd unreachable for d.
func (g *Global) etcdDown(d time.Duration) {
	if !g.etcdUp {
		return
	}
	w := g.w
	g.etcdUp = false
	if l := g.leader; l != nil {
		// Service.leaderAt: no grant after TTL/2 from the last confirmed
		// refresh (refreshes every TTL/6).
		ttl := w.sessionTTL
		lapse := ttl/2 - time.Duration(w.rngEtcd.Int64N(int64(ttl/6)+1))
		gen := l.gen
		if lapse < d {
			w.eng.After(lapse, func() {
				if l.leading && l.gen == gen && !g.etcdUp {
					l.paused = true
					w.orc.Note(w.dur(), "global leader stops granting (lease refresh lapsed): "+l.name)
				}
			})
		}
	}
	for _, r := range w.regions {
		if !r.leaderUp {
			continue
		}
		lapse := w.sessionExpiry(3)
		gen := r.leaderGen
		if lapse < d {
			w.eng.After(lapse, func() {
				if r.leaderUp && r.leaderGen == gen {
					r.loseLeader(-1)
					g.waitEtcd = append(g.waitEtcd, func() { r.electLeader(w.sessionTTL) })
				}
			})
		}
	}
	w.eng.After(d, func() {
		g.etcdUp = true
		g.etcdBack = w.dur()
		if l := g.leader; l != nil && l.paused {
			l.paused = false
			w.orc.Note(w.dur(), "global leader resumes granting: "+l.name)
		}
		waiting := g.waitEtcd
		g.waitEtcd = nil
		for _, f := range waiting {
			f()
		}
		if g.leader == nil {
			g.elect(w.sessionTTL)
		}
	})
}

// nudge is the Watch streams of Service.Sync: each region named gets a
// nudge over its link to this node, unless the link drops it (a nudge
// only hastens a report).
func (n *GlobalNode) nudge(regions []string) {
	w := n.g.w
	for _, name := range regions {
		for _, r := range w.regions {
			if r.name != name {
				continue
			}
			d, lost := w.net.globalDelay(r.idx, n.region)
			if lost {
				continue
			}
			w.counters.Nudges++
			w.eng.After(d, r.nudged)
		}
	}
}
