package hierarchy

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// script drives an Allocator by hand: regions report at given
// milliseconds and apply what they receive like a real region does.
type script struct {
	t     *testing.T
	a     *Allocator
	start time.Time
	key   quota.Key
	limit KeyLimit
	seq   map[string]uint64
	held  map[string]scriptHeld
}

type scriptHeld struct {
	rate, burst float64
	expiry      time.Time
}

func newScript(t *testing.T, regions []Region, limit KeyLimit) *script {
	t.Helper()
	return newScriptWith(t, Options{Regions: regions}, limit)
}

// newScriptWith is newScript with opts (its Epoch and Validity set to the
// script's 1 s and 5 s).
func newScriptWith(t *testing.T, opts Options, limit KeyLimit) *script {
	t.Helper()
	start := time.Unix(1_700_000_000, 0)
	opts.Epoch, opts.Validity = time.Second, 5*time.Second
	a, err := NewAllocator(opts, start)
	if err != nil {
		t.Fatal(err)
	}
	key := quota.Key{Tenant: "acme", Class: "write"}
	if err := a.SetLimit(key, limit); err != nil {
		t.Fatal(err)
	}
	return &script{t: t, a: a, start: start, key: key, limit: limit, seq: map[string]uint64{}, held: map[string]scriptHeld{}}
}

func (s *script) at(ms int) time.Time { return s.start.Add(time.Duration(ms) * time.Millisecond) }

// demand is a report entry with the held fields filled from what the
// region holds at sentMs.
func (s *script) demand(region string, tokensPerSec float64, holding float64, sentMs int) KeyDemand {
	kd := KeyDemand{Key: s.key, Admitted: tokensPerSec, Window: time.Second, Holding: holding}
	if h, ok := s.held[region]; ok && h.expiry.After(s.at(sentMs)) {
		kd.HeldRate, kd.HeldBurst = h.rate, h.burst
		kd.HeldValid = h.expiry.Sub(s.at(sentMs)).Truncate(time.Millisecond)
	}
	return kd
}

// report sends a report at sentMs (received at once) and applies the
// answer. holding < 0 means "half the current cap".
func (s *script) report(region string, sentMs int, tokensPerSec, holding float64) *Grant {
	s.t.Helper()
	if holding < 0 {
		holding = 0
		if h, ok := s.held[region]; ok {
			holding = h.burst / 2
		}
	}
	return s.send(region, sentMs, s.demand(region, tokensPerSec, holding, sentMs), false)
}

// send reports kd from region at sentMs (received at once), under the
// region's next seq or, for a retry, its last, and applies the answer.
func (s *script) send(region string, sentMs int, kd KeyDemand, retry bool) *Grant {
	s.t.Helper()
	if !retry {
		s.seq[region]++
	}
	grants, err := grantsOf(s.a.Report(s.at(sentMs), Report{Region: region, Seq: s.seq[region], Keys: []KeyDemand{kd}}))
	if err != nil {
		s.t.Fatalf("report from %s at %dms: %v", region, sentMs, err)
	}
	if len(grants) == 0 {
		return nil
	}
	g := grants[0]
	s.held[region] = scriptHeld{rate: g.Rate, burst: g.Burst, expiry: s.at(sentMs).Add(g.Valid)}
	return &g
}

