package oracle

import "time"

// Series are the time series of a run, in tokens per second averaged over
// each step (rates and caps sampled at the end of each step).
type Series struct {
	Step time.Duration
	// Times are the ends of the steps, in seconds.
	Times []float64
	// Fleet totals over every key.
	Offered, Admitted, Ideal []float64
	// RegionOffered and RegionAdmitted are fleet totals per region.
	RegionOffered, RegionAdmitted [][]float64
	Focus                         []FocusSeries
}

// FocusSeries are one charted key's series.
type FocusSeries struct {
	Key         string
	Rate, Burst float64
	// Global totals.
	Offered, Admitted, Ideal []float64
	// Per region (Setup.Regions order).
	Regions []RegionSeries
}

// RegionSeries is one key in one region.
type RegionSeries struct {
	Offered, Admitted, Denied []float64
	// Rate and Cap are what the region's bucket may refill at and hold.
	Rate, Cap []float64
}

type series struct {
	step  time.Duration
	n     int
	cur   int // index of the open step
	nr    int
	focus map[int]int // key -> index in out.Focus
	out   Series
}

func newSeries(s Setup, nr int) *series {
	n := int((s.Duration + s.Step - 1) / s.Step)
	z := func() []float64 { return make([]float64, n) }
	sr := &series{step: s.Step, n: n, nr: nr, focus: map[int]int{}}
	sr.out = Series{Step: s.Step, Offered: z(), Admitted: z(), Ideal: z()}
	for i := 0; i < n; i++ {
		sr.out.Times = append(sr.out.Times, (time.Duration(i+1) * s.Step).Seconds())
	}
	for r := 0; r < nr; r++ {
		sr.out.RegionOffered = append(sr.out.RegionOffered, z())
		sr.out.RegionAdmitted = append(sr.out.RegionAdmitted, z())
	}
	for _, k := range s.Focus {
		if _, dup := sr.focus[k]; dup {
			continue
		}
		fs := FocusSeries{Key: s.Keys[k].Key.String(), Rate: s.Keys[k].Rate, Burst: s.Keys[k].Burst,
			Offered: z(), Admitted: z(), Ideal: z()}
		for r := 0; r < nr; r++ {
			fs.Regions = append(fs.Regions, RegionSeries{Offered: z(), Admitted: z(), Denied: z(), Rate: z(), Cap: z()})
		}
		sr.focus[k] = len(sr.out.Focus)
		sr.out.Focus = append(sr.out.Focus, fs)
	}
	return sr
}

func (s *series) index(t time.Duration) int {
	i := int(t / s.step)
	if i >= s.n {
		i = s.n - 1
	}
	return i
}

func (s *series) offered(t time.Duration, key, region int, tokens, ideal float64) {
	i := s.index(t)
	s.out.Offered[i] += tokens
	s.out.Ideal[i] += ideal
	s.out.RegionOffered[region][i] += tokens
	if f, ok := s.focus[key]; ok {
		fs := &s.out.Focus[f]
		fs.Offered[i] += tokens
		fs.Ideal[i] += ideal
		fs.Regions[region].Offered[i] += tokens
	}
}

func (s *series) decided(t time.Duration, key, region int, admitted, denied float64) {
	i := s.index(t)
	s.out.Admitted[i] += admitted
	s.out.RegionAdmitted[region][i] += admitted
	if f, ok := s.focus[key]; ok {
		fs := &s.out.Focus[f]
		fs.Admitted[i] += admitted
		fs.Regions[region].Admitted[i] += admitted
		fs.Regions[region].Denied[i] += denied
	}
}

// closeUntil samples the focus keys' rates and caps at every step end up
// to t.
func (s *series) closeUntil(t time.Duration, o *Oracle) {
	for s.cur < s.n && t >= time.Duration(s.cur+1)*s.step {
		at := time.Duration(s.cur+1) * s.step
		for k, f := range s.focus {
			fs := &s.out.Focus[f]
			for r := 0; r < s.nr; r++ {
				fs.Regions[r].Rate[s.cur], fs.Regions[r].Cap[s.cur] = o.rateAt(k, r, at)
			}
		}
		s.cur++
	}
}

// result converts the sums to tokens per second.
func (s *series) result() Series {
	secs := s.step.Seconds()
	scale := func(v []float64) {
		for i := range v {
			v[i] /= secs
		}
	}
	out := s.out
	scale(out.Offered)
	scale(out.Admitted)
	scale(out.Ideal)
	for r := 0; r < s.nr; r++ {
		scale(out.RegionOffered[r])
		scale(out.RegionAdmitted[r])
	}
	for f := range out.Focus {
		fs := &out.Focus[f]
		scale(fs.Offered)
		scale(fs.Admitted)
		scale(fs.Ideal)
		for r := range fs.Regions {
			scale(fs.Regions[r].Offered)
			scale(fs.Regions[r].Admitted)
			scale(fs.Regions[r].Denied)
		}
	}
	return out
}
