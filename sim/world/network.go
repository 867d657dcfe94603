package world

import (
	"math/rand/v2"
	"strings"
	"time"
)

// Network is the simulated links: one-way latency per region pair (with
// relative jitter), loss between regions, and partitions of a region from
// the global tier. Not safe for concurrent use.
type Network struct {
	w      *World
	rng    *rand.Rand
	local  time.Duration
	jitter float64
	loss   float64
	base   [][]time.Duration // [a][b] one-way, symmetric

	pairOverride   map[[2]int]time.Duration // latency faults between regions
	globalOverride map[int]time.Duration    // latency faults between a region and the global tier
	lossOverride   float64                  // loss fault; < 0 when none
	partitioned    []bool                   // region cut off from the global tier
	down           []bool                   // region dead (region-down fault): no link at all

	// Faults on the instance↔region link and of the region's reports
	// (faults.go), per region.
	replyLoss    []float64 // probability an answer to an instance is lost (the request applied)
	replay       []float64 // probability an instance's lease report is delivered again later
	reportReplay []bool    // every region report to the global tier is delivered twice
	lastInstall  []*installRec
}

func newNetwork(w *World) *Network {
	l := w.sc.Topology.Latency
	n := &Network{
		w: w, rng: w.eng.Stream("network"), local: time.Duration(l.Local), jitter: *l.Jitter, loss: l.Loss,
		pairOverride: map[[2]int]time.Duration{}, globalOverride: map[int]time.Duration{},
		lossOverride: -1, partitioned: make([]bool, len(w.regions)), down: make([]bool, len(w.regions)),
		replyLoss: make([]float64, len(w.regions)), replay: make([]float64, len(w.regions)),
		reportReplay: make([]bool, len(w.regions)), lastInstall: make([]*installRec, len(w.regions)),
	}
	idx := map[string]int{}
	for i, r := range w.regions {
		idx[r.name] = i
	}
	n.base = make([][]time.Duration, len(w.regions))
	for a := range n.base {
		n.base[a] = make([]time.Duration, len(w.regions))
		for b := range n.base[a] {
			if a == b {
				n.base[a][b] = n.local
			} else {
				n.base[a][b] = time.Duration(l.Default)
			}
		}
	}
	for pair, d := range l.Pairs {
		x, y, _ := strings.Cut(pair, "/")
		a, b := idx[x], idx[y]
		n.base[a][b], n.base[b][a] = time.Duration(d), time.Duration(d)
	}
	return n
}

func (n *Network) jittered(d time.Duration) time.Duration {
	if n.jitter == 0 || d == 0 {
		return d
	}
	return time.Duration(float64(d) * (1 + n.jitter*(2*n.rng.Float64()-1)))
}

// localDelay is one instance <-> regional service hop.
func (n *Network) localDelay() time.Duration { return n.jittered(n.local) }

// localReply is the hop of an answer from region r's service to an
// instance; lost under a reply-loss fault (the request was applied).
func (n *Network) localReply(r int) (time.Duration, bool) {
	if p := n.replyLoss[r]; p > 0 && n.rng.Float64() < p {
		return 0, true
	}
	return n.localDelay(), false
}

func pairKey(a, b int) [2]int {
	if a > b {
		a, b = b, a
	}
	return [2]int{a, b}
}

// globalDelay is one hop between region r and the global node running in
// region site; lost reports the message dropped.
func (n *Network) globalDelay(r, site int) (time.Duration, bool) {
	if n.partitioned[r] || n.down[r] || n.down[site] {
		return 0, true
	}
	loss := n.loss
	if n.lossOverride >= 0 {
		loss = n.lossOverride
	}
	d := n.base[r][site]
	if v, ok := n.pairOverride[pairKey(r, site)]; ok && r != site {
		d = v
	}
	if v, ok := n.globalOverride[r]; ok {
		d = v
	}
	if r != site && loss > 0 && n.rng.Float64() < loss {
		return 0, true
	}
	return n.jittered(d), false
}

// call is the state of one exchange: done once the caller heard back or
// gave up.
type call struct {
	done bool
}

// exchange is one request/response on the engine: out and back draw the
// two hops' delays (or loss). serve runs when the request arrives (its side
// effects happen even if the caller has given up); exactly one of onReply
// and onFail runs: onReply when the reply arrives before timeout, onFail at
// the timeout or when serve refuses (the reply then carries the error
// back). alive is checked before the caller's callbacks run, so a crashed
// caller hears nothing.
func (w *World) exchange(out, back func() (time.Duration, bool), timeout time.Duration,
	alive func() bool, serve func() (ok bool), onReply func(), onFail func()) {
	c := &call{}
	w.eng.After(timeout, func() {
		if c.done {
			return
		}
		c.done = true
		if alive() {
			onFail()
		}
	})
	d1, lost := out()
	if lost {
		return
	}
	w.eng.After(d1, func() {
		ok := serve()
		d2, lost := back()
		if lost {
			return
		}
		w.eng.After(d2, func() {
			if c.done {
				return
			}
			c.done = true
			if !alive() {
				return
			}
			if ok {
				onReply()
			} else {
				onFail()
			}
		})
	})
}