func (s *script) usable(region string, ms int, static float64) float64 {
	if h, ok := s.held[region]; ok && s.at(ms).Before(h.expiry) {
		return h.rate
	}
	return static
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestRateMovesOnlyAfterTheDonorAcknowledges(t *testing.T) {
	s := newScript(t, []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, KeyLimit{Rate: 100, Burst: 100})
	// Learning mode lasts until 5s; nobody holds anything.
	s.a.Allocate(s.at(6000))
	// a's report shows demand above its share: the key is contended from
	// this report on, not from the next Allocate. b never reported, so it
	// may be at its static share: a's target is its own static 50.
	g := s.report("a", 6100, 150, -1)
	if g == nil || !near(g.Rate, 50) || g.Valid != 5*time.Second {
		t.Fatalf("a's first grant = %+v, want its static 50 for 5s: b may still be at its static share", g)
	}
	if s.a.ReportAgain("a") != 0 {
		t.Fatal("a got its target (b is frozen at its share), yet a raise is pending")
	}
	// b's first report makes it a reporting region: targets a 90, b 10.
	g = s.report("b", 6200, 10, -1)
	if g == nil || !near(g.Rate, 10) || !near(g.Burst, 10) || g.Valid != 5*time.Second {
		t.Fatalf("b's first grant = %+v, want 10/10 for 5s", g)
	}

	s.a.Allocate(s.at(7000))
	g = s.report("a", 7100, 150, -1)
	if g.Rate > 50 {
		t.Fatalf("a got %v before b acknowledged its smaller grant", g.Rate)
	}
	if s.a.ReportAgain("a") != 333*time.Millisecond {
		t.Fatal("a got 50 of its 90 for want of b's acknowledgement, and was not told a raise is pending")
	}
	if s.a.ReportAgain("b") != 0 || s.a.ReportAgain("nowhere") != 0 {
		t.Fatal("raise pending: want it for a only")
	}
	// b's report acknowledges 10: its grant answered at 6.2s had 4s left
	// when b sent the report, so it runs below its share until at least
	// 10.2s.
	s.report("b", 7200, 10, -1)

	s.a.Allocate(s.at(8000))
	g = s.report("a", 8100, 150, -1)
	if !near(g.Rate, 90) || !near(g.Burst, 90) {
		t.Fatalf("after b's acknowledgement a got %+v, want 90/90", g)
	}
	if s.a.ReportAgain("a") != 0 {
		t.Fatal("a has its target, yet a raise is pending")
	}
	// The above-share grant must end when b may fall back to its share.
	if end := s.at(8100).Add(g.Valid); end.After(s.at(10200)) {
		t.Fatalf("a's grant runs until %v, after b may fall back at 10.2s", end.Sub(s.start))
	}
	if g.Valid != 2100*time.Millisecond {
		t.Fatalf("a's grant valid %v, want 2.1s", g.Valid)
	}
	// The allocator bounds a's expiry by its answer time + Valid (a sent
	// its report no later than that), and b's from its acknowledgement.
	v := s.a.View(s.at(8100))
	if got := v.Keys[0].Regions[0].GrantExpiry; !got.Equal(s.at(10200)) {
		t.Fatalf("a's grant expiry as the allocator sees it: %v, want 10.2s", got.Sub(s.start))
	}
	if got := v.Keys[0].Regions[1].ReservedRate; !near(got, 50) {
		t.Fatalf("b is reserved %v, want its static share: it falls back to it eventually", got)
	}

	// b goes silent. a keeps what fits until b's bound, then returns to its
	// static share: b is counted at its share again.
	s.a.Allocate(s.at(9000))
	g = s.report("a", 9100, 150, -1)
	if !near(g.Rate, 90) || g.Valid != 1100*time.Millisecond {
		t.Fatalf("a at 9.1s got %+v, want 90 for 1.1s", g)
	}
	s.a.Allocate(s.at(10000))
	g = s.report("a", 10100, 150, -1)
	if !near(g.Rate, 50) || g.Valid != 5*time.Second {
		t.Fatalf("a at 10.1s got %+v, want its static 50 for 5s", g)
	}
	v = s.a.View(s.at(10100))
	if !v.Regions[1].Silent || !near(v.Keys[0].Regions[1].TargetRate, 50) {
		t.Fatalf("silent b should be frozen at its share: %+v", v.Regions[1])
	}
	// Every instant along the way: a's usable + b's usable <= 100.
	for ms := 6000; ms <= 17000; ms++ {
		if sum := s.usable("a", ms, 50) + s.usable("b", ms, 50); sum > 100+1e-9 {
			t.Fatalf("at %dms the regions may use %v > 100", ms, sum)
		}
	}
}

func TestDemandShiftMovesGrantsBeforeTheNextAllocate(t *testing.T) {
	s := newScript(t, []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, KeyLimit{Rate: 100, Burst: 100})
	// Without smoothing every estimate is the last reading.
	a, err := NewAllocator(Options{Regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, Epoch: time.Second, Validity: 5 * time.Second, DemandAlpha: 1}, s.start)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetLimit(s.key, s.limit); err != nil {
		t.Fatal(err)
	}
	s.a = a
	s.a.Allocate(s.at(6000))
	s.report("a", 6100, 150, -1)
	s.report("b", 6200, 10, -1)
	s.a.Allocate(s.at(7000))
	s.report("a", 7100, 150, -1)
	s.report("b", 7200, 10, -1)
	s.a.Allocate(s.at(8000))
	s.report("a", 8100, 150, -1)
	s.report("b", 8200, 10, -1)
	s.a.Allocate(s.at(9000))
	if g := s.report("a", 9100, 150, -1); !near(g.Rate, 90) {
		t.Fatalf("settled a got %+v, want 90", g)
	}

	// Demand shifts: b wants 60, a only 40. No Allocate runs from here on.
	// b's report raises its target at once, but a still holds 90.
	if g := s.report("b", 9200, 60, -1); g.Rate > 10 {
		t.Fatalf("b got %v while a still holds 90", g.Rate)
	}
	// a's report lowers its target at once from its own new demand.
	if g := s.report("a", 9300, 40, -1); !near(g.Rate, 40) {
		t.Fatalf("a got %+v after its demand fell to 40, want 40 without waiting for Allocate", g)
	}
	// a acknowledges at once: a 100 ms window is no demand reading, so
	// its estimate (and target) stay at 40.
	s.seq["a"]++
	kd := s.demand("a", 0, 10, 9400)
	kd.Window = 100 * time.Millisecond
	grants, err := grantsOf(s.a.Report(s.at(9400), Report{Region: "a", Seq: s.seq["a"], Keys: []KeyDemand{kd}}))
	if err != nil || len(grants) != 1 || !near(grants[0].Rate, 40) {
		t.Fatalf("a's acknowledging report got %+v, %v; want 40", grants, err)
	}
	s.held["a"] = scriptHeld{rate: grants[0].Rate, burst: grants[0].Burst, expiry: s.at(9400).Add(grants[0].Valid)}
	if d := s.a.View(s.at(9400)).Keys[0].Regions[0].Demand; !near(d, 40) {
		t.Fatalf("a's demand after the short report %v, want 40", d)
	}
	// The capacity a acknowledged giving up is b's at its next report.
	if g := s.report("b", 9500, 60, -1); !near(g.Rate, 60) {
		t.Fatalf("b got %+v after a acknowledged 40, want 60", g)
	}
	for ms := 6000; ms <= 16000; ms++ {
		if sum := s.usable("a", ms, 50) + s.usable("b", ms, 50); sum > 100+1e-9 {
			t.Fatalf("at %dms the regions may use %v > 100", ms, sum)
		}
	}
}

func TestBurstMovesOnlyWhenTheDonorHoldsNoMore(t *testing.T) {
	s := newScript(t, []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, KeyLimit{Rate: 100, Burst: 200})
	s.a.Allocate(s.at(6000))
	s.report("a", 6100, 150, 0)
	s.report("b", 6200, 10, 0) // cap 20 (10% of the rate, 10% of the burst)
	s.a.Allocate(s.at(7000))
	s.report("a", 7100, 150, 0)
	// b acknowledges its 20-token cap but still holds 70 tokens from its
	// static-share days.
	s.report("b", 7200, 10, 70)
	s.a.Allocate(s.at(8000))
	g := s.report("a", 8100, 150, 0)
	if !near(g.Rate, 90) {
		t.Fatalf("rate should have moved: %+v", g)
	}
	if !near(g.Burst, 130) {
		t.Fatalf("a's cap = %v, want 200-70 = 130 while b holds 70", g.Burst)
	}
	s.report("b", 8200, 10, 15) // now within its cap
	s.a.Allocate(s.at(9000))
	g = s.report("a", 9100, 150, 0)
	if !near(g.Burst, 180) {
		t.Fatalf("a's cap = %v, want 180 once b holds no more than its cap", g.Burst)
	}
}

func TestLearningReissuesOnlyWhatIsHeld(t *testing.T) {
	regions := []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 2}}
	s := newScript(t, regions, KeyLimit{Rate: 100, Burst: 100})
	if !s.a.Learning(s.at(4999)) || s.a.Learning(s.at(5000)) {
		t.Fatal("learning mode must last exactly one validity")
	}
	s.a.Allocate(s.at(1000))
	// A previous leader gave a 60 (above its static 25) and b 5.
	s.held["a"] = scriptHeld{rate: 60, burst: 60, expiry: s.at(1100 + 3000)}
	s.held["b"] = scriptHeld{rate: 5, burst: 5, expiry: s.at(1200 + 4000)}
	ga := s.report("a", 1100, 200, 30)
	if ga == nil || ga.Rate > 60 || !near(ga.Rate, 60) || ga.Burst > 60 || ga.Valid != 3*time.Second {
		t.Fatalf("a got %+v, want its 60/60 again with its own expiry (3s)", ga)
	}
	gb := s.report("b", 1200, 200, 3)
	if gb == nil || gb.Rate > 5 || !near(gb.Rate, 5) || gb.Valid != 5*time.Second {
		t.Fatalf("b got %+v, want its 5 again, extended to 5s (below its share)", gb)
	}
	if gc := s.report("c", 1300, 200, 0); gc != nil {
		t.Fatalf("c holds nothing and must get nothing in learning mode, got %+v", gc)
	}
	s.a.Allocate(s.at(2000))
	if gc := s.report("c", 2300, 200, 0); gc != nil {
		t.Fatalf("c must still get nothing, got %+v", gc)
	}
	if v := s.a.View(s.at(2300)); !v.Learning {
		t.Fatal("view should say learning")
	}
}

