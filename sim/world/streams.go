package world

import (
	"math"
	"sort"
	"time"

	"github.com/sluicehq/sluice/sim/traffic"
)

// streamState drives one traffic stream: batches of arrivals routed to the
// region's live instances by the load balancer.
type streamState struct {
	st  *traffic.Stream
	key *keyInfo
	id  int

	// Routing cache: the instances chosen for the last (instance set,
	// spread).
	vers, spread int
	chosen       []*Instance
	counts       []int64
}

func (w *World) startStream(s *streamState) {
	s.id = len(w.streams)
	var step func(from time.Duration)
	step = func(from time.Duration) {
		end, n := s.st.Next(from)
		w.eng.At(endAt(end), func() {
			w.deliver(s, n)
			if end < time.Duration(w.sc.Duration) {
				step(end)
			}
		})
	}
	step(0)
}

func endAt(d time.Duration) (t engineTime) { return engineTime(d) }

// deliver hands n requests that arrived in the batch just ended to the
// region's instances.
func (w *World) deliver(s *streamState, n int64) {
	if n <= 0 {
		return
	}
	r := w.regions[s.st.Region]
	cost := s.st.Cost
	w.orc.Offered(w.dur(), r.idx, s.key.id, n, cost)
	if len(r.insts) == 0 {
		w.counters.UnservedTokens += n * cost
		w.orc.Unserved(w.dur(), r.idx, s.key.id, n*cost)
		return
	}
	chosen := s.route(w, r)
	if len(chosen) == 1 {
		chosen[0].handle(s.key, n, cost)
		return
	}
	k := int64(len(chosen))
	counts := s.counts[:0]
	for range chosen {
		counts = append(counts, 0)
	}
	if n <= 64 {
		for i := int64(0); i < n; i++ {
			counts[w.rngRoute.IntN(int(k))]++
		}
	} else {
		for i := range counts {
			counts[i] = n / k
		}
		for i := int64(0); i < n%k; i++ {
			counts[w.rngRoute.IntN(int(k))]++
		}
	}
	s.counts = counts
	for i, in := range chosen {
		if counts[i] > 0 && in.alive && !in.draining && !in.stopping {
			in.handle(s.key, counts[i], cost)
		}
	}
}

// route picks the instances serving the stream now: with a per-instance
// rate, as many as the current rate needs (rendezvous hashing keeps the
// choice stable as instances come and go); otherwise all of them.
func (s *streamState) route(w *World, r *Region) []*Instance {
	spread := len(r.insts)
	if pi := s.st.PerInstance; pi > 0 {
		need := int(math.Ceil(s.st.Rate(w.dur()) / pi))
		spread = min(max(need, 1), len(r.insts))
	}
	if s.vers == r.instVers && s.spread == spread && s.chosen != nil {
		return s.chosen
	}
	s.vers, s.spread = r.instVers, spread
	cand := append([]*Instance(nil), r.insts...)
	score := func(in *Instance) uint64 { return mix(uint64(s.id)<<24 ^ uint64(in.num)) }
	sort.Slice(cand, func(i, j int) bool { return score(cand[i]) > score(cand[j]) })
	s.chosen = cand[:spread]
	return s.chosen
}

// mix is splitmix64's finalizer: a fixed, well-spread hash.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
