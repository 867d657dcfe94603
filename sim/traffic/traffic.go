package traffic

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/sim/engine"
	"github.com/sluicehq/sluice/sim/scenario"
)

// Batch bounds: a stream's batch covers between MinBatch and MaxBatch of
// time (less before a breakpoint).
const (
	MinBatch = 20 * time.Millisecond
	MaxBatch = time.Second
)

// Stream is the traffic of one key in one region. Not safe for concurrent
// use.
type Stream struct {
	Key    quota.Key
	Region int // index in topology order
	// Base is the request rate before shapes (requests/s).
	Base float64
	// Cost is the tokens of every request.
	Cost int64
	// PerInstance is the rate one instance takes before the load balancer
	// spreads the stream over another (0: all instances share it).
	PerInstance float64

	// Home is the region whose shapes the stream follows: its own, or, for
	// users who failed over, the region they came from.
	Home int

	poisson bool
	shapes  []shape
	gates   []gate
	breaks  []time.Duration // sorted breakpoints of the rate
	rng     *rand.Rand
	carry   float64 // constant process: fractional requests carried over
}

// Plan is a whole workload. Its streams carry sampling state; a Plan is
// used by one goroutine.
type Plan struct {
	// Streams in a deterministic order (workload order, then tenant, then
	// region).
	Streams []*Stream
	// Keys lists every driven key once, in first-appearance order.
	Keys []quota.Key
	// Shifts are the instants a key's expected demand jumps, sorted by
	// time then key order.
	Shifts []Shift
}

// Shift is a demand shift of one key.
type Shift struct {
	At  time.Duration
	Key quota.Key
}

// Build makes the plan of s with the given seed.
func Build(s *scenario.Scenario, seed uint64) (*Plan, error) {
	regionIdx := map[string]int{}
	var weights []float64
	for i, r := range s.Topology.Regions {
		regionIdx[r.Name] = i
		weights = append(weights, s.Config.Regions[r.Name].Weight)
	}
	nr := len(regionIdx)
	p := &Plan{}
	keyPos := map[quota.Key]int{}
	shiftSet := map[quota.Key]map[time.Duration]bool{}
	addKey := func(k quota.Key) {
		if _, ok := keyPos[k]; !ok {
			keyPos[k] = len(p.Keys)
			p.Keys = append(p.Keys, k)
		}
	}
	for wi := range s.Workload {
		w := &s.Workload[wi]
		shapes := make([]shape, len(w.Shape))
		for j := range w.Shape {
			shapes[j] = newShape(&w.Shape[j], regionIdx, nr)
		}
		type tenantRates struct {
			id    string
			rates []float64
		}
		var tenants []tenantRates
		if w.Tenant != "" {
			rates := make([]float64, nr)
			for name, r := range w.Rate {
				rates[regionIdx[name]] = float64(r)
			}
			tenants = append(tenants, tenantRates{w.Tenant, rates})
		} else {
			g := w.Group
			rng := engine.NewStream(seed, fmt.Sprintf("sizes/%d", wi))
			for i := 0; i < g.Count; i++ {
				size := drawSize(rng, &g.Size)
				tenants = append(tenants, tenantRates{scenario.GroupTenant(g, i), split(rng, size, g.HomeShare, g.Regions, weights)})
			}
		}
		for _, t := range tenants {
			k := quota.Key{Tenant: t.id, Class: w.Class}
			addKey(k)
			for r := 0; r < nr; r++ {
				if !(t.rates[r] > 0) {
					continue
				}
				st := &Stream{
					Key: k, Region: r, Home: r, Base: t.rates[r], Cost: w.Cost, PerInstance: float64(w.PerInstance),
					poisson: w.Process == "poisson",
					rng:     engine.NewStream(seed, fmt.Sprintf("arrivals/%s/%d", k, r)),
				}
				for _, sh := range shapes {
					if sh.applies(r) {
						st.shapes = append(st.shapes, sh)
						st.breaks = append(st.breaks, sh.breakpoints(r, time.Duration(s.Duration))...)
						for _, at := range sh.shifts(r, time.Duration(s.Duration)) {
							if shiftSet[k] == nil {
								shiftSet[k] = map[time.Duration]bool{}
							}
							shiftSet[k][at] = true
						}
					}
				}
				sort.Slice(st.breaks, func(i, j int) bool { return st.breaks[i] < st.breaks[j] })
				p.Streams = append(p.Streams, st)
			}
		}
	}
	p.failover(s, seed, regionIdx, weights, func(k quota.Key, at time.Duration) {
		if shiftSet[k] == nil {
			shiftSet[k] = map[time.Duration]bool{}
		}
		shiftSet[k][at] = true
	})
	for _, k := range p.Keys {
		for at := range shiftSet[k] {
			p.Shifts = append(p.Shifts, Shift{At: at, Key: k})
		}
	}
	sort.Slice(p.Shifts, func(i, j int) bool {
		a, b := p.Shifts[i], p.Shifts[j]
		if a.At != b.At {
			return a.At < b.At
		}
		return keyPos[a.Key] < keyPos[b.Key]
	})
	return p, nil
}

