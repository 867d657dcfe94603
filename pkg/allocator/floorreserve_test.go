package allocator

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestFloorReserveFromTheConfirmedRevisionOn: while several configs are in
// play, the floor the global tier assumes for a region is the smallest
// under the held revisions it reports from the confirmed one on, the
// confirmed one included: a reports 6 and 7 (floors 25/s and 40/s), b
// reports 6 and 8 (floors 25/s and 10/s), so 6 is confirmed and a's floor
// is 25/s, b's 10/s.
func TestFloorReserveFromTheConfirmedRevisionOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfgOf := func(share float64) string {
			return strings.Replace(loopConfig, "write: {}", fmt.Sprintf("write: {partition_share: %g}", share), 1)
		}
		src := configtest.NewSource(parseConfig(t, cfgOf(0.1)), 5)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		// Static shares are 50/s for each region; the floor is the
		// partition_share of it.
		for _, c := range []struct {
			rev   int64
			share float64
		}{{6, 0.5}, {7, 0.8}, {8, 0.2}} {
			src.Set(parseConfig(t, cfgOf(c.share)), c.rev)
			s.step(time.Now())
		}
		k := quota.Key{Tenant: "t", Class: "write"}
		for _, r := range []struct {
			region string
			revs   []int64
		}{{"a", []int64{6, 7}}, {"b", []int64{6, 8}}} {
			if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: r.region, Seq: 1, ConfigRevisions: r.revs,
				Keys: []*sluicev1.KeyDemand{{Key: &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}, Admitted: 10, WindowMs: 100}}}); err != nil {
				t.Fatal(err)
			}
		}
		if rev, known := s.conf.Assumed(); !known || rev != 6 {
			t.Fatalf("assumed revision %d (known %v), want 6", rev, known)
		}
		v := s.View(time.Now())
		var got []float64
		for _, kv := range v.Keys {
			if kv.Key == k {
				got = kv.Limit.FloorRate
			}
		}
		want := []float64{25, 10}
		if len(got) != len(want) {
			t.Fatalf("floor rates of a and b %v, want %v", got, want)
		}
		for i := range want {
			if math.Abs(got[i]-want[i]) > 1e-6 {
				t.Fatalf("floor rates of a and b %v, want %v", got, want)
			}
		}
	})
}

// TestReportedKeyKeepsItsClassFloor: a key a report brings in is limited
// with its class's partition_share as its floor share, under a single
// config too, so a drained region is counted at its floor (half its
// static 50/s here), which it serves, and not at nothing.
func TestReportedKeyKeepsItsClassFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		yaml := strings.Replace(loopConfig, "write: {}", "write: {partition_share: 0.5}", 1)
		yaml = strings.Replace(yaml, "b: {weight: 1}", "b: {weight: 1, drained: true}", 1)
		s := quietService(t, configtest.NewSource(parseConfig(t, yaml), 5))
		s.promote(1, time.Now().Add(time.Hour), nil)
		k := quota.Key{Tenant: "t", Class: "write"}
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 1, ConfigRevisions: []int64{5},
			Keys: []*sluicev1.KeyDemand{{Key: &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}, Admitted: 10, WindowMs: 100}}}); err != nil {
			t.Fatal(err)
		}
		for _, kv := range s.View(time.Now()).Keys {
			if kv.Key != k {
				continue
			}
			if kv.Limit.FloorShare != 0.5 {
				t.Fatalf("floor share %v, want the class's partition_share 0.5", kv.Limit.FloorShare)
			}
			if b := kv.Regions[1]; math.Abs(b.StaticRate-25) > 1e-6 || math.Abs(b.ReservedRate-25) > 1e-6 {
				t.Fatalf("drained b static %v reserved %v, want its floor 25/s", b.StaticRate, b.ReservedRate)
			}
			return
		}
		t.Fatalf("key %s not in the view", k)
	})
}

// TestDrainPendingUntilTheRegionReportsTheDrain: a region the live config
// drains is pending while the revisions it reported from the confirmed one
// on are held and none drains it; when it reported none of the held ones,
// it is pending only if some held config does not drain it.
func TestDrainPendingUntilTheRegionReportsTheDrain(t *testing.T) {
	drainB := func(yaml string) string {
		return strings.Replace(yaml, "b: {weight: 1}", "b: {weight: 1, drained: true}", 1)
	}
	pending := func(s *Service) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.drainPendingLocked("b")
	}
	synctest.Test(t, func(t *testing.T) {
		// b reports only the revision that does not drain it: pending.
		src := configtest.NewSource(parseConfig(t, loopConfig), 5)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		src.Set(parseConfig(t, drainB(loopConfig)), 6)
		s.step(time.Now())
		k := &sluicev1.QuotaKey{Tenant: "t", Class: "write"}
		for _, r := range []struct {
			region string
			revs   []int64
		}{{"a", []int64{5, 6}}, {"b", []int64{5}}} {
			if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: r.region, Seq: 1, ConfigRevisions: r.revs,
				Keys: []*sluicev1.KeyDemand{{Key: k, Admitted: 10, WindowMs: 100}}}); err != nil {
				t.Fatal(err)
			}
		}
		if !pending(s) {
			t.Fatal("b reported only a revision that does not drain it: drain not pending")
		}
	})
	synctest.Test(t, func(t *testing.T) {
		// Every held config drains b, which never reported: not pending.
		src := configtest.NewSource(parseConfig(t, drainB(loopConfig)), 5)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		src.Set(parseConfig(t, drainB(strings.Replace(loopConfig, "rate: 100/s", "rate: 200/s", 1))), 6)
		s.step(time.Now())
		s.mu.Lock()
		held := len(s.held)
		s.mu.Unlock()
		if held < 2 {
			t.Fatalf("%d configs held, want both revisions", held)
		}
		if pending(s) {
			t.Fatal("every held config drains b: drain pending")
		}
	})
	synctest.Test(t, func(t *testing.T) {
		// The confirmed revision is among b's reported ones: b reports
		// only 6, which drains it and is confirmed (a reports 6, 7, 8), so
		// the drain is not pending, although 7, still held for a, does not
		// drain b. Skipping the confirmed revision would find none of b's
		// revisions held and take 7's share.
		src := configtest.NewSource(parseConfig(t, loopConfig), 5)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		for _, c := range []struct {
			rev  int64
			yaml string
		}{{6, drainB(loopConfig)}, {7, loopConfig}, {8, drainB(loopConfig)}} {
			src.Set(parseConfig(t, c.yaml), c.rev)
			s.step(time.Now())
		}
		k := &sluicev1.QuotaKey{Tenant: "t", Class: "write"}
		for _, r := range []struct {
			region string
			revs   []int64
		}{{"a", []int64{6, 7, 8}}, {"b", []int64{6}}} {
			if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: r.region, Seq: 1, ConfigRevisions: r.revs,
				Keys: []*sluicev1.KeyDemand{{Key: k, Admitted: 10, WindowMs: 100}}}); err != nil {
				t.Fatal(err)
			}
		}
		s.mu.Lock()
		assumed, known := s.conf.Assumed()
		_, held7 := s.held[7]
		s.mu.Unlock()
		if !known || assumed != 6 || !held7 {
			t.Fatalf("assumed %d (known %v), 7 held %v: want 6 assumed and 7 held", assumed, known, held7)
		}
		if pending(s) {
			t.Fatal("b reported the confirmed revision, which drains it: drain pending")
		}
	})
}
