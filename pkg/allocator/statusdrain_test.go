package allocator

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// TestStatusReservesADrainedRegionWholeUntilItReportsTheDrain: a region
// the live config drains shows its whole share reserved, drain pending,
// while it reports only a revision that does not drain it; once it
// reports the draining revision it shows only the floor reserved.
func TestStatusReservesADrainedRegionWholeUntilItReportsTheDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, src := drainService(t)
		src.Set(parseConfig(t, drainedB), 6)
		status := func(bRevs []int64, seq uint64) *sluicev1.RegionStatus {
			t.Helper()
			reportRunning(t, s, "a", seq, 5, 6)
			reportRunning(t, s, "b", seq, bRevs...)
			return regionStatus(t, s, "b")
		}
		floor := floorFraction(parseConfig(t, drainedB))
		if floor >= 1 {
			t.Fatalf("floor fraction %g, want below 1", floor)
		}
		if b := status([]int64{5}, 1); !b.GetDrainPending() || b.GetReservedFraction() != 1 {
			t.Fatalf("b runs revision 5 only: drain pending %v, reserved %g; want pending and 1", b.GetDrainPending(), b.GetReservedFraction())
		}
		if b := status([]int64{5, 6}, 2); b.GetDrainPending() || b.GetReservedFraction() != floor {
			t.Fatalf("b reported the drain: drain pending %v, reserved %g; want not pending and %g", b.GetDrainPending(), b.GetReservedFraction(), floor)
		}
	})
}

// TestStatusOfASourceWithoutRevisionsNamesRevision0: a config source
// without revisions (a static config) is revision 0 in Status.
func TestStatusOfASourceWithoutRevisionsNamesRevision0(t *testing.T) {
	s := quietService(t, StaticConfig{C: parseConfig(t, loopConfig)})
	st, err := s.Status(t.Context(), &sluicev1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetConfigRevision() != 0 {
		t.Fatalf("config revision %d, want 0", st.GetConfigRevision())
	}
}

// TestHeldConfigsOverTheBoundDropTheOldestReported: when every held
// config is one some region reports (each reports the most a report
// carries) and the live one is past the bound, the oldest goes.
func TestHeldConfigsOverTheBoundDropTheOldestReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfgOf := func(rev int64) string {
			return strings.Replace(loopConfig, "rate: 100/s", fmt.Sprintf("rate: %d/s", 100+rev), 1)
		}
		src := configtest.NewSource(parseConfig(t, cfgOf(1)), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		const n = regionsync.MaxConfigs
		seq := map[string]uint64{}
		var revs []int64
		for rev := int64(1); rev <= 2*n; rev++ {
			if rev > 1 {
				src.Set(parseConfig(t, cfgOf(rev)), rev)
			}
			region := "a"
			if rev > n {
				region = "b"
			}
			if rev == n+1 {
				revs = nil
			}
			revs = append(revs, rev)
			seq[region]++
			if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: region, Seq: seq[region], ConfigRevisions: revs}); err != nil {
				t.Fatal(err)
			}
		}
		src.Set(parseConfig(t, cfgOf(2*n+1)), 2*n+1)
		s.step(time.Now())
		var want []int64
		for rev := int64(2); rev <= 2*n+1; rev++ {
			want = append(want, rev)
		}
		s.mu.Lock()
		got := slices.Sorted(maps.Keys(s.held))
		s.mu.Unlock()
		if !slices.Equal(got, want) {
			t.Fatalf("configs held %v, want %v", got, want)
		}
	})
}

// TestStatusDrainNotPendingWhenTheConfirmedRevisionDrains: a region that
// reports only the confirmed revision, one that drains it, has its drain
// reported, though a held revision after it (one another region still
// runs) does not drain it: the revisions a region reports count from the
// confirmed one on, that one included.
func TestStatusDrainNotPendingWhenTheConfirmedRevisionDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, src := drainService(t)
		// 6 drains b, 7 lifts the drain, 8 (live) drains it again; each is
		// applied in turn, and held while no region has reported.
		for _, c := range []struct {
			rev  int64
			yaml string
		}{{6, drainedB}, {7, loopConfig}, {8, drainedB}} {
			src.Set(parseConfig(t, c.yaml), c.rev)
			if _, err := s.Status(t.Context(), &sluicev1.StatusRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		reportRunning(t, s, "a", 1, 6, 7, 8)
		reportRunning(t, s, "b", 1, 6)
		s.mu.Lock()
		held := slices.Sorted(maps.Keys(s.held))
		s.mu.Unlock()
		if !slices.Equal(held, []int64{6, 7, 8}) {
			t.Fatalf("held revisions %v, want [6 7 8]", held)
		}
		if r := regionStatus(t, s, "b"); r.GetDrainPending() {
			t.Errorf("b runs the confirmed revision 6, which drains it: %v, want no drain pending", r)
		}
	})
}

// TestStatusDrainPendingPastARevisionNeverHeld: a region the live config
// drains, reporting a revision this replica never held beside one that
// does not drain it, before any revision is confirmed, shows its drain
// pending: the revision not held is passed over, not read.
func TestStatusDrainPendingPastARevisionNeverHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, src := drainService(t)
		src.Set(parseConfig(t, drainedB), 6)
		reportRunning(t, s, "b", 1, 4, 5)
		if r := regionStatus(t, s, "b"); !r.GetDrainPending() || r.GetReservedFraction() != 1 {
			t.Errorf("b runs revisions 4 (never held) and 5 (not draining it): %v, want its drain pending, reserved whole", r)
		}
	})
}

// TestStatusDrainReportedAheadOfTheConfirmedRevision: a region that
// reports the draining revision beside the confirmed one, which does not
// drain it, while another region runs only the confirmed one, has its
// drain reported: its reserve is the smaller share, under the revision
// past the confirmed one.
func TestStatusDrainReportedAheadOfTheConfirmedRevision(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, src := drainService(t)
		src.Set(parseConfig(t, drainedB), 6)
		reportRunning(t, s, "a", 1, 5)
		reportRunning(t, s, "b", 1, 5, 6)
		if r := regionStatus(t, s, "b"); r.GetDrainPending() {
			t.Errorf("b reports revision 6, which drains it, past the confirmed 5: %v, want no drain pending", r)
		}
	})
}

// drainedB is loopConfig with region b drained.
var drainedB = strings.Replace(loopConfig, "b: {weight: 1}", "b: {weight: 1, drained: true}", 1)

// drainService is a service leading on loopConfig at revision 5, its
// source for the test to apply later revisions through.
func drainService(t *testing.T) (*Service, *configtest.Source) {
	t.Helper()
	src := configtest.NewSource(parseConfig(t, loopConfig), 5)
	s := quietService(t, src)
	s.promote(1, time.Now().Add(time.Hour), nil)
	return s, src
}

// reportRunning has region send its report seq, one key's demand, as
// running the revisions revs.
func reportRunning(t *testing.T, s *Service, region string, seq uint64, revs ...int64) {
	t.Helper()
	k := &sluicev1.QuotaKey{Tenant: "t", Class: "write"}
	if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: region, Seq: seq, ConfigRevisions: revs,
		Keys: []*sluicev1.KeyDemand{{Key: k, Admitted: 10, WindowMs: 100}}}); err != nil {
		t.Fatal(err)
	}
}

// regionStatus is region's line of s's Status.
func regionStatus(t *testing.T, s *Service, region string) *sluicev1.RegionStatus {
	t.Helper()
	st, err := s.Status(t.Context(), &sluicev1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.GetRegions() {
		if r.GetRegion() == region {
			return r
		}
	}
	t.Fatalf("%s not in the status", region)
	return nil
}
