package world

import (
	"cmp"
	"slices"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional/reply"
	"github.com/sluicehq/sluice/pkg/regionsync"
	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/scenario"
)

// Region is one region: its Redis (the Model), its regional service (the
// request handling of pkg/regional's Server over the Model), its region
// leader loop (pkg/regional's Leader) and its instances. Not safe for
// concurrent use: only the goroutine running the World touches it.
type Region struct {
	w      *World
	idx    int
	name   string
	offset time.Duration

	model   *luascripts.Model
	redisUp bool
	// redisDownAt is when Redis last went down (redisDown).
	redisDownAt time.Duration
	// trustedUntilUS: the region's processes restarted on an empty Redis
	// under cold_start full and trusted it to start full (the documented
	// opt-out): until the restart wait from then, every bucket's holdings
	// when first seen in that data set are counted as crash error ε;
	// trustedSeen marks the keys counted.
	trustedUntilUS int64
	trustedSeen    map[int]bool
	// staticUS is the end of the region's static lease as its Redis holds
	// it (pkg/regional's {static}:lease key; 0 = none, lost with the
	// data). The regional service reads it on every call (a replica's
	// periodic read, without its lag).
	staticUS int64
	// riseUS is when the region's static shares last rose off their
	// floor (pkg/regional's {static}:lease:rise key, regionsync.CameBack and
	// DrainLifted; 0 = none, lost with the data): the scripts credit a
	// bucket idle across it only its floor before it (docs/architecture.md,
	// "Coming back from a floor").
	riseUS int64

	insts    []*Instance // live and serving, in start order
	all      []*Instance // every instance ever started
	nextNum  int
	instVers int // bumped whenever insts changes (routing caches)

	// Region leader loop: the pump around regionsync's decisions.
	leaderUp  bool
	leaderGen int
	leader    *regionsync.Leader
	round     *regionsync.Round // the current epoch's reports
	// The loop is sequential (Leader.SyncOnce returns, after its extra
	// report if any, before the next tick is read): a tick while a report
	// is out waits for its answer or timeout, as a time.Ticker's buffered
	// tick does.
	busy, tickWaiting bool
	// Nudges (Leader.lead): when the last round started, a nudge that
	// came while a round was out, and a nudge waiting for the spacing.
	roundStart               time.Duration
	nudgeWaiting, nudgeTimed bool
	// again sends the report a round waits to send (a catch-up), nil
	// when the round is not waiting: a nudge sends it at once
	// (Leader.syncRound).
	fresh    regionsync.FreshWatch // Leader.fresh
	again    func()
	againSeq int // which wait again belongs to: a timer of an earlier one does nothing

	// Leases of crashed instances, by key id, until the Model reaps them
	// (observe.go).
	crashed map[int][]*crashLease
	// Leases of isolated instances, by key id, until the Model reaps them
	// or a report after the isolation reaches them (isolate.go).
	isolated map[int][]*isoLease
}

func newRegion(w *World, idx int, rs scenario.RegionSpec) *Region {
	return &Region{
		w: w, idx: idx, name: rs.Name, offset: time.Duration(rs.ClockOffset),
		model: luascripts.NewModel(), redisUp: true,
		leader: regionsync.NewLeader(), crashed: map[int][]*crashLease{},
		isolated: map[int][]*isoLease{},
	}
}

// redisNowUS is the region's Redis TIME.
func (r *Region) redisNowUS() int64 { return r.w.clockAt(r.offset).UnixMicro() }

// bornKey is the born sentinel of the region's Redis (one data set).
func (r *Region) bornKey() string { return luascripts.BornKeys(redisPrefix, false)[0] }

// stampBorn is the restart guard's stamp (regional.RestartGuard.Check):
// on a process's first look under cold_start full a missing sentinel is
// written as 0 (buckets start full), else as now.
func (r *Region) stampBorn(firstLook bool) {
	r.model.StampBorn(r.redisNowUS(), r.bornKey(), firstLook && r.w.sc.Topology.ColdStart == "full")
}

