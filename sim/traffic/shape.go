package traffic

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/sim/scenario"
)

// shape is one compiled scenario.Shape.
type shape struct {
	kind   string
	only   []bool // regions it applies to; nil = all
	at     time.Duration
	mult   float64
	rise   time.Duration
	hold   time.Duration
	decay  time.Duration
	period time.Duration
	low    float64
	peaks  []time.Duration // per region
	steps  int
}

func newShape(s *scenario.Shape, regionIdx map[string]int, nr int) shape {
	sh := shape{
		kind: s.Kind, at: time.Duration(s.At), mult: s.Factor,
		rise: time.Duration(s.Rise), hold: time.Duration(s.Hold), decay: time.Duration(s.Decay),
		period: time.Duration(s.Period), steps: s.Steps,
	}
	if len(s.Regions) > 0 {
		sh.only = make([]bool, nr)
		for _, r := range s.Regions {
			sh.only[regionIdx[r]] = true
		}
	}
	if s.Kind == scenario.ShapeDiurnal {
		sh.low = *s.Low
		sh.peaks = make([]time.Duration, nr)
		for i := range sh.peaks {
			sh.peaks[i] = time.Duration(float64(sh.period) * float64(i) / float64(nr))
		}
		for name, d := range s.Peaks {
			sh.peaks[regionIdx[name]] = time.Duration(d)
		}
	}
	return sh
}

func (sh *shape) applies(region int) bool { return sh.only == nil || sh.only[region] }

func (sh *shape) stepLen() time.Duration { return sh.period / time.Duration(sh.steps) }

func (sh *shape) factor(region int, t time.Duration) float64 {
	switch sh.kind {
	case scenario.ShapeStep:
		if t >= sh.at {
			return sh.mult
		}
		return 1
	case scenario.ShapeFlash:
		d := t - sh.at
		switch {
		case d < 0:
			return 1
		case d < sh.rise:
			return 1 + (sh.mult-1)*float64(d)/float64(sh.rise)
		case d < sh.rise+sh.hold:
			return sh.mult
		case d < sh.rise+sh.hold+sh.decay:
			left := sh.rise + sh.hold + sh.decay - d
			return 1 + (sh.mult-1)*float64(left)/float64(sh.decay)
		}
		return 1
	case scenario.ShapeDiurnal:
		if sh.steps > 0 {
			l := sh.stepLen()
			t = t/l*l + l/2
		}
		phase := 2 * math.Pi * float64(t-sh.peaks[region]) / float64(sh.period)
		return sh.low + (1-sh.low)*(1+math.Cos(phase))/2
	}
	return 1
}

// breakpoints are the instants the factor has a kink or a jump.
func (sh *shape) breakpoints(region int, horizon time.Duration) []time.Duration {
	switch sh.kind {
	case scenario.ShapeStep:
		return []time.Duration{sh.at}
	case scenario.ShapeFlash:
		return []time.Duration{sh.at, sh.at + sh.rise, sh.at + sh.rise + sh.hold, sh.at + sh.rise + sh.hold + sh.decay}
	case scenario.ShapeDiurnal:
		if sh.steps == 0 {
			return nil
		}
		var out []time.Duration
		for t := sh.stepLen(); t < horizon; t += sh.stepLen() {
			out = append(out, t)
		}
		return out
	}
	return nil
}

// shifts are the instants after which the demand is at a new level worth
// measuring convergence from: a step, the end of a flash crowd's rise and
// of its decay, every diurnal step.
func (sh *shape) shifts(region int, horizon time.Duration) []time.Duration {
	var out []time.Duration
	keep := func(t time.Duration) {
		if t > 0 && t < horizon {
			out = append(out, t)
		}
	}
	switch sh.kind {
	case scenario.ShapeStep:
		keep(sh.at)
	case scenario.ShapeFlash:
		keep(sh.at + sh.rise)
		keep(sh.at + sh.rise + sh.hold + sh.decay)
	case scenario.ShapeDiurnal:
		for _, t := range sh.breakpoints(region, horizon) {
			keep(t)
		}
	}
	return out
}
