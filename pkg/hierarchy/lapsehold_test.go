package hierarchy

import (
	"slices"
	"testing"
	"time"
)

// TestLapsedRegionOfTheDurableSetReturnsAtItsFloor: a region named in the
// durable lapsed set a leader started with, which then lapses under this
// leader and reports again, waits for the grants that counted it at its
// floor on every report, not only on its first: that it was in the set
// (whose wait ended with learning) does not shorten the wait its own
// lapse started (confirmAt = return + validity).
func TestLapsedRegionOfTheDurableSetReturnsAtItsFloor(t *testing.T) {
	s := newLeaseScript(t, "a")
	back := s.lapseA() + 900
	if ans := s.report("a", back, 0); ans.StaticLease != 0 {
		t.Fatalf("a's first report after its lapse was conferred a static lease of %v", ans.StaticLease)
	}
	bExpiry := s.held["b"].expiry
	for ms := back + 500; s.at(ms).Before(bExpiry); ms += 500 {
		// report checks that a's static lease and b's grant never add
		// up to more than the key's rate.
		if ans := s.report("a", ms, 0); ans.StaticLease != 0 {
			t.Fatalf("at %dms a was conferred a static lease of %v while b's grant counting it at its floor runs until %v",
				ms, ans.StaticLease, bExpiry.Sub(s.start))
		}
	}
}

// TestLapsedSetListsEveryRegionThatMayBeAtItsFloor: LapsedSet names a
// region of the durable set a new leader was given before it reports (an
// earlier leader's grants may count it at its floor), and one that
// lapsed under this leader and reports again (returning) until it is
// conferred its static lease; StartOwning with no grants out clears
// even a name from the set no report followed, and that region's first
// report is conferred a static lease at once.
func TestLapsedSetListsEveryRegionThatMayBeAtItsFloor(t *testing.T) {
	t.Run("named in the set, not heard from", func(t *testing.T) {
		s := newLeaseScript(t, "a")
		if got := s.a.LapsedSet(); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("LapsedSet before a reports: %v, want [a]", got)
		}
		s.a.StartOwning(s.at(100), true)
		if got := s.a.LapsedSet(); len(got) != 0 {
			t.Fatalf("LapsedSet after StartOwning with no grants out: %v, want none", got)
		}
		if ans := s.report("a", 200, 10); ans.StaticLease == 0 {
			t.Fatal("a was conferred no static lease after StartOwning with no grants out cleared the set's word")
		}
	})
	t.Run("lapsed here, returning", func(t *testing.T) {
		s := newLeaseScript(t)
		back := s.lapseA() + 900
		if ans := s.report("a", back, 0); ans.StaticLease != 0 {
			t.Fatalf("a's first report after its lapse was conferred a static lease of %v", ans.StaticLease)
		}
		if got := s.a.LapsedSet(); !slices.Equal(got, []string{"a"}) {
			t.Fatalf("LapsedSet while a returns: %v, want [a]", got)
		}
	})
}

// TestLapsedSetRegionThatLapsesWhileLearningWaitsForLearningToEnd: a
// region of the durable lapsed set waits for the end of learning before
// it is conferred a static lease (an earlier leader's grants may count it
// at its floor until then), and lapsing again under this leader, while
// learning was extended past its lapse period, does not shorten that wait
// to the validity its own lapse starts. b holds the whole rate on a grant
// an earlier leader issued with a longer validity (PriorValidity) that
// runs until learning ends; a static lease for a before then would let
// both refill at 150 of 100.
func TestLapsedSetRegionThatLapsesWhileLearningWaitsForLearningToEnd(t *testing.T) {
	s := newLeaseScript(t, "a")
	a, err := NewAllocator(Options{
		Regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}},
		Epoch:   time.Second, Validity: 5 * time.Second, RegionLease: 10 * time.Second,
		Lapsed: []string{"a"}, PriorValidity: 40 * time.Second,
	}, s.start)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetLimit(s.key, KeyLimit{Rate: leaseRate, Burst: 100}); err != nil {
		t.Fatal(err)
	}
	s.a = a
	s.until["a"] = s.start // lapsed: no static lease
	s.held["b"] = scriptHeld{rate: leaseRate, burst: 100, expiry: s.at(40_000)}
	if !a.ExtendLearning(s.at(0), s.at(40_000)) {
		t.Fatal("a new allocator refused to extend its learning")
	}
	lapsed := false
	for ms := 100; ms < 45_000; ms += 1000 {
		s.report("b", ms, 2*leaseRate)
		if got := s.persist(ms + 100); len(got) > 0 {
			if !slices.Equal(got, []string{"a"}) || ms < 16_000 {
				t.Fatalf("at %dms %v lapsed, want a only, after 16s of silence", ms+100, got)
			}
			lapsed = true
		}
		if !lapsed || ms < 20_000 {
			continue
		}
		ans := s.report("a", ms+200, 10)
		if learning := a.Learning(s.at(ms + 200)); learning != (ans.StaticLease == 0) {
			t.Fatalf("at %dms a, back from its lapse since 20.3s, was conferred a static lease of %v (learning %v): want one exactly once learning ended at 40s",
				ms+200, ans.StaticLease, learning)
		}
	}
	if !lapsed {
		t.Fatal("a never lapsed while learning")
	}
}
