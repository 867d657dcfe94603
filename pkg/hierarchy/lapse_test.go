package hierarchy

import (
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// leaseScript drives an Allocator with two regions a and b (weight 1
// each) and one key (rate 100, burst 100, floor share 0: static shares 50
// each, floors 0) by hand, the regions keeping their grants and static
// leases as the region contract says. Epoch 1s, validity 5s, region lease
// 10s: a region lapses after 10s + 5s + 1s (LapseMargin) of silence.
type leaseScript struct {
	t     *testing.T
	a     *Allocator
	start time.Time
	key   quota.Key
	seq   map[string]uint64
	held  map[string]scriptHeld
	until map[string]time.Time // end of each region's static lease
}

const (
	leaseRate   = 100.0
	leaseStatic = 50.0
)

func newLeaseScript(t *testing.T, lapsed ...string) *leaseScript {
	t.Helper()
	start := time.Unix(1_700_000_000, 0)
	a, err := NewAllocator(Options{
		Regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}},
		Epoch:   time.Second, Validity: 5 * time.Second, RegionLease: 10 * time.Second,
		Lapsed: lapsed,
	}, start)
	if err != nil {
		t.Fatal(err)
	}
	key := quota.Key{Tenant: "acme", Class: "write"}
	if err := a.SetLimit(key, KeyLimit{Rate: leaseRate, Burst: 100}); err != nil {
		t.Fatal(err)
	}
	s := &leaseScript{t: t, a: a, start: start, key: key, seq: map[string]uint64{}, held: map[string]scriptHeld{}, until: map[string]time.Time{}}
	// Both start with a static lease from an earlier leader's answer.
	s.until["a"], s.until["b"] = start.Add(10*time.Second), start.Add(10*time.Second)
	return s
}

func (s *leaseScript) at(ms int) time.Time { return s.start.Add(time.Duration(ms) * time.Millisecond) }

// report sends region's report at ms (received at once), applies the
// answer and returns it.
func (s *leaseScript) report(region string, ms int, demand float64) Answer {
	s.t.Helper()
	now := s.at(ms)
	kd := KeyDemand{Key: s.key, Admitted: demand, Window: time.Second}
	if h, ok := s.held[region]; ok && h.expiry.After(now) {
		kd.HeldRate, kd.HeldBurst = h.rate, h.burst
		kd.HeldValid = h.expiry.Sub(now).Truncate(time.Millisecond)
	}
	s.seq[region]++
	ans, err := s.a.Report(now, Report{Region: region, Seq: s.seq[region], Keys: []KeyDemand{kd}})
	if err != nil {
		s.t.Fatalf("report from %s at %dms: %v", region, ms, err)
	}
	for _, g := range ans.Grants {
		s.held[region] = scriptHeld{rate: g.Rate, burst: g.Burst, expiry: now.Add(g.Valid)}
	}
	if ans.StaticLease > 0 && now.Add(ans.StaticLease).After(s.until[region]) {
		s.until[region] = now.Add(ans.StaticLease)
	}
	s.check(ms)
	return ans
}

// usable is the rate region may refill at, at ms: its grant, else its
// static share while its static lease runs, else its floor (0).
func (s *leaseScript) usable(region string, ms int) float64 {
	now := s.at(ms)
	if h, ok := s.held[region]; ok && now.Before(h.expiry) {
		return h.rate
	}
	if now.Before(s.until[region]) {
		return leaseStatic
	}
	return 0
}

func (s *leaseScript) check(ms int) {
	s.t.Helper()
	if sum := s.usable("a", ms) + s.usable("b", ms); sum > leaseRate*(1+1e-12) {
		s.t.Fatalf("at %dms the regions may refill at %v in total (a %v, b %v), above %v", ms, sum, s.usable("a", ms), s.usable("b", ms), leaseRate)
	}
}

func (s *leaseScript) state(region string, ms int) RegionState {
	for _, r := range s.a.View(s.at(ms)).Regions {
		if r.Name == region {
			return r.State
		}
	}
	s.t.Fatalf("no region %s", region)
	return ""
}

