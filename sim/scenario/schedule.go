package scenario

import (
	"sort"
	"time"

	"github.com/sluicehq/sluice/sim/engine"
)

// Schedule returns every fault of the run in start order: the fixed ones
// and, when Chaos is set, the random ones drawn from seed. The same
// scenario and seed always give the same schedule.
//
// A drawn fault that would overlap a fault of its kind on its target
// (drawn or fixed) is not played: two at once would be played as one that
// ends with the first (see overlapping), which is not what was drawn.
// Validate refuses such fixed faults; the draw skips them.
func (s *Scenario) Schedule(seed uint64) []Fault {
	out := append([]Fault(nil), s.Faults...)
	if c := s.Chaos; c != nil {
		out = append(out, s.chaosFaults(c, seed, s.Faults)...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}

func (s *Scenario) chaosFaults(c *Chaos, seed uint64, fixed []Fault) []Fault {
	dur := time.Duration(s.Duration)
	// Drawn faults start in time order, so a drawn fault overlaps an
	// earlier drawn one of its kind on its target exactly when it starts
	// before the latest end among them.
	busyUntil := map[string]time.Duration{}
	overlaps := func(f *Fault) bool {
		if !overlapping[f.Kind] {
			return false
		}
		from, to := f.span(dur)
		slot := f.Kind + "\x00" + f.target()
		if from < busyUntil[slot] {
			return true
		}
		for i := range fixed {
			g := &fixed[i]
			if g.Kind != f.Kind || g.target() != f.target() {
				continue
			}
			if gFrom, gTo := g.span(dur); gFrom < to && from < gTo {
				return true
			}
		}
		busyUntil[slot] = max(busyUntil[slot], to)
		return false
	}
	rng := engine.NewStream(seed, "chaos")
	regions := s.Topology.Regions
	pick := func() string { return regions[rng.IntN(len(regions))].Name }
	span := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	var out []Fault
	at := time.Duration(c.Start)
	for {
		at += time.Duration(rng.ExpFloat64() * float64(c.MeanGap))
		at = at.Truncate(time.Millisecond)
		if at > time.Duration(c.End) {
			return out
		}
		f := Fault{At: Instant(at), Kind: c.Kinds[rng.IntN(len(c.Kinds))]}
		lasting := Duration(span(time.Duration(c.MinFor), time.Duration(c.MaxFor)).Truncate(time.Millisecond))
		switch f.Kind {
		case FaultInstanceCrash, FaultInstanceStop:
			f.Region = pick()
			f.Count = 1
			f.RestartAfter = c.RestartAfter
		case FaultRegionLeaderLoss:
			f.Region = pick()
		case FaultGlobalLeaderLoss:
			f.RestartAfter = Duration(DefaultGlobalRestart)
		case FaultPartition, FaultRedisRestart:
			f.Region = pick()
			f.For = lasting
		case FaultEtcdDown:
			f.For = lasting
		case FaultLatency:
			f.Region = pick()
			f.Peer = GlobalPeer
			if len(regions) > 1 && rng.IntN(2) == 0 {
				for f.Peer = pick(); f.Peer == f.Region; f.Peer = pick() {
				}
			}
			f.Latency = Duration(span(100*time.Millisecond, 500*time.Millisecond).Truncate(time.Millisecond))
			f.For = lasting
		case FaultLoss:
			f.Loss = 0.05 + 0.45*rng.Float64()
			f.For = lasting
		case FaultReplyLoss, FaultReportReplay:
			f.Region = pick()
			f.Loss = 0.05 + 0.45*rng.Float64()
			f.For = lasting
		case FaultRegionReportReplay, FaultStaleLeader:
			f.Region = pick()
			f.For = lasting
		case FaultInstanceIsolate:
			f.Region = pick()
			f.Count = 1
			f.For = lasting
		case FaultRegionDown:
			// The region comes back after the fault's span, its Redis
			// as it was: a region that stayed dead would end the run's
			// question for it at the first draw.
			f.Region = pick()
			f.RestartAfter = lasting
		}
		if overlaps(&f) {
			continue
		}
		out = append(out, f)
	}
}
