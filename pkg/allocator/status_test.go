package allocator

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestKeyStatusesCarryEachRegion: Status lists the keys of the
// allocator's TopView in its order (the ranking is hierarchy's
// TestTopViewIsTheTopOfView); each key carries its rate, burst and summed
// demand, each region's line its demand, target, grant and static rate,
// and the grant's remaining validity (0 once expired or when there is
// none).
func TestKeyStatusesCarryEachRegion(t *testing.T) {
	at := time.Unix(1000, 0)
	key := func(tenant, class string, rate float64, regions ...hierarchy.KeyRegionView) hierarchy.KeyView {
		return hierarchy.KeyView{Key: quota.Key{Tenant: tenant, Class: class}, Limit: hierarchy.KeyLimit{Rate: rate, Burst: 2 * rate},
			Regions: regions}
	}
	demand := func(d float64) hierarchy.KeyRegionView { return hierarchy.KeyRegionView{Demand: d} }
	v := hierarchy.View{
		At:      at,
		Regions: []hierarchy.RegionView{{Region: hierarchy.Region{Name: "a"}}, {Region: hierarchy.Region{Name: "b"}}},
		Keys: []hierarchy.KeyView{
			key("t2", "write", 1,
				hierarchy.KeyRegionView{Demand: 1.5, StaticRate: 0.5, TargetRate: 0.75, GrantedRate: 0.7, GrantedBurst: 1.25,
					GrantExpiry: at.Add(1500 * time.Millisecond)},
				hierarchy.KeyRegionView{Demand: 0.5, StaticRate: 0.5, TargetRate: 0.25, GrantedRate: 0.3, GrantedBurst: 0.75,
					GrantExpiry: at.Add(-time.Second)}),
			key("t0", "read", 10, demand(0), demand(5)),
		},
	}
	out := keyStatuses(v)
	var got []string
	for _, ks := range out {
		got = append(got, ks.GetKey().GetTenant()+"/"+ks.GetKey().GetClass())
	}
	if strings.Join(got, " ") != "t2/write t0/read" {
		t.Fatalf("keys %v, want t2/write t0/read", got)
	}
	if k := out[1]; k.GetRate() != 10 || k.GetBurst() != 20 || k.GetDemand() != 5 {
		t.Errorf("t0/read: rate %v burst %v demand %v, want 10, 20, 5", k.GetRate(), k.GetBurst(), k.GetDemand())
	}
	top := out[0]
	if top.GetDemand() != 2 || len(top.GetRegions()) != 2 {
		t.Fatalf("t2/write: demand %v over %d regions, want 2 over 2", top.GetDemand(), len(top.GetRegions()))
	}
	for i, want := range []struct {
		region                             string
		demand, target, rate, burst, share float64
		validMs                            int64
	}{
		{"a", 1.5, 0.75, 0.7, 1.25, 0.5, 1500},
		{"b", 0.5, 0.25, 0.3, 0.75, 0.5, 0},
	} {
		r := top.GetRegions()[i]
		if r.GetRegion() != want.region || r.GetDemand() != want.demand || r.GetTarget() != want.target ||
			r.GetGrantedRate() != want.rate || r.GetGrantedBurst() != want.burst || r.GetStaticRate() != want.share ||
			r.GetValidMs() != want.validMs {
			t.Errorf("t2/write in region %d: %v, want %+v", i, r, want)
		}
	}
	for _, r := range out[1].GetRegions() {
		if r.GetValidMs() != 0 {
			t.Errorf("t0/read without a grant in %s: valid %dms, want 0", r.GetRegion(), r.GetValidMs())
		}
	}
}

// TestFloorFractionIsTheLargestClassShare: the fraction Status shows
// reserved for a floored region is the largest partition_share of any
// class.
func TestFloorFractionIsTheLargestClassShare(t *testing.T) {
	cfg := parseConfig(t, `
epoch: 100ms
grant_validity: 500ms
regions:
  a: {weight: 1}
classes:
  write: {partition_share: 0.2}
  read: {partition_share: 0.5}
  scan: {partition_share: 0.3}
tiers:
  free: {write: {rate: 1/s, burst: 1}, read: {rate: 1/s, burst: 1}, scan: {rate: 1/s, burst: 1}}
default_tier: free
`)
	if f := floorFraction(cfg); f != 0.5 {
		t.Fatalf("floor fraction %v, want 0.5", f)
	}
}

// TestStatusRegionLines: the leader's Status gives each region the age of
// its last report (-1 before its first), its seq and its whole static
// share reserved while live; a replica that does not lead names the
// leader and shows nothing of its allocator.
func TestStatusRegionLines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newEdgeService(t)
		s.observeLeader("other:7500")
		st, err := s.Status(t.Context(), &sluicev1.StatusRequest{})
		if err != nil || st.GetLeader() || st.GetLeaderAddr() != "other:7500" || len(st.GetRegions()) != 0 || len(st.GetKeys()) != 0 {
			t.Fatalf("status of a replica not leading: %v, %v; want the leader named and nothing else", st, err)
		}
		s.promote(1, time.Now().Add(time.Hour), nil)
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 7, Keys: []*sluicev1.KeyDemand{
			{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}, Admitted: 5, WindowMs: 100}}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
		st, err = s.Status(t.Context(), &sluicev1.StatusRequest{})
		if err != nil || !st.GetLeader() || st.GetLeaderAddr() != "self:7500" || len(st.GetRegions()) != 2 || len(st.GetKeys()) != 1 {
			t.Fatalf("the leader's status: %v, %v", st, err)
		}
		for _, r := range st.GetRegions() {
			want := struct {
				age int64
				seq uint64
			}{-1, 0}
			if r.GetRegion() == "a" {
				want.age, want.seq = 30, 7
			}
			if r.GetLastReportAgeMs() != want.age || r.GetLastSeq() != want.seq || r.GetReservedFraction() != 1 {
				t.Errorf("region %s: %v, want last report age %dms, seq %d, reserved fraction 1", r.GetRegion(), r, want.age, want.seq)
			}
		}
	})
}

// TestStatusNamesTheStoredInstantOfTheLastReport: every Status names the
// same instant for a region's last report, the one the allocator accepted
// it at, however later it is asked, while the age grows. sluicectl
// computed the instant from the age and its own clock, and showed a
// different millisecond on each call.
func TestStatusNamesTheStoredInstantOfTheLastReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newEdgeService(t)
		s.promote(1, time.Now().Add(time.Hour), nil)
		// Not on a whole millisecond: an instant computed from the age in
		// whole milliseconds and a later now falls on the next one.
		time.Sleep(900 * time.Microsecond)
		reported := time.Now()
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 7, Keys: []*sluicev1.KeyDemand{
			{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}, Admitted: 5, WindowMs: 100}}}); err != nil {
			t.Fatal(err)
		}
		for _, later := range []time.Duration{200 * time.Microsecond, 1754 * time.Microsecond, 5 * time.Second} {
			time.Sleep(later)
			st, err := s.Status(t.Context(), &sluicev1.StatusRequest{})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range st.GetRegions() {
				want := int64(0)
				if r.GetRegion() == "a" {
					want = reported.UnixMilli()
				}
				if r.GetLastReportUnixMs() != want {
					t.Errorf("asked %v later, region %s's last report at %d ms, want %d (age %d ms)",
						time.Since(reported), r.GetRegion(), r.GetLastReportUnixMs(), want, r.GetLastReportAgeMs())
				}
			}
		}
	})
}