// persist is the daemon: pending lapses are made durable.
func (s *leaseScript) persist(ms int) []string {
	s.t.Helper()
	var lapsed []string
	for _, name := range s.a.PendingLapses(s.at(ms)) {
		ok, err := s.a.LapseDurable(s.at(ms), name)
		if err != nil {
			s.t.Fatal(err)
		}
		if ok {
			lapsed = append(lapsed, name)
		}
	}
	return lapsed
}

// lapseA runs both regions until a, silent after its report at 500ms,
// has lapsed (durably) and b, which wants everything, holds the whole
// rate. It returns the time (ms) of b's last report.
func (s *leaseScript) lapseA() int {
	s.t.Helper()
	s.report("a", 500, 0)
	ms := 1000
	for ; ms <= 30_000; ms += 1000 {
		s.a.Allocate(s.at(ms))
		pending := s.a.PendingLapses(s.at(ms))
		if ms <= 16_500 && len(pending) > 0 {
			s.t.Fatalf("at %dms %v pending, before region_lease + validity + margin of silence", ms, pending)
		}
		if len(pending) > 0 && s.usable("b", ms) > leaseStatic*(1+1e-9) {
			s.t.Fatalf("at %dms b may use %v before a's lapse is durable", ms, s.usable("b", ms))
		}
		if slices.Contains(pending, "a") {
			if got := s.persist(ms); !slices.Equal(got, []string{"a"}) {
				s.t.Fatalf("LapseDurable lapsed %v, want [a]", got)
			}
			if st := s.state("a", ms); st != StateLapsed {
				s.t.Fatalf("a is %s after its lapse is durable", st)
			}
		}
		s.report("b", ms+100, 2*leaseRate)
		if s.state("a", ms) == StateLapsed && s.usable("b", ms+100) > leaseRate*(1-1e-9) {
			return ms + 100
		}
	}
	s.t.Fatalf("b never got a's share: it may use %v", s.usable("b", ms))
	return 0
}

// TestSilentRegionGivesItsShareAway: a region silent for longer than
// region_lease + validity + margin lapses once that is durable, and its
// share above its floor goes to the region that wants it.
func TestSilentRegionGivesItsShareAway(t *testing.T) {
	s := newLeaseScript(t)
	last := s.lapseA()
	if s.usable("a", last) != 0 {
		t.Fatalf("a may still use %v", s.usable("a", last))
	}
	if set := s.a.LapsedSet(); !slices.Equal(set, []string{"a"}) {
		t.Fatalf("LapsedSet = %v, want [a]", set)
	}
	v := s.a.View(s.at(last))
	if r := v.Regions[0]; !r.Floored || r.StaticLease != 0 {
		t.Fatalf("a's view: %+v", r)
	}
}