func (r *Region) start() {
	r.stampBorn(true)
	n := 0
	for _, rs := range r.w.sc.Topology.Regions {
		if rs.Name == r.name {
			n = rs.Instances
		}
	}
	for i := 0; i < n; i++ {
		r.startInstance()
	}
	// The regional service's background tick (Server.Run): the restart
	// guard's check every epoch. Redis expires idle keys by their TTLs;
	// the Model does when asked, here every expirySweep epochs. A key is
	// only ever idle past its TTL when its bucket is full and its leases
	// long expired, so the sweep's lateness changes no decision.
	phase := time.Duration(r.w.rngInst.Int64N(int64(r.w.epoch)))
	ticks := 0
	var tick func()
	tick = func() {
		if r.redisUp {
			r.stampBorn(false) // the guard's check every epoch
		}
		if ticks++; r.redisUp && ticks%expirySweep == 0 {
			r.expired(r.model.ExpireDue(r.redisNowUS()))
		}
		r.w.eng.After(r.w.epoch, tick)
	}
	r.w.eng.After(phase, tick)
	r.electLeader(0)
}

func (r *Region) startInstance() *Instance {
	in := newInstance(r, r.nextNum)
	r.nextNum++
	r.insts = append(r.insts, in)
	r.all = append(r.all, in)
	r.instVers++
	in.start()
	return in
}

func (r *Region) removeInstance(in *Instance) {
	for i, x := range r.insts {
		if x == in {
			r.insts = append(r.insts[:i], r.insts[i+1:]...)
			r.instVers++
			return
		}
	}
}

// common is what the regional service hands the scripts for k (Server.
// common): the static share while the static lease is known valid, else
// the floor (regionsync.Choose, on the Redis clock: the twin's replica
// reads it exactly).
func (r *Region) common(k *keyInfo) luascripts.Common {
	c := k.common[r.idx]
	static := regionsync.Share{Rate: c.StaticRate, Burst: c.StaticBurst}
	lease, margin := regionsync.StaticLease{UntilUS: r.staticUS}, regionsync.StaticMargin(r.w.epoch)
	floor := regionsync.FloorOf(static, k.res)
	sh := regionsync.Choose(r.redisNowUS(), lease, margin, static, floor)
	c.StaticRate, c.StaticBurst = sh.Rate, sh.Burst
	if regionsync.OnStatic(r.redisNowUS(), lease, margin) {
		rise := r.riseFor(k, c, static, floor)
		c.RiseUS, c.FloorRate, c.FloorBurst = rise.RiseUS, rise.Floor.Rate, rise.Floor.Burst
	}
	// Off its lease the region runs its floor: no share is awaited there.
	c.AwaitingShare = c.AwaitingShare && regionsync.OnStatic(r.redisNowUS(), lease, margin)
	// The simulated Redis runs a script at the instant of the choice, so
	// the deadline the regional service gives it never passes.
	c.DeadlineUS = regionsync.ScriptDeadline(r.redisNowUS(), lease, margin)
	return c
}

// riseFor is Server.common's rise: the region's rise off a floor and the
// confirmations that raised its shares, of those that still matter for k
// (regionsync.RiseFor).
func (r *Region) riseFor(k *keyInfo, c luascripts.Common, static, floor regionsync.Share) regionsync.Rise {
	rc := r.w.configs.regions[r.idx]
	if r.riseUS == 0 && len(rc.rises) == 0 {
		return regionsync.Rise{}
	}
	cur := rc.chain.Current().Cfg
	res, err := cur.Resolve(k.key)
	if err != nil {
		return regionsync.Rise{}
	}
	return regionsync.RiseFor(r.redisNowUS(), c.ShareFill, regionsync.StaticMargin(r.w.epoch), r.riseUS, floor, static,
		rc.rises, r.name, k.key, cur, res)
}

// op counts one script call.
func (r *Region) op() { r.w.orc.RPC(oracle.TierRedis, 1) }

// candidates is Leader.candidates: the keys the scripts marked in the
// region's candidate set (one Redis, one set) since the horizon, an epoch
// report trimming older marks, and the keys the leader selected before
// (regionsync.Leader.Select), in the order regionsync gives.
func (r *Region) candidates(sendUS int64, kind regionsync.Kind) []*keyInfo {
	w := r.w
	set := luascripts.CandKeys(redisPrefix, false)[0]
	since := regionsync.CandidatesSince(sendUS, w.epoch)
	r.op() // ZRANGEBYSCORE
	var marked []quota.Key
	for member, score := range r.model.Candidates(set) {
		if score >= since {
			if k := w.keyByMember[member]; k != nil {
				marked = append(marked, k.key)
			}
		}
	}
	if kind == regionsync.Epoch {
		r.op() // ZREMRANGEBYSCORE
		r.model.TrimCandidates(set, since)
	}
	keys := r.leader.Select(marked)
	out := make([]*keyInfo, 0, len(keys))
	for _, k := range keys {
		if ki := w.keyByQK[k]; ki != nil {
			out = append(out, ki)
		}
	}
	return out
}