// TestLearningReissuesNothingOnceTheFenceIsFull: while learning, a region
// whose answers are lost (it keeps reporting the grant a previous leader
// gave it) is re-issued that grant until its fence holds maxRecs records
// (the held grant and the re-issues it has not acknowledged), then
// nothing until the oldest expire.
func TestLearningReissuesNothingOnceTheFenceIsFull(t *testing.T) {
	s := newScript(t, twoRegions(), KeyLimit{Rate: 100, Burst: 100}) // static shares 50/50
	for i := range maxRecs + 1 {
		kd := KeyDemand{Key: s.key, Admitted: 100, Window: time.Second, HeldRate: 60, HeldBurst: 60, HeldValid: 3 * time.Second}
		ans, err := s.a.Report(s.at(1000+100*i), Report{Region: "a", Seq: uint64(i + 1), Keys: []KeyDemand{kd}})
		if err != nil {
			t.Fatal(err)
		}
		switch reissued := i < maxRecs-1; {
		case reissued && (len(ans.Grants) != 1 || ans.Grants[0].Rate > 60 || !near(ans.Grants[0].Rate, 60)):
			t.Fatalf("report %d of a holding 60 for 3s, earlier answers lost: %+v; want its 60 again", i+1, ans.Grants)
		case !reissued && len(ans.Grants) != 0:
			t.Fatalf("report %d of a holding 60 for 3s, %d answers lost: %+v; want nothing (fence full)", i+1, i, ans.Grants)
		}
	}
}

