package oracle

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestSumChecksAtExactlyTheirBound: a sum exactly at r·(1 + 1e-9) plus
// 1e-6 per region (b likewise) passes.
func TestSumChecksAtExactlyTheirBound(t *testing.T) {
	o := twoRegions(t, nil)
	rate := 100*(1+relTol) + perRegionTol*2
	burst := 200*(1+relTol) + perRegionTol*2
	o.GrantApplied(sec, 0, 0, rate-50, burst-100, 5*sec)
	if a, b := o.rateAt(0, 0, sec); a+50 != rate || b+100 != burst {
		t.Fatalf("the sums are not exactly at the bound: %v %v", a+50, b+100)
	}
	if r := o.Finish(2 * sec); r.Rates.Violations != 0 || r.Bursts.Violations != 0 {
		t.Fatalf("sums exactly at the bound flagged: %+v %+v", r.Rates, r.Bursts)
	}
}

// TestStaticLeaseEndsAtItsInstant: at the instant a region's static
// lease ends it counts its floor, so a grant for the rest applied then
// passes; a nanosecond earlier it does not.
func TestStaticLeaseEndsAtItsInstant(t *testing.T) {
	for _, c := range []struct {
		at   time.Duration
		want int
	}{{30 * sec, 0}, {30*sec - 1, 1}} {
		o := twoRegions(t, func(s *Setup) {
			s.Keys[0].FloorRate, s.Keys[0].FloorBurst = []float64{10, 10}, []float64{20, 20}
		})
		o.StaticLease(sec, 1, 30*sec)
		o.GrantApplied(c.at, 0, 0, 90, 180, 40*sec)
		if r := o.Finish(time.Minute); r.Rates.Violations != c.want || r.Bursts.Violations != c.want {
			t.Fatalf("grant at %v: %d/%d violations, want %d", c.at, r.Rates.Violations, r.Bursts.Violations, c.want)
		}
	}
}

// TestDueChecksRunInTimeOrder: checks fall due by time whatever order
// they were scheduled in (convergence samples scheduled at the start,
// expiries later), and those due at the same instant run in the order
// they were scheduled.
func TestDueChecksRunInTimeOrder(t *testing.T) {
	o := twoRegions(t, func(s *Setup) {
		s.Duration = time.Minute
		s.Shifts = []Shift{{At: 10 * sec, Key: 0, Demand: []float64{10, 90}}}
		s.Keys = append(s.Keys, Key{Key: quota.Key{Tenant: "v", Class: "c"}, Rate: 10, Burst: 20,
			StaticRate: []float64{5, 5}, StaticBurst: []float64{10, 10}})
	})
	// Both keys: a donor whose grant ends at 5 s beside a recipient's.
	o.GrantApplied(sec, 0, 1, 3, 6, 5*sec)
	o.GrantApplied(sec, 1, 1, 7, 14, 8*sec)
	o.GrantApplied(2*sec, 0, 0, 30, 60, 5*sec)
	o.GrantApplied(2*sec, 1, 0, 70, 140, 8*sec)
	o.Advance(6 * sec)
	if o.res.Rates.Violations != 2 || o.res.Rates.FirstAt != 5*sec || o.res.Rates.FirstKey != "v/c" {
		t.Fatalf("expiries at 5 s not checked by 6 s in order: %+v", o.res.Rates)
	}
}

// TestEarlierExpiryScheduledAfterALaterOne: a grant ending before the
// expiry already scheduled gets its own check at its end.
func TestEarlierExpiryScheduledAfterALaterOne(t *testing.T) {
	o := twoRegions(t, nil)
	o.GrantApplied(sec, 1, 0, 70, 140, 8*sec) // 50 + 70: over from the start
	o.GrantApplied(sec, 0, 0, 30, 60, 5*sec)
	o.Advance(6 * sec)
	if r := o.res.Rates; r.Violations != 2 || r.Checks != 3 {
		t.Fatalf("the donor's end at 5 s not checked: %+v", r)
	}
}

// TestClosedClassViolationReported: a degraded admission of a class that
// fails closed is reported as the first violation when it is one, named
// as such, and leaves an earlier first violation as it was.
func TestClosedClassViolationReported(t *testing.T) {
	o := oneKey(t, 1, 5, func(k *Key) { k.Closed = true })
	o.Decided(2*sec, 0, 0, 1, SourceDegraded)
	o.Decided(3*sec, 0, 0, 2, SourceDegraded)
	c := o.Finish(4 * sec).Conformance
	if c.Violations != 2 || c.ClosedAdmitted != 3 || c.FirstAt != 2*sec || c.FirstKey != "t/c (on_failure: closed admitted in degraded mode)" {
		t.Fatalf("closed admissions: %+v", c)
	}
	o = oneKey(t, 1, 5, func(k *Key) { k.Closed = true })
	o.Decided(sec, 0, 0, 6, SourceLease)
	o.Decided(2*sec, 0, 0, 1, SourceDegraded)
	if c := o.Finish(4 * sec).Conformance; c.Violations != 2 || c.FirstAt != sec || c.FirstKey != "t/c" {
		t.Fatalf("first violation replaced: %+v", c)
	}
}