// --- The regional service (mirror of pkg/regional's Server handlers). ---

func (r *Region) keyOf(qk *sluicev1.QuotaKey) *keyInfo {
	return r.w.keyByQK[quota.Key{Tenant: qk.GetTenant(), Class: qk.GetClass()}]
}

// grant is the reply Server.grant sends (reply.Grant). Grants come from a
// free list: the lease table copies what it needs in Apply, after which
// the instance hands them back (recycle).
func (r *Region) grant(k *keyInfo, seq uint64, lr luascripts.LeaseReply) *sluicev1.Grant {
	var g *sluicev1.Grant
	if n := len(r.w.freeGrants); n > 0 {
		g = r.w.freeGrants[n-1]
		r.w.freeGrants = r.w.freeGrants[:n-1]
	} else {
		g = new(sluicev1.Grant)
	}
	return reply.Grant(g, k.wire, k.res, seq, lr, false) // every simulated region has a global tier
}

// recycle returns applied grants to the free list.
func (w *World) recycle(grants []*sluicev1.Grant) {
	w.freeGrants = append(w.freeGrants, grants...)
}

// leaseOp serves Acquire and Sync reports; ok false means Redis is down
// (the RPC fails Unavailable).
func (r *Region) leaseOp(instance string, reports []*sluicev1.KeyReport, acquire bool) ([]*sluicev1.Grant, bool) {
	if !r.redisUp {
		return nil, false
	}
	now := r.redisNowUS()
	grants := make([]*sluicev1.Grant, len(reports))
	for i, rep := range reports {
		k := r.keyOf(rep.GetKey())
		// A strict class still books a lease issued before it became
		// strict, as the regional server does (reply.Report).
		strict := k.res.Class.Mode == config.ModeStrict
		r.op()
		var lr luascripts.LeaseReply
		if acquire {
			lr = r.model.Acquire(now, k.rkeys, r.common(k), reply.Report(instance, 0, rep, strict))
		} else {
			lr = r.model.Sync(now, k.rkeys, r.common(k), reply.Report(instance, 0, rep, strict))
		}
		if lr.TooLate {
			return nil, false // as the regional service answers it: Unavailable
		}
		r.observe(k)
		grants[i] = r.grant(k, rep.GetSeq(), lr)
	}
	return grants, true
}

func (r *Region) release(instance string, reports []*sluicev1.KeyReport) bool {
	if !r.redisUp {
		return false
	}
	now := r.redisNowUS()
	for _, rep := range reports {
		k := r.keyOf(rep.GetKey())
		r.op()
		if rr := r.model.Release(now, k.rkeys, r.common(k), reply.Report(instance, 0, rep, false)); rr.TooLate {
			return false // as the regional service answers it: Unavailable
		}
		r.observe(k)
	}
	return true
}

func (r *Region) check(k *keyInfo, cost int64) (*sluicev1.CheckResponse, bool) {
	if !r.redisUp {
		return nil, false
	}
	now := r.redisNowUS()
	r.op()
	cr := r.model.Check(now, k.rkeys, r.common(k), cost)
	if cr.TooLate {
		return nil, false // as the regional service answers it: Unavailable
	}
	r.w.orc.RegionPending(r.idx, k.id, cost) // until the instance records it
	r.observe(k)
	return reply.Check(k.res, cr, false), true
}

// --- Redis outage. ---

func (r *Region) redisDown() {
	if !r.redisUp {
		return
	}
	r.redisUp = false
	r.redisDownAt = r.w.dur()
	r.w.orc.RedisDown(r.w.dur(), r.idx)
}

// redisBack brings Redis back empty: every bucket, lease, grant, the born
// sentinel and the candidate set are gone. The first script that
// creates a bucket in the new data set, or the guard's next check, dates
// it, so buckets are re-created conservatively.
func (r *Region) redisBack() {
	if r.redisUp {
		return
	}
	r.model = luascripts.NewModel()
	r.redisUp = true
	r.trustedUntilUS, r.trustedSeen = 0, nil
	r.staticUS = 0 // the static lease went with the data: the floor
	r.riseUS = 0   // and so did the rise
	r.crashesLost()
	clear(r.isolated)
	r.w.orc.RedisUp(r.w.dur(), r.idx)
}