// TestLearningEndsForReportsAtValidity: a report received at exactly
// NewAllocator + Validity is answered outside learning: a region holding
// nothing whose demand is above its static share gets a fenced grant (the
// other region, never heard from, frozen at its static share).
func TestLearningEndsForReportsAtValidity(t *testing.T) {
	s := newScript(t, twoRegions(), KeyLimit{Rate: 100, Burst: 100})
	if g := s.report("a", 4999, 150, 0); g != nil {
		t.Fatalf("a holding nothing got %+v while learning, want nothing", g)
	}
	if g := s.report("a", 5000, 150, 0); g == nil || g.Rate != 50 || g.Valid != 5*time.Second {
		t.Fatalf("a got %+v when learning ended, want its static 50 for 5s", g)
	}
}

// TestLearningReissueValidity: while learning, a held grant at or below
// both static shares (equal to one of them included) is re-issued for the
// full Validity; one above either keeps its own expiry, truncated to whole
// milliseconds and never beyond Validity (a previous leader's may have
// been longer).
func TestLearningReissueValidity(t *testing.T) {
	for _, tc := range []struct {
		rate, burst float64
		held, want  time.Duration
	}{
		{50, 10, 2 * time.Second, 5 * time.Second}, // the static rate exactly
		{10, 50, 2 * time.Second, 5 * time.Second}, // the static burst exactly
		{50.5, 10, 2 * time.Second, 2 * time.Second},
		{10, 51, 2 * time.Second, 2 * time.Second},
		{60, 60, 2*time.Second + 700*time.Microsecond, 2 * time.Second},
		{60, 60, 7 * time.Second, 5 * time.Second},
	} {
		s := newScript(t, twoRegions(), KeyLimit{Rate: 100, Burst: 100}) // static shares 50/50
		kd := KeyDemand{Key: s.key, Admitted: 100, Window: time.Second, HeldRate: tc.rate, HeldBurst: tc.burst, HeldValid: tc.held}
		ans, err := s.a.Report(s.at(1000), Report{Region: "a", Seq: 1, Keys: []KeyDemand{kd}})
		if err != nil || len(ans.Grants) != 1 {
			t.Fatalf("a holding %v/%v for %v got %+v, %v; want it again", tc.rate, tc.burst, tc.held, ans.Grants, err)
		}
		if g := ans.Grants[0]; g.Valid != tc.want || g.Rate > tc.rate || !near(g.Rate, tc.rate) || g.Burst > tc.burst || !near(g.Burst, tc.burst) {
			t.Fatalf("a holding %v/%v for %v got %+v, want it again for %v", tc.rate, tc.burst, tc.held, g, tc.want)
		}
	}
}

