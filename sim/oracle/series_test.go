package oracle

import (
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestSeriesTotalsPerStep: with 2 s steps every series holds tokens per
// second per step (sums halved), fleet and region totals count every key,
// the focus key (named twice) only its own tokens, and rates and caps are
// sampled at each step's end, before what happens at that instant.
func TestSeriesTotalsPerStep(t *testing.T) {
	o := twoRegions(t, func(s *Setup) {
		s.Keys = append(s.Keys, Key{Key: quota.Key{Tenant: "v", Class: "c"}, Rate: 10, Burst: 20,
			StaticRate: []float64{5, 5}, StaticBurst: []float64{10, 10}})
		s.Focus = []int{0, 0}
		s.Duration = 10*sec + 1 // six steps, the last one partial
		s.Step = 2 * sec
	})
	o.Offered(sec/2, 1, 0, 10, 2)
	o.Decided(sec/2, 1, 0, 12, SourceLease)
	o.Decided(sec/2, 1, 0, 8, SourceDenied)
	o.Offered(sec, 0, 1, 5, 1)
	o.GrantApplied(1500*time.Millisecond, 1, 0, 70, 140, 5*sec)
	o.Decided(1500*time.Millisecond, 0, 1, 4, SourceLease)
	o.Decided(1500*time.Millisecond, 0, 1, 1, SourceDenied)
	o.Offered(3*sec, 0, 0, 30, 1)
	o.Decided(3*sec, 0, 0, 30, SourceStrict)
	o.GrantApplied(4*sec, 0, 0, 30, 60, 9*sec) // at the second step's end
	// Finishing a step past the last one samples nothing more.
	s := o.Finish(14 * sec).Series

	eq := func(name string, got, want []float64) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if s.Step != 2*sec || len(s.RegionOffered) != 2 || len(s.RegionAdmitted) != 2 || len(s.Focus) != 1 {
		t.Fatalf("series shape: step %v, %d/%d regions, %d focus", s.Step, len(s.RegionOffered), len(s.RegionAdmitted), len(s.Focus))
	}
	eq("times", s.Times, []float64{2, 4, 6, 8, 10, 12})
	eq("offered", s.Offered, []float64{12.5, 15, 0, 0, 0, 0})
	eq("ideal", s.Ideal, []float64{12.5, 15, 0, 0, 0, 0})
	eq("admitted", s.Admitted, []float64{8, 15, 0, 0, 0, 0})
	eq("offered in a", s.RegionOffered[0], []float64{2.5, 15, 0, 0, 0, 0})
	eq("offered in b", s.RegionOffered[1], []float64{10, 0, 0, 0, 0, 0})
	eq("admitted in a", s.RegionAdmitted[0], []float64{2, 15, 0, 0, 0, 0})
	eq("admitted in b", s.RegionAdmitted[1], []float64{6, 0, 0, 0, 0, 0})

	f := s.Focus[0]
	if f.Key != "t/c" || f.Rate != 100 || f.Burst != 200 || len(f.Regions) != 2 {
		t.Fatalf("focus %s rate %v burst %v, %d regions", f.Key, f.Rate, f.Burst, len(f.Regions))
	}
	eq("focus offered", f.Offered, []float64{10, 15, 0, 0, 0, 0})
	eq("focus ideal", f.Ideal, []float64{10, 15, 0, 0, 0, 0})
	eq("focus admitted", f.Admitted, []float64{6, 15, 0, 0, 0, 0})
	a, b := f.Regions[0], f.Regions[1]
	eq("focus offered in a", a.Offered, []float64{0, 15, 0, 0, 0, 0})
	eq("focus admitted in a", a.Admitted, []float64{0, 15, 0, 0, 0, 0})
	eq("focus denied in a", a.Denied, []float64{0, 0, 0, 0, 0, 0})
	eq("focus offered in b", b.Offered, []float64{10, 0, 0, 0, 0, 0})
	eq("focus admitted in b", b.Admitted, []float64{6, 0, 0, 0, 0, 0})
	eq("focus denied in b", b.Denied, []float64{4, 0, 0, 0, 0, 0})
	// Rates and caps are per second already: not scaled.
	eq("rate in a", a.Rate, []float64{50, 50, 30, 30, 50, 50})
	eq("cap in a", a.Cap, []float64{100, 100, 60, 60, 100, 100})
	eq("rate in b", b.Rate, []float64{70, 70, 50, 50, 50, 50})
	eq("cap in b", b.Cap, []float64{140, 140, 100, 100, 100, 100})
}

// TestSeriesLastStepTakesTheEnd: a decision at the run's very end falls in
// the last step, not past it.
func TestSeriesLastStepTakesTheEnd(t *testing.T) {
	o := twoRegions(t, func(s *Setup) { s.Duration = 10 * sec; s.Step = 2 * sec })
	o.Decided(10*sec, 0, 0, 4, SourceLease)
	o.Decided(9*sec, 0, 0, 2, SourceLease)
	s := o.Finish(10 * sec).Series
	if !slices.Equal(s.Admitted, []float64{0, 0, 0, 0, 3}) || !slices.Equal(s.Times, []float64{2, 4, 6, 8, 10}) {
		t.Fatalf("admitted %v at %v", s.Admitted, s.Times)
	}
}