// --- Region leader (pkg/regional's Leader: a pump around regionsync). ---

// electLeader makes a replica the region's leader after delay, if etcd lets
// it; the loop then syncs every epoch.
func (r *Region) electLeader(delay time.Duration) {
	r.w.eng.After(delay, func() {
		if r.leaderUp {
			return
		}
		if !r.w.global.etcdUp {
			r.w.global.waitEtcd = append(r.w.global.waitEtcd, func() { r.electLeader(r.w.sessionTTL) })
			return
		}
		r.leaderUp = true
		r.leaderGen++
		r.busy, r.tickWaiting = false, false
		r.nudgeWaiting, r.nudgeTimed = false, false
		r.again = nil
		r.fresh.Reset()
		r.leader.Elected()
		gen := r.leaderGen
		var tick func()
		tick = func() {
			if !r.leaderUp || r.leaderGen != gen {
				return
			}
			if r.busy {
				r.tickWaiting = true
			} else {
				r.epochSync(gen)
			}
			r.w.eng.After(r.w.epoch, tick)
		}
		// The first round goes at once (Leader.lead; after the events
		// already due now, such as a global election at the same
		// instant), then the loop's ticker, started at the election: any
		// phase.
		r.w.eng.After(0, func() {
			if r.leaderUp && r.leaderGen == gen && !r.busy {
				r.epochSync(gen)
			}
		})
		r.w.eng.After(time.Duration(r.w.rngEtcd.Int64N(int64(r.w.epoch)))+1, tick)
		// Leader.lead's rise ticker: the watched keys' states between
		// epochs; a rise nudges the loop itself.
		spacing := regionsync.NudgeSpacing(r.w.epoch)
		var rise func()
		rise = func() {
			if !r.leaderUp || r.leaderGen != gen {
				return
			}
			if !r.busy && r.moved() {
				r.nudged()
			}
			r.w.eng.After(spacing, rise)
		}
		r.w.eng.After(spacing, rise)
	})
}

// moved is Leader.moved: the watched keys' states, and the fresh ones'
// (freshKeys), from the Model, judged by regionsync (a rise, or a granted
// key's fall).
func (r *Region) moved() bool {
	if !r.redisUp {
		return false
	}
	now := r.redisNowUS()
	keys := append(r.leader.Watched(), r.freshKeys(now)...)
	if len(keys) == 0 {
		return false
	}
	reads := make([]regionsync.KeyRead, 0, len(keys))
	for _, qk := range keys {
		k := r.w.keyByQK[qk]
		if k == nil {
			continue
		}
		r.op()
		c := r.common(k)
		reads = append(reads, regionsync.KeyRead{Key: qk, State: r.model.State(now, k.rkeys, c), StaticRate: c.StaticRate})
		r.observe(k)
	}
	rose, fell := r.leader.Moved(r.w.epoch, reads)
	return rose || fell
}

// freshKeys is Leader.freshKeys on the Model's candidate set (a single
// Redis): when the set grew since the last look, the keys marked since
// that the leader neither reports nor watches.
func (r *Region) freshKeys(nowUS int64) []quota.Key {
	set := luascripts.CandKeys(redisPrefix, false)[0]
	r.op() // TIME and ZCARD, pipelined
	cands := r.model.Candidates(set)
	read, since := r.fresh.Look(int64(len(cands)), nowUS)
	if !read {
		return nil
	}
	r.op() // ZRANGEBYSCORE
	until := nowUS + regionsync.NudgeSpacing(r.w.epoch).Microseconds()
	var members []string
	for member, score := range cands {
		if score >= since && score <= until {
			members = append(members, member)
		}
	}
	// Redis returns the marks in score order, then member: the Model's map
	// in the same order, so that MaxWatched keeps the same keys.
	slices.SortFunc(members, func(a, b string) int { return cmp.Or(cmp.Compare(cands[a], cands[b]), cmp.Compare(a, b)) })
	var marked []quota.Key
	for _, m := range members {
		if k := r.w.keyByMember[m]; k != nil {
			marked = append(marked, k.key)
		}
	}
	return r.leader.Fresh(marked)
}