// TestViewShowsAHeldGrantWithoutDemand: a key a region only reports
// holding a grant for (an acknowledgement, too short a window to read
// demand from) has fencing state but no demand; the View lists it with
// the grant until the instant it expires, and reserves what a reported
// holding until the instant that surely expired, then its static share.
func TestViewShowsAHeldGrantWithoutDemand(t *testing.T) {
	s := newScript(t, twoRegions(), KeyLimit{Rate: 100, Burst: 100})
	kd := KeyDemand{Key: s.key, Window: 100 * time.Millisecond, HeldRate: 60, HeldBurst: 70, HeldValid: 3 * time.Second, Holding: 10}
	ans, err := s.a.Report(s.at(1100), Report{Region: "a", Seq: 1, Keys: []KeyDemand{kd}})
	if err != nil || len(ans.Grants) != 1 || ans.Grants[0].Rate > 60 || !near(ans.Grants[0].Rate, 60) || ans.Grants[0].Valid != 3*time.Second {
		t.Fatalf("learning: a holding 60/70 for 3s got %+v, %v; want it again for 3s", ans.Grants, err)
	}
	g := ans.Grants[0]
	for _, tc := range []struct {
		ms                     int
		granted, grantedBurst  float64
		expiry                 time.Time
		reserved, reservedBurs float64
	}{
		{1100, g.Rate, g.Burst, s.at(4100), 60, 70},
		{4099, g.Rate, g.Burst, s.at(4100), 60, 70},
		{4100, 0, 0, time.Time{}, 60, 70}, // what a reports holding counts 1ms longer (held_valid is truncated)
		{4101, 0, 0, time.Time{}, 50, 50},
	} {
		v := s.a.View(s.at(tc.ms))
		if len(v.Keys) != 1 || !v.Keys[0].Active || v.Keys[0].Contended {
			t.Fatalf("at %dms the view lists %+v, want the key active, not contended", tc.ms, v.Keys)
		}
		r := v.Keys[0].Regions[0]
		if r.Demand != 0 || r.GrantedRate != tc.granted || r.GrantedBurst != tc.grantedBurst || !r.GrantExpiry.Equal(tc.expiry) ||
			r.ReservedRate != tc.reserved || r.ReservedBurst != tc.reservedBurs {
			t.Fatalf("at %dms a shows demand %v, grant %v/%v until %v, reserved %v/%v; want 0, %v/%v until %v, %v/%v",
				tc.ms, r.Demand, r.GrantedRate, r.GrantedBurst, r.GrantExpiry, r.ReservedRate, r.ReservedBurst,
				tc.granted, tc.grantedBurst, tc.expiry, tc.reserved, tc.reservedBurs)
		}
	}
}