// TestReturningRegionStartsAtItsFloor: a lapsed region that reports again
// gets no static lease while the grants that counted it at its floor may
// be in force; it is counted at its static share from its first report,
// and conferred the lease once that is safe.
func TestReturningRegionStartsAtItsFloor(t *testing.T) {
	for _, bReports := range []bool{true, false} {
		name := "b keeps reporting"
		if !bReports {
			name = "b goes silent"
		}
		t.Run(name, func(t *testing.T) {
			s := newLeaseScript(t)
			ms := s.lapseA() + 900
			bExpiry := s.held["b"].expiry
			back := ms
			ans := s.report("a", back, 0)
			if ans.StaticLease != 0 {
				t.Fatalf("a's first report after its lapse was conferred a static lease of %v", ans.StaticLease)
			}
			if st := s.state("a", back); st != StateReturning {
				t.Fatalf("a is %s after reporting again", st)
			}
			conferred := false
			for ms = back + 100; ms <= back+6000; ms += 100 {
				s.check(ms)
				if ms%1000 == 0 {
					s.a.Allocate(s.at(ms))
				}
				if bReports && ms%1000 == 200 {
					s.report("b", ms, 2*leaseRate)
					// Above its static share, b's grant may only borrow
					// what a's own grant leaves (a holds it before its
					// static share), never a's static share itself.
					if hb, ha := s.held["b"], s.held["a"]; hb.expiry.After(bExpiry) && hb.rate > leaseStatic*(1+1e-9) && hb.expiry.After(ha.expiry) {
						t.Fatalf("at %dms b was granted %v until %v, after a's grant ends (%v): a must count at its static share",
							ms, hb.rate, hb.expiry.Sub(s.start), ha.expiry.Sub(s.start))
					}
				}
				if ms%500 != 0 {
					continue
				}
				// No demand of its own: a grant counting a at its floor
				// would give b everything.
				ans := s.report("a", ms, 0)
				bMay := max(leaseStatic, 0.0)
				if h := s.held["b"]; s.at(ms).Before(h.expiry) {
					bMay = max(bMay, h.rate)
				}
				if ans.StaticLease > 0 && !conferred {
					conferred = true
					// a runs on its own grant until that ends, then on its
					// static share: b's grant above its own static share
					// must end by then.
					if ha := s.held["a"]; bMay+leaseStatic > leaseRate*(1+1e-12) && s.held["b"].expiry.After(ha.expiry) {
						t.Fatalf("at %dms a was conferred its static lease while b may use %v until %v, after a's grant ends (%v)",
							ms, bMay, s.held["b"].expiry.Sub(s.start), ha.expiry.Sub(s.start))
					}
					if ms > back+5000 || (!bReports && ms >= back+5000) {
						// b silent: its grant that counted a at its floor
						// ends before the validity, and the fence shows it.
						t.Fatalf("a conferred its lease only at %dms (returned at %dms, b's grant ended at %v)", ms, back, bExpiry.Sub(s.start))
					}
					if st := s.state("a", ms); st != StateLive {
						t.Fatalf("a is %s once conferred its lease", st)
					}
					if set := s.a.LapsedSet(); len(set) != 0 {
						t.Fatalf("LapsedSet = %v after a was conferred its lease", set)
					}
				}
			}
			if !conferred {
				t.Fatal("a never got its static lease back")
			}
		})
	}
}

// TestLearningLeaderWithDurableLapsedSet: a new leader given the durable
// lapsed set confers no static lease to those regions while learning
// (the previous leader's grants may count them at their floor), does to
// the others, and counts none at its floor on the set's word alone.
func TestLearningLeaderWithDurableLapsedSet(t *testing.T) {
	s := newLeaseScript(t, "a")
	if !s.a.Learning(s.at(100)) {
		t.Fatal("a new allocator is not learning")
	}
	if ans := s.report("b", 100, 2*leaseRate); ans.StaticLease != 10*time.Second {
		t.Fatalf("b (not in the lapsed set) got static lease %v while learning, want 10s", ans.StaticLease)
	}
	for ms := 200; ms < 5000; ms += 700 {
		if ans := s.report("a", ms, leaseRate); ans.StaticLease != 0 {
			t.Fatalf("a (in the durable lapsed set) got static lease %v at %dms while learning", ans.StaticLease, ms)
		}
		if st := s.state("a", ms); st != StateReturning {
			t.Fatalf("a is %s at %dms", st, ms)
		}
	}
	if set := s.a.LapsedSet(); !slices.Equal(set, []string{"a"}) {
		t.Fatalf("LapsedSet = %v while a may still be counted at its floor elsewhere", set)
	}
	// Never heard a is still counted at its static share by this leader.
	s.a.Allocate(s.at(5000))
	if r := s.a.View(s.at(5000)).Keys[0].Regions[0]; r.ReservedRate < leaseStatic {
		t.Fatalf("a reserved %v, want at least its static share %v", r.ReservedRate, leaseStatic)
	}
	if s.a.Learning(s.at(5100)) {
		t.Fatal("still learning after the validity")
	}
	if ans := s.report("a", 5100, leaseRate); ans.StaticLease != 10*time.Second {
		t.Fatalf("a got static lease %v once learning ended, want 10s", ans.StaticLease)
	}
	if set := s.a.LapsedSet(); len(set) != 0 {
		t.Fatalf("LapsedSet = %v after a was conferred its lease", set)
	}
}