// loseLeader ends the current leader's loop (crash, or its session
// expired); a new leader is elected after newAfter unless it is negative.
func (r *Region) loseLeader(newAfter time.Duration) {
	if !r.leaderUp {
		return
	}
	r.leaderUp = false
	r.leaderGen++
	if newAfter >= 0 {
		r.electLeader(newAfter)
	}
}

// epochSync is Leader.round: an epoch's round of reports (SyncOnce); when
// it fails at once, the etcd rule of the static lease.
func (r *Region) epochSync(gen int) {
	r.roundStart = r.w.dur()
	r.round = regionsync.NewRound(r.w.epoch)
	if !r.syncOnce(gen, regionsync.Epoch) {
		r.noGlobalLeader()
	}
}

// nudged is a nudge from the global leader reaching the region leader's
// loop: a round now, or once the loop is free and the spacing since the
// last round's start (regionsync.NudgeWait) has passed.
func (r *Region) nudged() {
	if !r.leaderUp {
		return
	}
	if send := r.again; send != nil {
		// Leader.syncRound: the nudge is spent on the report the round
		// waits to send.
		send()
		return
	}
	if r.nudgeTimed {
		return
	}
	if r.busy {
		r.nudgeWaiting = true
		return
	}
	gen := r.leaderGen
	now := r.w.dur()
	wait := regionsync.NudgeWait(time.Unix(0, int64(r.roundStart)), time.Unix(0, int64(now)), r.w.epoch)
	if wait > 0 {
		r.nudgeTimed = true
		r.w.eng.After(wait, func() {
			if r.leaderGen != gen {
				return
			}
			r.nudgeTimed = false
			r.nudged()
		})
		return
	}
	r.roundStart = now
	r.round = regionsync.NewNudgedRound(r.w.epoch)
	if !r.syncOnce(gen, regionsync.Nudged) {
		r.noGlobalLeader()
	}
}

// noGlobalLeader is Leader.NoGlobalLeader: with etcd reachable and no
// global allocator replica's election key in it, regionsync may extend a
// still running static lease; the leader stores it.
func (r *Region) noGlobalLeader() {
	if !r.redisUp || !r.w.global.etcdUp || !globalElectionEmpty(r.w.global) {
		return
	}
	r.leader.Load(regionsync.StaticLease{UntilUS: r.staticUS})
	now, prev := r.redisNowUS(), r.leader.Static()
	if r.leader.NoGlobalLeader(now, now, time.Duration(r.w.cfg.RegionLease)) {
		r.storeStatic(prev)
	}
}

// globalElectionEmpty says whether etcd holds no global replica's election
// key: no replica leads. The model drops a crashed leader at once, while
// etcd keeps its key until its session lease runs out (at most a session
// TTL): in that window the simulated region may extend where a real one
// waits. That is still safe: the dead leader decides nothing more, and
// whoever is elected next counts the region's silence from its election.
func globalElectionEmpty(g *Global) bool { return g.leader == nil }

// storeStatic is Leader.storeStatic: the leader's lease raised into
// Redis; prev is the leader's own before (raiseStatic takes the later of it
// and the stored end, which a Redis that lost its data forgot).
func (r *Region) storeStatic(prev regionsync.StaticLease) {
	if r.redisUp {
		now, old := r.redisNowUS(), regionsync.StaticLease{UntilUS: max(r.staticUS, prev.UntilUS)}
		r.staticUS = max(r.staticUS, r.leader.Static().UntilUS)
		if regionsync.CameBack(old, regionsync.StaticLease{UntilUS: r.staticUS}, now, r.w.validity) {
			r.riseUS = max(r.riseUS, now)
		}
		r.w.staticStored(r, r.staticUS)
	}
}