// TestViewShowsTheNewestGrant: the View's grant is the newest one issued
// (the region may not have received it yet), also when it is the only
// one.
func TestViewShowsTheNewestGrant(t *testing.T) {
	s := newScript(t, twoRegions(), KeyLimit{Rate: 100, Burst: 100})
	s.a.Allocate(s.at(6000))
	var grants []Grant
	for i, ms := range []int{6100, 6200} {
		// The first answer is lost: the second report holds nothing.
		kd := KeyDemand{Key: s.key, Admitted: 150, Window: time.Second}
		ans, err := s.a.Report(s.at(ms), Report{Region: "a", Seq: uint64(i + 1), Keys: []KeyDemand{kd}})
		if err != nil || len(ans.Grants) != 1 {
			t.Fatalf("a's report at %dms: %+v, %v; want a grant", ms, ans.Grants, err)
		}
		g := ans.Grants[0]
		grants = append(grants, g)
		r := s.a.View(s.at(ms)).Keys[0].Regions[0]
		if r.GrantedRate != g.Rate || r.GrantedBurst != g.Burst || !r.GrantExpiry.Equal(s.at(ms).Add(g.Valid)) {
			t.Fatalf("at %dms the view shows %v/%v until %v, want the grant just issued %+v", ms, r.GrantedRate, r.GrantedBurst, r.GrantExpiry, g)
		}
	}
	if grants[0] == grants[1] {
		t.Fatalf("both grants are %+v: the view's choice between them is not seen", grants[0])
	}
}

func TestRetriesAreIdempotentAndStaleReportsRefused(t *testing.T) {
	s := newScript(t, []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, KeyLimit{Rate: 100, Burst: 100})
	s.a.Allocate(s.at(6000))
	s.report("a", 6100, 150, 0)
	s.report("b", 6200, 10, 0)
	s.a.Allocate(s.at(7000))
	rep := Report{Region: "a", Seq: 10, Keys: []KeyDemand{s.demand("a", 150, 0, 7100)}}
	first, err := grantsOf(s.a.Report(s.at(7100), rep))
	if err != nil || len(first) != 1 {
		t.Fatalf("report: %v %v", first, err)
	}
	before := s.a.View(s.at(7100))
	rep.Keys[0].Admitted = 999 // a retry carries the same seq; its content is not looked at again
	again, err := grantsOf(s.a.Report(s.at(7500), rep))
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 1 || again[0] != first[0] {
		t.Fatalf("retry got %+v, first answer was %+v", again, first)
	}
	again[0].Rate = -1 // the copy is the caller's
	third, _ := grantsOf(s.a.Report(s.at(7600), rep))
	if third[0] != first[0] {
		t.Fatal("modifying a retry's answer changed the stored answer")
	}
	after := s.a.View(s.at(7100))
	if !viewsEqual(before, after) {
		t.Fatalf("a retry changed the state:\n%+v\n%+v", before, after)
	}
	rep.Seq = 9
	if _, err := s.a.Report(s.at(7700), rep); !errorsIsStale(err) {
		t.Fatalf("lower seq: got %v, want ErrStaleReport", err)
	}
}