// TestBecomeLeaderTakesTheLapsedSet: BecomeLeader with the set behaves as
// a new allocator does, and a region in it that never reports is found
// lapsed again only after a whole lapse period of this leader.
func TestBecomeLeaderTakesTheLapsedSet(t *testing.T) {
	s := newLeaseScript(t)
	s.lapseA()
	s.a.BecomeLeader(s.at(40_000), s.a.LapsedSet()...)
	if st := s.state("a", 40_000); st != StateSilent {
		t.Fatalf("a is %s after BecomeLeader: a new leader must not count it at its floor on the set's word", st)
	}
	if p := s.a.PendingLapses(s.at(56_000)); len(p) != 0 {
		t.Fatalf("pending %v before a lapse period since BecomeLeader", p)
	}
	if p := s.a.PendingLapses(s.at(56_100)); !slices.Equal(p, []string{"a", "b"}) {
		t.Fatalf("pending %v a lapse period after BecomeLeader, want [a b]", p)
	}
	if ok, err := s.a.LapseDurable(s.at(56_100), "nowhere"); ok || err == nil {
		t.Fatalf("LapseDurable of an unknown region: %v, %v", ok, err)
	}
}

// TestDrainedRegionRunsOnItsFloor: a drained region's static share is its
// floor, the rest goes to the others, and it is granted no more.
func TestDrainedRegionRunsOnItsFloor(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	a, err := NewAllocator(Options{
		Regions: []Region{{Name: "a", Weight: 1, Drained: true}, {Name: "b", Weight: 1}},
		Epoch:   time.Second, Validity: 5 * time.Second,
	}, start)
	if err != nil {
		t.Fatal(err)
	}
	key := quota.Key{Tenant: "acme", Class: "write"}
	if err := a.SetLimit(key, KeyLimit{Rate: 100, Burst: 100, FloorShare: 0.2}); err != nil {
		t.Fatal(err)
	}
	var got Grant
	var seq uint64
	for ms := 0; ms < 20_000; ms += 1000 {
		now := start.Add(time.Duration(ms) * time.Millisecond)
		a.Allocate(now)
		seq++
		for _, r := range []string{"a", "b"} {
			kd := KeyDemand{Key: key, Admitted: 200, Window: time.Second}
			if r == "b" && got.Valid > 0 {
				kd.HeldRate, kd.HeldBurst, kd.HeldValid = got.Rate, got.Burst, got.Valid-100*time.Millisecond
			}
			ans, err := a.Report(now.Add(100*time.Millisecond), Report{Region: r, Seq: seq, Keys: []KeyDemand{kd}})
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range ans.Grants {
				if r == "a" && (g.Rate > 10*(1+1e-9) || g.Burst > 10) {
					t.Fatalf("drained a granted %v/%v, above its floor 10/10", g.Rate, g.Burst)
				}
				if r == "b" {
					got = g
				}
			}
		}
	}
	if got.Rate < 90*(1-1e-9) || got.Burst < 90 {
		t.Fatalf("b holds %v/%v, want a's share above its floor (90/90)", got.Rate, got.Burst)
	}
	v := a.View(start.Add(20 * time.Second))
	if st := v.Regions[0].State; st != StateDrained || !v.Regions[0].Floored {
		t.Fatalf("a's view %+v", v.Regions[0])
	}
}

// TestLapseMarginIsTheLongerOfEpochAndOnePercent pins the clock margin a
// silent region's lapse waits for beyond RegionLease + Validity.
func TestLapseMarginIsTheLongerOfEpochAndOnePercent(t *testing.T) {
	for _, tc := range []struct {
		epoch, lease, want time.Duration
	}{
		{time.Second, 10 * time.Second, time.Second},
		{time.Second, 100 * time.Second, time.Second},
		{time.Second, 250 * time.Second, 2500 * time.Millisecond},
		{200 * time.Millisecond, time.Hour, 36 * time.Second},
	} {
		if got := LapseMargin(tc.epoch, tc.lease); got != int64(tc.want) {
			t.Errorf("LapseMargin(%v, %v) = %v, want %v", tc.epoch, tc.lease, time.Duration(got), tc.want)
		}
	}
}

