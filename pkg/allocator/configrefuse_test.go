package allocator

import (
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

// limitOf is k's limit in s's allocator (ok false when it does not track k).
func limitOf(s *Service, k quota.Key) (hierarchy.KeyLimit, bool) {
	for _, kv := range s.View(time.Now()).Keys {
		if kv.Key == k {
			return kv.Limit, true
		}
	}
	return hierarchy.KeyLimit{}, false
}

// TestTimingTheAllocatorRefusesKeepsTheOldAllocator: a config whose
// timing the allocator refuses (a demand alpha above 1, which only a
// config built past its checks can carry) leaves the allocator, its
// timing, learning and keys as they were, and later reports are answered.
func TestTimingTheAllocatorRefusesKeepsTheOldAllocator(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		good := parseConfig(t, loopConfig)
		src := configtest.NewSource(good, 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		acme := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}, Admitted: 5, WindowMs: 100}
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 1, Keys: []*sluicev1.KeyDemand{acme}}); err != nil {
			t.Fatal(err)
		}
		alloc, timing, floor := s.alloc, s.timing, s.learnFloor
		bad := *good
		bad.DemandAlpha = 2
		src.Set(&bad, 2)
		s.step(time.Now())
		if s.alloc != alloc || s.timing != timing || !s.learnFloor.Equal(floor) {
			t.Fatalf("a refused timing changed the allocator (%v), its timing %+v (was %+v) or learning floor %v (was %v)",
				s.alloc != alloc, s.timing, timing, s.learnFloor, floor)
		}
		if _, ok := limitOf(s, quota.Key{Tenant: "acme", Class: "write"}); !ok {
			t.Fatal("a refused timing lost the tracked key")
		}
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 2, Keys: []*sluicev1.KeyDemand{acme}}); err != nil {
			t.Fatalf("a report after the refused timing: %v", err)
		}
	})
}

// TestKeyWhoseClassLeftTheConfigKeepsItsLimit: a tracked key whose class
// a new config no longer has keeps the limit it had (regions may still
// hold grants for it) until it is forgotten, while a key of a class the
// new config keeps takes the new limit.
func TestKeyWhoseClassLeftTheConfigKeepsItsLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		twoClasses := strings.Replace(strings.Replace(loopConfig, "write: {}", "write: {}\n  read: {}", 1),
			"{write: {rate: 100/s, burst: 100}}", "{write: {rate: 100/s, burst: 100}, read: {rate: 50/s, burst: 50}}", 1)
		src := configtest.NewSource(parseConfig(t, twoClasses), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		var keys []*sluicev1.KeyDemand
		for _, class := range []string{"write", "read"} {
			keys = append(keys, &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: class}, Admitted: 5, WindowMs: 100})
		}
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 1, Keys: keys}); err != nil {
			t.Fatal(err)
		}
		// The same revision confirmed to both regions: one config in play.
		for i, region := range []string{"a", "b"} {
			if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: region, Seq: uint64(2 + i), ConfigRevisions: []int64{2}}); err != nil {
				t.Fatal(err)
			}
		}
		src.Set(parseConfig(t, strings.Replace(loopConfig, "rate: 100/s", "rate: 200/s", 1)), 2)
		s.step(time.Now())
		for _, c := range []struct {
			class string
			rate  float64
		}{{"write", 200}, {"read", 50}} {
			l, ok := limitOf(s, quota.Key{Tenant: "acme", Class: c.class})
			if !ok || l.Rate != c.rate {
				t.Errorf("acme/%s after the change: limit %+v (tracked %v), want rate %g", c.class, l, ok, c.rate)
			}
		}
	})
}

// TestFloorUnderAConfigWithoutTheKeysClassOrRegionIsZero: while two
// configs are in play, a region's floor for a key under a config that
// does not have the key's class, or does not have the region, is 0: a
// reports only revision 1 (no class read, floor 25/s for write), c
// reports revisions 1 (which has no region c) and 2, b reports only a revision
// this replica never held and gets the larger floor under either config
// held.
func TestFloorUnderAConfigWithoutTheKeysClassOrRegionIsZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		half := strings.Replace(loopConfig, "write: {}", "write: {partition_share: 0.5}", 1)
		src := configtest.NewSource(parseConfig(t, half), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		src.Set(parseConfig(t, strings.NewReplacer(
			"write: {partition_share: 0.5}", "write: {partition_share: 0.5}\n  read: {partition_share: 0.5}",
			"{write: {rate: 100/s, burst: 100}}", "{write: {rate: 100/s, burst: 100}, read: {rate: 50/s, burst: 50}}",
			"b: {weight: 1}", "b: {weight: 1}\n  c: {weight: 1}",
		).Replace(half)), 2)
		var keys []*sluicev1.KeyDemand
		for _, class := range []string{"write", "read"} {
			keys = append(keys, &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: class}, Admitted: 5, WindowMs: 100})
		}
		for _, r := range []*sluicev1.RegionReport{
			{Region: "a", Seq: 1, ConfigRevisions: []int64{1}, Keys: keys},
			{Region: "c", Seq: 1, ConfigRevisions: []int64{1, 2}},
			{Region: "b", Seq: 1, ConfigRevisions: []int64{9}},
		} {
			if _, err := s.Sync(t.Context(), r); err != nil {
				t.Fatal(err)
			}
		}
		// Under revision 2 each of three regions has a third of the key's
		// rate and burst, half of it its floor (the burst in whole tokens).
		for _, c := range []struct {
			class       string
			rate, burst []float64 // a, b, c
		}{
			{"write", []float64{25, 25, 0}, []float64{25, 25, 0}},
			{"read", []float64{0, 50.0 / 6, 0}, []float64{0, 8, 0}},
		} {
			l, ok := limitOf(s, quota.Key{Tenant: "acme", Class: c.class})
			if !ok || len(l.FloorRate) != len(c.rate) || len(l.FloorBurst) != len(c.burst) {
				t.Fatalf("acme/%s: limit %+v (tracked %v), want floors for 3 regions", c.class, l, ok)
			}
			for i := range c.rate {
				if math.Abs(l.FloorRate[i]-c.rate[i]) > 1e-6 || l.FloorBurst[i] != c.burst[i] {
					t.Errorf("acme/%s: floor rates %v, bursts %v; want %v, %v", c.class, l.FloorRate, l.FloorBurst, c.rate, c.burst)
					break
				}
			}
		}
	})
}
