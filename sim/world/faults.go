package world

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/regionsync"
	"github.com/sluicehq/sluice/sim/engine"
	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/scenario"
)

type engineTime = engine.Time

func (w *World) regionByName(name string) *Region {
	for _, r := range w.regions {
		if r.name == name {
			return r
		}
	}
	return nil
}

// missed says, for a label, that a fault meant for want instances found
// only hit of them in the state it needs ("" when it found them all).
func missed(hit, want int, state string) string {
	switch {
	case hit == want:
		return ""
	case hit == 0:
		return " (hit nothing: no instance " + state + ")"
	}
	return fmt.Sprintf(" (hit %d: no other instance %s)", hit, state)
}

// inject starts fault f now.
func (w *World) inject(f scenario.Fault) {
	now := w.dur()
	d := time.Duration(f.For)
	until := now + d
	label := f.Kind
	if f.Region != "" {
		label += " " + f.Region
	}
	switch f.Kind {
	case scenario.FaultInstanceCrash, scenario.FaultInstanceStop:
		r := w.regionByName(f.Region)
		hit := 0
		for i := 0; i < f.Count && len(r.insts) > 0; i++ {
			hit++
			// Deterministic victim: drawn from the routing stream.
			in := r.insts[w.rngRoute.IntN(len(r.insts))]
			if f.Kind == scenario.FaultInstanceCrash {
				in.crash()
			} else {
				in.stop()
			}
			if ra := time.Duration(f.RestartAfter); ra > 0 {
				w.eng.After(ra, func() {
					if !w.net.down[r.idx] { // a dead region starts its own when it comes back
						r.startInstance()
					}
				})
			}
		}
		label = fmt.Sprintf("%s ×%d", label, f.Count) + missed(hit, f.Count, "alive")
		until = now
	case scenario.FaultInstanceIsolate:
		r := w.regionByName(f.Region)
		var free []*Instance
		for _, in := range r.insts {
			if !in.isolated {
				free = append(free, in)
			}
		}
		hit := 0
		for i := 0; i < f.Count && len(free) > 0; i++ {
			hit++
			// Deterministic victim: drawn from the routing stream.
			j := w.rngRoute.IntN(len(free))
			free[j].isolate(d)
			free = append(free[:j], free[j+1:]...)
		}
		label = fmt.Sprintf("%s ×%d", label, f.Count) + missed(hit, f.Count, "alive and not isolated")
	case scenario.FaultRegionLeaderLoss:
		r := w.regionByName(f.Region)
		r.loseLeader(w.sessionExpiry(3))
		until = now
	case scenario.FaultGlobalLeaderLoss:
		if l := w.global.leader; l != nil {
			l.crash(time.Duration(f.RestartAfter))
			label += " " + l.name
		} else {
			label += " (hit nothing: no global leader)"
		}
		until = now
	case scenario.FaultRegionDown:
		r := w.regionByName(f.Region)
		ra := time.Duration(f.RestartAfter)
		if w.net.down[r.idx] {
			label += " (hit nothing: already down)"
		}
		w.regionDown(r, ra, f.RedisLost)
		until = time.Duration(w.sc.Duration)
		if ra > 0 {
			until = min(until, now+ra)
			if f.RedisLost {
				label += " (Redis lost)"
			}
		}
	case scenario.FaultPartition:
		r := w.regionByName(f.Region)
		w.net.partitioned[r.idx] = true
		w.eng.After(d, func() { w.net.partitioned[r.idx] = false })
	case scenario.FaultRedisRestart:
		r := w.regionByName(f.Region)
		r.redisDown()
		w.eng.After(d, func() { r.redisBack() })
	case scenario.FaultEtcdDown:
		w.global.etcdDown(d)
	case scenario.FaultLatency:
		r := w.regionByName(f.Region)
		lat := time.Duration(f.Latency)
		label = fmt.Sprintf("latency %s↔%s %v", f.Region, f.Peer, lat)
		if f.Peer == scenario.GlobalPeer {
			prev, had := w.net.globalOverride[r.idx]
			w.net.globalOverride[r.idx] = lat
			if d > 0 {
				w.eng.After(d, func() {
					if had {
						w.net.globalOverride[r.idx] = prev
					} else {
						delete(w.net.globalOverride, r.idx)
					}
				})
			}
		} else {
			key := pairKey(r.idx, w.regionByName(f.Peer).idx)
			prev, had := w.net.pairOverride[key]
			w.net.pairOverride[key] = lat
			if d > 0 {
				w.eng.After(d, func() {
					if had {
						w.net.pairOverride[key] = prev
					} else {
						delete(w.net.pairOverride, key)
					}
				})
			}
		}
		if d == 0 {
			until = time.Duration(w.sc.Duration)
		}
	case scenario.FaultReplyLoss, scenario.FaultReportReplay:
		r := w.regionByName(f.Region)
		v := w.net.replyLoss
		if f.Kind == scenario.FaultReportReplay {
			v = w.net.replay
		}
		prev := v[r.idx]
		v[r.idx] = f.Loss
		label = fmt.Sprintf("%s %s %.0f%%", f.Kind, f.Region, 100*f.Loss)
		w.eng.After(d, func() { v[r.idx] = prev })
	case scenario.FaultRegionReportReplay:
		r := w.regionByName(f.Region)
		w.net.reportReplay[r.idx] = true
		w.eng.After(d, func() { w.net.reportReplay[r.idx] = false })
	case scenario.FaultStaleLeader:
		w.staleLeader(w.regionByName(f.Region), d)
	case scenario.FaultLoss:
		prev := w.net.lossOverride
		w.net.lossOverride = f.Loss
		label = fmt.Sprintf("loss %.0f%%", 100*f.Loss)
		w.eng.After(d, func() { w.net.lossOverride = prev })
	}
	w.orc.Fault(now, until, label)
}