// TestLapseOnlyAfterTheWholeLapsePeriod: a region last heard at T may
// still run on its static lease (and its grants) until T + RegionLease +
// Validity + LapseMargin, so at that very instant it is neither pending
// nor lapsed by LapseDurable; a nanosecond later it is both.
func TestLapseOnlyAfterTheWholeLapsePeriod(t *testing.T) {
	s := newLeaseScript(t)
	s.report("a", 500, 0)
	s.report("b", 500, 0)
	edge := s.at(500).Add(16 * time.Second) // 10s lease + 5s validity + 1s margin
	if p := s.a.PendingLapses(edge); len(p) != 0 {
		t.Fatalf("pending %v exactly a lapse period after the last report", p)
	}
	if ok, err := s.a.LapseDurable(edge, "a"); ok || err != nil {
		t.Fatalf("LapseDurable exactly a lapse period after a's last report: %v, %v; want false", ok, err)
	}
	if st := s.state("a", 16_500); st == StateLapsed {
		t.Fatal("a lapsed exactly a lapse period after its last report")
	}
	after := edge.Add(time.Nanosecond)
	if p := s.a.PendingLapses(after); !slices.Equal(p, []string{"a", "b"}) {
		t.Fatalf("pending %v just after the lapse period, want [a b]", p)
	}
	if ok, err := s.a.LapseDurable(after, "a"); !ok || err != nil {
		t.Fatalf("LapseDurable just after the lapse period: %v, %v; want true", ok, err)
	}
	if ok, err := s.a.LapseDurable(after, "a"); ok || err != nil {
		t.Fatalf("LapseDurable of a lapsed region: %v, %v; want false (nothing changes)", ok, err)
	}
}

// TestRegionIsSilentOnlyAfterTheSilenceTimeout: the View calls a region
// silent once more than SilenceTimeout (default two epochs) passed since
// its last report, not at that instant; it shows the report's age and
// what is left of the static lease conferred with its answer.
func TestRegionIsSilentOnlyAfterTheSilenceTimeout(t *testing.T) {
	s := newLeaseScript(t)
	s.report("a", 500, 0)
	for _, tc := range []struct {
		at     time.Time
		silent bool
		state  RegionState
	}{
		{s.at(2500), false, StateLive},
		{s.at(2500).Add(time.Nanosecond), true, StateSilent},
	} {
		var r RegionView
		for _, rv := range s.a.View(tc.at).Regions {
			if rv.Name == "a" {
				r = rv
			}
		}
		age := tc.at.Sub(s.at(500))
		if r.Silent != tc.silent || r.State != tc.state || !r.LastReport.Equal(s.at(500)) || r.LastReportAge != age || r.StaticLease != 10*time.Second-age {
			t.Fatalf("a %v after its report: silent %v, %s, last report %v ago at %v, static lease %v left; want silent %v, %s, %v ago at %v, %v left",
				age, r.Silent, r.State, r.LastReportAge, r.LastReport, r.StaticLease, tc.silent, tc.state, age, s.at(500), 10*time.Second-age)
		}
	}
}

// TestLapsedSetRegionGetsItsLeaseWhenLearningEnds: a region in the durable
// lapsed set reporting to a new leader gets no static lease before the
// leader's learning ends (the previous leader's grants may count it at its
// floor until then), and gets it at that very instant.
func TestLapsedSetRegionGetsItsLeaseWhenLearningEnds(t *testing.T) {
	s := newLeaseScript(t, "a")
	if ans := s.report("a", 4999, leaseRate); ans.StaticLease != 0 {
		t.Fatalf("a got static lease %v 1ms before learning ends", ans.StaticLease)
	}
	if ans := s.report("a", 5000, leaseRate); ans.StaticLease != 10*time.Second {
		t.Fatalf("a got static lease %v when learning ended, want 10s", ans.StaticLease)
	}
}