// syncOnce is Leader.syncOnce: report the candidates (regionsync builds
// the report from the states read from the Model at the send time), send
// it to the global leader, install the answer; the round then says what
// follows. It reports whether a report went out (the loop is busy until
// the round is done).
func (r *Region) syncOnce(gen int, kind regionsync.Kind) bool {
	if !r.redisUp {
		return false // redis time: connection refused
	}
	w := r.w
	sendUS := r.redisNowUS()
	r.leader.Load(regionsync.StaticLease{UntilUS: r.staticUS}) // read with Redis TIME
	keys := r.candidates(sendUS, kind)
	reads := make([]regionsync.KeyRead, len(keys))
	for i, k := range keys {
		r.op()
		c := r.common(k)
		reads[i] = regionsync.KeyRead{Key: k.key, State: r.model.State(sendUS, k.rkeys, c), StaticRate: c.StaticRate}
		r.observe(k)
	}
	rep, held := r.leader.Report(r.name, sendUS, r.w.epoch, kind, reads)
	w.reportConfigs(r, rep)
	node := w.global.leaderForClients()
	if node == nil {
		return false // the allocator client finds no leader: the sync fails
	}
	w.orc.RPC(oracle.TierGlobal, 1)
	var answer *sluicev1.RegionGrants
	site := node.region
	r.busy = true
	w.exchange(
		func() (time.Duration, bool) { return w.net.globalDelay(r.idx, site) },
		func() (time.Duration, bool) { return w.net.globalDelay(r.idx, site) },
		w.epoch,
		func() bool { return r.leaderUp && r.leaderGen == gen },
		func() bool {
			var ok bool
			answer, ok = node.serve(rep)
			r.replayReport(node, rep, answer)
			return ok
		},
		func() {
			// Leader.staticAnswered, before the installs.
			prev := r.leader.Static()
			if grew, _ := r.leader.StaticAnswered(answer, sendUS); grew {
				r.storeStatic(prev)
			}
			w.answeredConfigs(r, answer)
			a, ok := r.install(answer, sendUS, held)
			if !ok {
				r.syncDone(gen) // the installs failed: the round ends
				return
			}
			next, wait, more := r.round.Next(a)
			switch {
			case !more:
				r.syncDone(gen)
			case wait <= 0:
				if !r.syncOnce(gen, next) {
					r.syncDone(gen)
				}
			default:
				r.againSeq++
				seq := r.againSeq
				send := func() {
					r.again = nil
					if r.leaderUp && r.leaderGen == gen && !r.syncOnce(gen, next) {
						r.syncDone(gen)
					}
				}
				r.again = send
				w.eng.After(wait, func() {
					if r.again != nil && r.againSeq == seq {
						send()
					}
				})
			}
		},
		func() {
			if r.leaderUp && r.leaderGen == gen {
				r.noGlobalLeader() // Leader.round after a failed SyncOnce
			}
			r.syncDone(gen)
		},
	)
	return true
}

// syncDone ends the loop's current sync; a tick that came meanwhile syncs
// now.
func (r *Region) syncDone(gen int) {
	r.busy = false
	if r.tickWaiting {
		r.tickWaiting = false
		if r.leaderUp && r.leaderGen == gen {
			r.epochSync(gen)
		}
	}
	if r.nudgeWaiting && !r.busy {
		r.nudgeWaiting = false
		if r.leaderUp && r.leaderGen == gen {
			r.nudged()
		}
	}
}

// install is Leader.install: regionsync says what to install; each goes to
// the Model's set_rate. ok is false when Redis is down.
func (r *Region) install(g *sluicev1.RegionGrants, sendUS int64, held regionsync.Held) (regionsync.Answer, bool) {
	if !r.redisUp {
		return regionsync.Answer{}, false
	}
	r.installed(g, sendUS, held)
	installs, _ := regionsync.Installs(g, sendUS, held)
	applied := make([]bool, len(installs))
	now := r.redisNowUS()
	for i, in := range installs {
		k := r.w.keyByQK[in.Key]
		if k == nil {
			continue
		}
		r.op()
		c := r.common(k)
		installs[i].FromStatic(c.StaticRate)
		sr := r.model.SetRate(now, k.rkeys, c, in.Rate, in.Burst, in.ExpiryUS, in.FenceUS, in.Deposit)
		if in.Deposit > 0 {
			r.w.orc.Deposited(r.idx, k.id, in.Deposit)
		}
		r.observe(k)
		if sr.Applied {
			applied[i] = true
			installs[i].Released = sr.Released
			r.w.orc.GrantApplied(r.w.dur(), r.idx, k.id, in.Rate, in.Burst, trueTimeOf(in.ExpiryUS, r.offset))
			r.w.orc.GrantIssued(r.w.dur(), r.idx, k.id, in.FenceUS)
		}
	}
	r.leader.Installed(installs, applied)
	return regionsync.Outcome(g, installs, applied), true
}