func viewsEqual(a, b View) bool {
	if a.Epoch != b.Epoch || a.Learning != b.Learning || len(a.Keys) != len(b.Keys) || len(a.Regions) != len(b.Regions) {
		return false
	}
	for i := range a.Regions {
		ra, rb := a.Regions[i], b.Regions[i]
		if ra.Region != rb.Region || ra.LastSeq != rb.LastSeq || ra.LastReport != rb.LastReport || ra.UnknownKeyCount != rb.UnknownKeyCount {
			return false
		}
	}
	for i := range a.Keys {
		ka, kb := a.Keys[i], b.Keys[i]
		if ka.Key != kb.Key || ka.Contended != kb.Contended || ka.Active != kb.Active {
			return false
		}
		for j := range ka.Regions {
			if ka.Regions[j] != kb.Regions[j] {
				return false
			}
		}
	}
	return true
}

func TestUncontendedKeysNeedNoGrants(t *testing.T) {
	s := newScript(t, []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, KeyLimit{Rate: 100, Burst: 100})
	ms := 6000
	epoch := func(da, db float64) (*Grant, *Grant) {
		s.a.Allocate(s.at(ms))
		ga := s.report("a", ms+100, da, -1)
		gb := s.report("b", ms+200, db, -1)
		ms += 1000
		return ga, gb
	}
	for i := 0; i < 3; i++ {
		if ga, gb := epoch(40, 30); ga != nil || gb != nil {
			t.Fatalf("demand within static shares got grants %+v %+v", ga, gb)
		}
	}
	epoch(150, 10) // the allocation at the start of this epoch has not seen it yet
	for i := 0; i < 6; i++ {
		if ga, gb := epoch(150, 10); ga == nil || gb == nil {
			t.Fatalf("contended key got no grants: %+v %+v", ga, gb)
		}
	}
	if s.usable("a", ms, 50) <= 50 {
		t.Fatalf("a should be above its share by now, uses %v", s.usable("a", ms, 50))
	}
	// Demand falls back inside the static shares: grants return to the
	// static shares, then stop.
	var ga, gb *Grant
	for i := 0; i < 12; i++ {
		ga, gb = epoch(20, 20)
	}
	if ga != nil || gb != nil {
		t.Fatalf("key back inside static shares still gets grants: %+v %+v", ga, gb)
	}
	for region := range s.held {
		if u := s.usable(region, ms, 50); !near(u, 50) {
			t.Fatalf("%s uses %v, want its static 50", region, u)
		}
	}
	v := s.a.View(s.at(ms))
	if len(v.Keys) != 1 || v.Keys[0].Active || v.Keys[0].Contended {
		t.Fatalf("view: %+v", v.Keys)
	}
}