// TestReturningRegionsShortGrantMakesRoomForItsStaticShare: a short grant
// to a returning region is checked against its static share, not the floor
// it runs on: its static lease may be conferred (in the same answer, or a
// later one) before the grant ends, and it then falls back to its static
// share at the earlier fallback time the short grant sets, which the
// others' grants never counted on. TestTimelineNeverOversubscribes/round6
// replays a run where checking the floor let three regions refill at
// 0.505 of a 0.5 limit.
func TestReturningRegionsShortGrantMakesRoomForItsStaticShare(t *testing.T) {
	s := newLeaseScript(t)
	ms := s.lapseA() + 900
	s.report("a", ms, 0)
	if st := s.state("a", ms); st != StateReturning {
		t.Fatalf("a is %s after reporting again", st)
	}
	k := s.a.keyIndex[s.key]
	b := s.a.blockOf[k]
	if b < 0 {
		t.Fatal("the key has no fencing block")
	}
	ri := s.a.regionIndex["a"]
	sh := s.a.loadShares(k)
	if sh.fR[ri] != 0 || sh.sR[ri] != leaseStatic {
		t.Fatalf("a returning: fallback %v, static %v; want its floor 0 and static %v", sh.fR[ri], sh.sR[ri], leaseStatic)
	}
	s.a.lanesFor(s.a.clock, b, ri, sh)
	if got := s.a.rateLane.static; got != leaseStatic {
		t.Fatalf("a short grant to the returning region is checked against %v, want its static share %v", got, leaseStatic)
	}
	if got := s.a.burstLane.static; got != sh.sB[ri] {
		t.Fatalf("a short grant's burst is checked against %v, want the static burst %v", got, sh.sB[ri])
	}
}

// TestExtendLearningKeepsWhatWasLearnt: learning that is on is extended
// to the given end and no further back, keeping the demand estimates and
// re-issued grants it has (BecomeLeader would forget them); an Allocator
// no longer learning refuses, and stays so. A region of the durable
// lapsed set that returned while learning gets its static lease only at
// the extended end, as if it had returned after it.
func TestExtendLearningKeepsWhatWasLearnt(t *testing.T) {
	s := newLeaseScript(t, "a")
	s.report("a", 100, leaseRate)
	s.report("b", 200, 2*leaseRate)
	demand := func(ms int) float64 {
		t.Helper()
		v := s.a.View(s.at(ms))
		if len(v.Keys) != 1 {
			t.Fatalf("view at %dms holds %d keys", ms, len(v.Keys))
		}
		return v.Keys[0].Regions[1].Demand
	}
	before := demand(300)
	if before <= 0 {
		t.Fatalf("b's demand estimate %v after its report", before)
	}
	if !s.a.ExtendLearning(s.at(300), s.at(8000)) {
		t.Fatal("a learning allocator refused to extend")
	}
	if got := demand(300); got != before {
		t.Fatalf("extending changed b's demand estimate %v -> %v", before, got)
	}
	if !s.a.ExtendLearning(s.at(400), s.at(6000)) {
		t.Fatal("a learning allocator refused an earlier end")
	}
	for _, c := range []struct {
		ms       int
		learning bool
	}{{4999, true}, {5000, true}, {7999, true}, {8000, false}} {
		if got := s.a.Learning(s.at(c.ms)); got != c.learning {
			t.Fatalf("Learning at %dms = %v, want %v (extended to 8000ms, then asked for 6000ms)", c.ms, got, c.learning)
		}
	}
	if ans := s.report("a", 7999, leaseRate); ans.StaticLease != 0 {
		t.Fatalf("a (returning from the lapsed set) got static lease %v at 7999ms, before the extended end", ans.StaticLease)
	}
	if ans := s.report("a", 8000, leaseRate); ans.StaticLease != 10*time.Second {
		t.Fatalf("a got static lease %v when the extended learning ended, want 10s", ans.StaticLease)
	}
	if s.a.ExtendLearning(s.at(8000), s.at(20_000)) {
		t.Fatal("an allocator whose learning ended at this instant extended learning")
	}
	if s.a.ExtendLearning(s.at(8100), s.at(20_000)) {
		t.Fatal("an allocator no longer learning extended learning")
	}
	if s.a.Learning(s.at(8200)) {
		t.Fatal("learning again after a refused extension")
	}
}

