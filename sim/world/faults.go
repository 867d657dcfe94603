package world

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/sim/engine"
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
		for i := 0; i < f.Count && len(r.insts) > 0; i++ {
			// Deterministic victim: drawn from the routing stream.
			in := r.insts[w.rngRoute.IntN(len(r.insts))]
			if f.Kind == scenario.FaultInstanceCrash {
				in.crash()
			} else {
				in.stop()
			}
			if ra := time.Duration(f.RestartAfter); ra > 0 {
				w.eng.After(ra, func() { r.startInstance() })
			}
		}
		label = fmt.Sprintf("%s ×%d", label, f.Count)
		until = now
	case scenario.FaultRegionLeaderLoss:
		r := w.regionByName(f.Region)
		r.loseLeader(w.sessionExpiry(3))
		until = now
	case scenario.FaultGlobalLeaderLoss:
		if l := w.global.leader; l != nil {
			l.crash(time.Duration(f.RestartAfter))
			label += " " + l.name
		}
		until = now
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
	case scenario.FaultLoss:
		prev := w.net.lossOverride
		w.net.lossOverride = f.Loss
		label = fmt.Sprintf("loss %.0f%%", 100*f.Loss)
		w.eng.After(d, func() { w.net.lossOverride = prev })
	}
	w.orc.Fault(now, until, label)
}