// drawSize draws one tenant size (requests/s).
func drawSize(rng *rand.Rand, sz *scenario.Size) float64 {
	lo, hi := float64(sz.Min), float64(sz.Max)
	var x float64
	switch sz.Dist {
	case "pareto":
		// Inverse CDF of the Pareto distribution truncated at hi.
		u := rng.Float64()
		tail := 0.0
		if hi > 0 {
			tail = math.Pow(lo/hi, sz.Alpha)
		}
		x = lo * math.Pow(1-u*(1-tail), -1/sz.Alpha)
	case "lognormal":
		x = lo * math.Exp(sz.Sigma*rng.NormFloat64())
	default:
		x = lo
	}
	if hi > 0 && x > hi {
		x = hi
	}
	return x
}

// split divides a tenant's size over regions. The tenant reaches n
// regions (0: all): its home, drawn by weight, and others drawn by weight
// without replacement. Home takes homeShare and the others the rest by
// weight; homeShare 0 splits everything by weight.
func split(rng *rand.Rand, size, homeShare float64, n int, weights []float64) []float64 {
	nr := len(weights)
	if n <= 0 || n > nr {
		n = nr
	}
	// Draw the tenant's regions in order, home first.
	avail := append([]float64(nil), weights...)
	var picked []int
	for len(picked) < n {
		var sum float64
		for _, w := range avail {
			sum += w
		}
		u := rng.Float64() * sum
		choice := -1
		for i, w := range avail {
			if w == 0 {
				continue
			}
			choice = i
			if u < w {
				break
			}
			u -= w
		}
		picked = append(picked, choice)
		avail[choice] = 0
	}
	out := make([]float64, nr)
	if len(picked) == 1 {
		out[picked[0]] = size
		return out
	}
	var all, rest float64
	for j, i := range picked {
		all += weights[i]
		if j > 0 {
			rest += weights[i]
		}
	}
	for j, i := range picked {
		switch {
		case homeShare == 0:
			out[i] = size * weights[i] / all
		case j == 0:
			out[i] = size * homeShare
		default:
			out[i] = size * (1 - homeShare) * weights[i] / rest
		}
	}
	return out
}

// gate is a factor in on the interval [from, until) and out outside it:
// how failovers switch streams off and their moved twins on.
type gate struct {
	from, until time.Duration
	in, out     float64
}

func (g gate) factor(t time.Duration) float64 {
	if t >= g.from && t < g.until {
		return g.in
	}
	return g.out
}