// TestStartOwningRestartsEverySilence: an Allocator that owned nothing
// (a shard no region reported to) and starts owning keys counts every
// region's silence from then: a region silent since the start is no longer
// pending, and its prompt report is answered with a static lease, not as
// returning. A region counted at its floor stays so unless no grant can be
// out (noGrantsOut), when it starts afresh too.
func TestStartOwningRestartsEverySilence(t *testing.T) {
	s := newLeaseScript(t)
	const idle = 20_000 // ms: past the 16s lapse
	if got := s.a.PendingLapses(s.at(idle)); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("pending after %dms of silence: %v, want a and b", idle, got)
	}
	if ok, err := s.a.LapseDurable(s.at(idle), "b"); !ok || err != nil {
		t.Fatalf("LapseDurable(b) = %v, %v", ok, err)
	}
	s.a.StartOwning(s.at(idle), false)
	if got := s.a.PendingLapses(s.at(idle + 15_000)); len(got) != 0 {
		t.Fatalf("pending 15s after it started owning: %v, want none", got)
	}
	if got := s.a.PendingLapses(s.at(idle + 17_000)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("pending 17s after it started owning: %v, want a", got)
	}
	if ans := s.report("a", idle+100, 10); ans.StaticLease == 0 {
		t.Fatal("a, reporting 100ms after the Allocator started owning, was conferred no static lease")
	}
	// b's lapse is durable: without noGrantsOut it stays.
	if got := s.a.LapsedSet(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("lapsed set after StartOwning with grants possibly out: %v, want b", got)
	}
	s.a.StartOwning(s.at(idle+300), true)
	if got := s.a.LapsedSet(); len(got) != 0 {
		t.Fatalf("lapsed set after StartOwning with no grants out: %v, want none", got)
	}
	if ans := s.report("b", idle+400, 10); ans.StaticLease == 0 {
		t.Fatal("b was conferred no static lease after StartOwning with no grants out")
	}
}

// TestStartOwningForgetsTargetsOfARegionItNoLongerFloors: the targets a
// contended key kept from a time a region was returning (its grants fall
// back to its floor, which the water-fill and the burst split heed) are
// not reused once StartOwning with no grants out forgets that. While the
// shard owned nothing every region was silent and no target was worked
// out, so the first ones after it starts owning may be asked for with
// exactly the demands and capacity of the last; they must be those of a
// region that falls back to its static share.
func TestStartOwningForgetsTargetsOfARegionItNoLongerFloors(t *testing.T) {
	for _, tc := range []struct {
		unit, floorShare float64
		dem              []float64 // a's, b's
	}{
		{unit: 10, floorShare: 0.5, dem: []float64{0.001, 30}}, // a's floor burst holds a unit, its fallback rate is lower
		{unit: 60, floorShare: 0.5, dem: []float64{5, 0}},      // a's static burst holds the unit its floor does not
		{unit: 60, floorShare: 0, dem: []float64{30, 30}},
	} {
		a, err := NewAllocator(Options{
			Regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}},
			Epoch:   time.Second, Validity: 5 * time.Second, RegionLease: 10 * time.Second,
			Lapsed: []string{"a"},
		}, testStart)
		if err != nil {
			t.Fatal(err)
		}
		key := quota.Key{Tenant: "acme", Class: "write"}
		if err := a.SetLimit(key, KeyLimit{Rate: 100, Burst: 100, Unit: tc.unit, FloorShare: tc.floorShare}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Report(ms(100), Report{Region: "a", Seq: 1, Keys: []KeyDemand{{Key: key, Admitted: tc.dem[0], Window: time.Second}}}); err != nil {
			t.Fatal(err)
		}
		if st := a.View(ms(100)).Regions[0].State; st != StateReturning {
			t.Fatalf("a is %s after its first report to a leader that read it in the lapsed set", st)
		}
		k := a.keyIndex[key]
		b := a.blockOf[k]
		if b < 0 {
			b = a.newBlock(k)
		}
		// (rate, burst) targets of a and b with both reporting these demands.
		targets := func(at time.Time) []float64 {
			a.silent[0], a.silent[1] = false, false
			ensure(&a.dem, 2)
			copy(a.dem, tc.dem)
			a.computeTargets(a.tick(at), k, b, a.loadShares(k))
			base := int(b) * 2
			return append(slices.Clone(a.targetRate[base:base+2]), a.targetBurst[base:base+2]...)
		}
		returning := targets(ms(200))
		a.StartOwning(ms(30_000), true)
		got := targets(ms(30_100))
		a.memoOff = true
		want := targets(ms(30_100))
		if slices.Equal(returning, want) {
			t.Fatalf("%+v: the targets are %v whether a is returning or not; the case tests nothing", tc, want)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%+v: targets after StartOwning %v, those of a returning a; recomputed %v", tc, got, want)
		}
	}
}