// --- Whole-region failure. ---

// regionDown kills region r whole: its instances crash (their leases are
// followed until reaped, as any crash's), its region leader and replicas
// stop (no election), the global tier replicas running there crash (back
// with the region, as fresh processes), and its link to the global tier is
// gone. Its Redis is unreachable meanwhile. After restart (if > 0) the
// region comes back: Redis as it was, or empty when lost (the restart
// guard then applies); the topology's instances start again and a new
// region leader is elected at once (the old session expired long ago).
func (w *World) regionDown(r *Region, restart time.Duration, lost bool) {
	if w.net.down[r.idx] {
		return
	}
	w.net.down[r.idx] = true
	for _, in := range r.all { // those stopping gracefully too
		in.crash()
	}
	r.loseLeader(-1)
	for _, n := range w.global.nodes {
		if n.region == r.idx {
			n.crash(restart)
		}
	}
	// Nothing reaches the region's Redis while it is dead. Lost, the
	// oracle counts nothing there until it is back empty; kept, the bucket
	// refills lazily over the outage when it is next touched, so the
	// oracle keeps counting the region's grant, then its static share or
	// floor.
	redisWasUp := r.redisUp
	if lost {
		r.redisDown()
	} else {
		r.redisUp = false
	}
	if restart <= 0 {
		return
	}
	n := 0
	for _, rs := range w.sc.Topology.Regions {
		if rs.Name == r.name {
			n = rs.Instances
		}
	}
	w.eng.After(restart, func() {
		w.net.down[r.idx] = false
		switch {
		case lost:
			r.redisBack()
			// The region's processes start again on the empty Redis: their
			// guard's first look. Under cold_start full they trust it to
			// be a fresh deployment (buckets start full): the documented
			// opt-out, whose free bursts the oracle counts as ε.
			r.stampBorn(true)
			if r.w.sc.Topology.ColdStart == "full" {
				k := r.w.keys
				wait := time.Duration(0)
				if len(k) > 0 {
					wait = k[0].common[r.idx].RestartWait
				}
				r.trustedUntilUS = r.redisNowUS() + wait.Microseconds()
				r.trustedSeen = map[int]bool{}
			}
		case redisWasUp:
			r.redisUp = true
		}
		for i := 0; i < n; i++ {
			r.startInstance()
		}
		w.restartedConfigs(r)
		r.electLeader(0)
		w.orc.Note(w.dur(), "region back: "+r.name)
	})
}

// --- Replays, lost answers and stale grants. ---

// installRec is the last answer a region leader installed, kept for a
// stale-leader fault.
type installRec struct {
	answer *sluicev1.RegionGrants
	sendUS int64
	held   regionsync.Held
}

// installed remembers the answer a region leader just installed.
func (r *Region) installed(answer *sluicev1.RegionGrants, sendUS int64, held regionsync.Held) {
	r.w.net.lastInstall[r.idx] = &installRec{answer: answer, sendUS: sendUS, held: held}
}

// replayLease delivers an instance's lease request (Acquire, Sync or
// Release) to its region again, later, under a report-replay fault: the
// network or a proxy delivering it twice, possibly after newer reports.
// The answer goes nowhere. Reports carry (instance, seq), so the replay
// must change nothing.
func (in *Instance) replayLease(reports []*sluicev1.KeyReport, op func(reports []*sluicev1.KeyReport)) {
	w := in.w
	r := in.region
	if p := w.net.replay[r.idx]; !(p > 0) || w.net.rng.Float64() >= p {
		return
	}
	dup := make([]*sluicev1.KeyReport, len(reports))
	for i, rep := range reports {
		dup[i] = proto.Clone(rep).(*sluicev1.KeyReport)
	}
	delay := time.Duration(w.net.rng.Int64N(int64(2*w.refresh))) + w.net.localDelay()
	w.eng.After(delay, func() {
		w.orc.RPC(oracle.TierInstance, 1)
		w.counters.Replays++
		op(dup)
	})
}

// replayReport delivers a region report to the global leader a second
// time under a region-report-replay fault: the allocator must answer a
// retry with its previous answer and change nothing.
func (r *Region) replayReport(node *GlobalNode, rep *sluicev1.RegionReport, answer *sluicev1.RegionGrants) {
	w := r.w
	if !w.net.reportReplay[r.idx] || answer == nil {
		return
	}
	w.orc.RPC(oracle.TierGlobal, 1)
	w.counters.Replays++
	again, ok := node.serve(rep)
	if !ok || !proto.Equal(again, answer) {
		w.counters.ReplayMismatches++
	}
}

// staleLeader pauses region r's leader (a long GC pause or a frozen VM):
// its session lapses and another replica is elected; when it wakes up,
// after d, it installs the last answer it had, from before the new
// leader's. Each Redis must refuse a grant older than one it applied.
func (w *World) staleLeader(r *Region, d time.Duration) {
	rec := w.net.lastInstall[r.idx]
	r.loseLeader(w.sessionExpiry(3))
	if rec == nil {
		return
	}
	w.eng.After(d, func() {
		w.counters.Replays++
		r.install(rec.answer, rec.sendUS, rec.held)
	})
}