// TestOneGrantPerKeyAfterASlotIsReused: a removed key's slot reused by a
// key that a report makes contended before the next Allocate is listed
// twice among the active keys; another region's answer still carries one
// grant for it.
func TestOneGrantPerKeyAfterASlotIsReused(t *testing.T) {
	s := newScript(t, []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}}, KeyLimit{Rate: 100, Burst: 100})
	s.a.Allocate(s.at(6000))
	s.report("a", 6100, 150, -1)
	s.report("b", 6200, 10, -1)
	s.a.Allocate(s.at(7000))
	s.a.RemoveKey(s.key)
	// Until the next Allocate the removed key is still listed active: it
	// gets no grant all the same.
	s.seq["b"]++
	if grants, err := grantsOf(s.a.Report(s.at(7050), Report{Region: "b", Seq: s.seq["b"]})); err != nil || len(grants) != 0 {
		t.Fatalf("b's answer right after the key's removal %+v, %v; want none", grants, err)
	}
	other := quota.Key{Tenant: "beta", Class: "write"}
	if err := s.a.SetLimit(other, KeyLimit{Rate: 100, Burst: 100}); err != nil {
		t.Fatal(err)
	}
	s.seq["a"]++
	if _, err := s.a.Report(s.at(7100), Report{Region: "a", Seq: s.seq["a"], Keys: []KeyDemand{{Key: other, Admitted: 150, Window: time.Second}}}); err != nil {
		t.Fatal(err)
	}
	s.seq["b"]++
	grants, err := grantsOf(s.a.Report(s.at(7200), Report{Region: "b", Seq: s.seq["b"]}))
	if err != nil {
		t.Fatal(err)
	}
	if len(grants) != 1 || grants[0].Key != other {
		t.Fatalf("b's answer %+v, want one grant, for %s", grants, other)
	}
}

// TestARiseMakesAKeyWindingDownContendedAgain: a demand shift whose fall
// reaches the allocation before its rise leaves the key uncontended at
// that Allocate (every estimate within the static shares), its grants
// winding down to the static shares. The rise's report makes it contended
// again from that report on, as it does a key with no grants: the donor,
// whose demand fell, is lowered toward its demand at its next report, not
// raised back to its static share, and the recipient rises as soon as
// the donors acknowledge, before the next Allocate.
func TestARiseMakesAKeyWindingDownContendedAgain(t *testing.T) {
	regions := []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}, {Name: "c", Weight: 1}}
	s := newScriptWith(t, Options{Regions: regions, DemandAlpha: 1}, KeyLimit{Rate: 300, Burst: 300})
	ms := 6000
	for i := 0; i < 6; i++ { // a over its static 100 for long enough to hold a grant above it
		s.a.Allocate(s.at(ms))
		s.report("a", ms+100, 250, -1)
		s.report("b", ms+200, 40, -1)
		s.report("c", ms+300, 10, -1)
		ms += 1000
	}
	if u := s.usable("a", ms, 100); u <= 200 {
		t.Fatalf("a uses %v before the shift; want well above its static 100", u)
	}
	// The shift: a's fall is read before c's rise.
	s.report("a", ms+100, 40, -1)
	s.a.Allocate(s.at(ms + 150))
	if v := s.a.View(s.at(ms + 150)); v.Keys[0].Contended {
		t.Fatalf("with every estimate within the static shares the key is still contended: %+v", v.Keys[0])
	}
	s.report("c", ms+200, 250, -1)
	if v := s.a.View(s.at(ms + 200)); !v.Keys[0].Contended {
		t.Fatalf("after c's report of 250 (static 100) the key is not contended: %+v", v.Keys[0])
	}
	ga := s.report("a", ms+300, 40, -1)
	if ga == nil || ga.Rate >= 100 {
		t.Fatalf("a, whose demand fell to 40, got %+v after c's rise; want a grant below its static 100", ga)
	}
	// a and b acknowledge what they got (the fence frees a's room only
	// then), and c reports again, all before the next Allocate.
	s.report("b", ms+400, 40, -1)
	s.report("a", ms+500, 40, -1)
	s.report("b", ms+600, 40, -1)
	gc := s.report("c", ms+700, 250, -1)
	if gc == nil || gc.Rate <= 150 {
		t.Fatalf("c, asking 250, got %+v once a and b acknowledged; want well above its static 100 before the next Allocate", gc)
	}
}