// failover applies the scenario's failovers in time order: every stream
// offered in the region users leave (including streams moved there by an
// earlier failover) is switched off for the failover's span, and a twin in
// each target region, following the same shapes and carrying its share by
// region weight, switched on for it. shift is told of every key whose
// demand jumps, and when.
func (p *Plan) failover(s *scenario.Scenario, seed uint64, regionIdx map[string]int, weights []float64,
	shift func(quota.Key, time.Duration)) {
	order := make([]int, len(s.Failovers))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return s.Failovers[order[a]].At < s.Failovers[order[b]].At })
	end := time.Duration(s.Duration)
	for _, fi := range order {
		f := s.Failovers[fi]
		from, at := regionIdx[f.From], time.Duration(f.At)
		until := end
		if f.For > 0 && at+time.Duration(f.For) < end {
			until = at + time.Duration(f.For)
		}
		var total float64
		for _, to := range f.To {
			total += weights[regionIdx[to]]
		}
		var moved []*Stream
		for _, st := range p.Streams {
			if st.Region != from {
				continue
			}
			st.gates = append(st.gates, gate{from: at, until: until, in: 0, out: 1})
			st.addBreaks(at, until, end)
			shift(st.Key, at)
			if until < end {
				shift(st.Key, until)
			}
			for _, to := range f.To {
				r := regionIdx[to]
				tw := &Stream{
					Key: st.Key, Region: r, Home: st.Home, Base: st.Base, Cost: st.Cost, PerInstance: st.PerInstance,
					poisson: st.poisson, shapes: st.shapes, breaks: append([]time.Duration(nil), st.breaks...),
					gates: append(append([]gate(nil), st.gates[:len(st.gates)-1]...),
						gate{from: at, until: until, in: weights[r] / total, out: 0}),
					rng: engine.NewStream(seed, fmt.Sprintf("arrivals/%s/%d/failover%d/%d", st.Key, r, fi, st.Home)),
				}
				moved = append(moved, tw)
			}
		}
		p.Streams = append(p.Streams, moved...)
	}
}

// addBreaks adds the rate's breakpoints at and until (before end).
func (st *Stream) addBreaks(at, until, end time.Duration) {
	st.breaks = append(st.breaks, at)
	if until < end {
		st.breaks = append(st.breaks, until)
	}
	sort.Slice(st.breaks, func(i, j int) bool { return st.breaks[i] < st.breaks[j] })
}

// Rate is the expected request rate at t (requests/s).
func (st *Stream) Rate(t time.Duration) float64 {
	r := st.Base
	for _, sh := range st.shapes {
		r *= sh.factor(st.Home, t)
	}
	for _, g := range st.gates {
		r *= g.factor(t)
	}
	return r
}

// Next samples the batch starting at t: it returns the end of the batch
// (when its requests are decided) and the number of requests that
// arrived in it.
func (st *Stream) Next(t time.Duration) (end time.Duration, n int64) {
	lam := st.Rate(t)
	dt := MaxBatch
	if lam > 0 {
		dt = min(MaxBatch, max(MinBatch, time.Duration(float64(time.Second)/lam)))
	}
	end = t + dt
	i := sort.Search(len(st.breaks), func(i int) bool { return st.breaks[i] > t })
	if i < len(st.breaks) && st.breaks[i] < end {
		end = st.breaks[i]
	}
	mean := st.Rate(t+(end-t)/2) * (end - t).Seconds()
	if st.poisson {
		return end, poisson(st.rng, mean)
	}
	st.carry += mean
	n = int64(st.carry)
	st.carry -= float64(n)
	return end, n
}

// poisson draws a Poisson variate with the given mean: inversion for small
// means, Hörmann's transformed rejection (PTRS) above.
func poisson(rng *rand.Rand, mean float64) int64 {
	switch {
	case !(mean > 0):
		return 0
	case mean < 10:
		l := math.Exp(-mean)
		k := int64(0)
		p := rng.Float64()
		for acc := l; p > acc; {
			k++
			l *= mean / float64(k)
			acc += l
			if k > 1000 {
				break
			}
		}
		return k
	}
	slam := math.Sqrt(mean)
	loglam := math.Log(mean)
	b := 0.931 + 2.53*slam
	a := -0.059 + 0.02483*b
	invalpha := 1.1239 + 1.1328/(b-3.4)
	vr := 0.9277 - 3.6224/(b-2)
	for {
		u := rng.Float64() - 0.5
		v := rng.Float64()
		us := 0.5 - math.Abs(u)
		k := math.Floor((2*a/us+b)*u + mean + 0.43)
		if us >= 0.07 && v <= vr {
			return int64(k)
		}
		if k < 0 || (us < 0.013 && v > us) {
			continue
		}
		lg, _ := math.Lgamma(k + 1)
		if math.Log(v)+math.Log(invalpha)-math.Log(a/(us*us)+b) <= -mean+k*loglam-lg {
			return int64(k)
		}
	}
}
