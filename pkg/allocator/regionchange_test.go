package allocator

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestRegionChangeReachesTheAllocator: a config change that keeps the
// epoch and validity but changes a region's weight, replaces a region by
// one of another name, or adds one, reaches the allocator's regions.
func TestRegionChangeReachesTheAllocator(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, loopConfig), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		regions := func() string {
			s.step(time.Now())
			var out []string
			for _, r := range s.View(time.Now()).Regions {
				out = append(out, fmt.Sprintf("%s:%g", r.Name, r.Weight))
			}
			return strings.Join(out, " ")
		}
		if got := regions(); got != "a:1 b:1" {
			t.Fatalf("regions %s, want a:1 b:1", got)
		}
		src.Set(parseConfig(t, strings.Replace(loopConfig, "a: {weight: 1}", "a: {weight: 3}", 1)), 2)
		if got := regions(); got != "a:3 b:1" {
			t.Fatalf("after a's weight changed: regions %s, want a:3 b:1", got)
		}
		src.Set(parseConfig(t, strings.Replace(loopConfig, "b: {weight: 1}", "c: {weight: 1}", 1)), 3)
		if got := regions(); got != "a:1 c:1" {
			t.Fatalf("after b was replaced by c: regions %s, want a:1 c:1", got)
		}
		src.Set(parseConfig(t, strings.Replace(loopConfig, "b: {weight: 1}", "b: {weight: 1}\n  c: {weight: 1}", 1)), 4)
		if got := regions(); got != "a:1 b:1 c:1" {
			t.Fatalf("after b came back beside c: regions %s, want a:1 b:1 c:1", got)
		}
	})
}

// TestReservesEndWithTheOldConfig: while a region may still run an older
// revision a tracked key's limit carries per-region reserves; a report
// that confirms the new revision to every region (naming no key) takes
// the older config out of play and every tracked key back to the new
// config's plain limit.
func TestReservesEndWithTheOldConfig(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, loopConfig), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		src.Set(parseConfig(t, strings.Replace(loopConfig, "rate: 100/s", "rate: 200/s", 1)), 2)
		limit := func() hierarchy.KeyLimit {
			for _, kv := range s.View(time.Now()).Keys {
				if kv.Key == (quota.Key{Tenant: "acme", Class: "write"}) {
					return kv.Limit
				}
			}
			t.Fatal("acme/write not in the view")
			return hierarchy.KeyLimit{}
		}
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 1, ConfigRevisions: []int64{2},
			Keys: []*sluicev1.KeyDemand{{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}, Admitted: 5, WindowMs: 100}}}); err != nil {
			t.Fatal(err)
		}
		if l := limit(); l.Rate != 200 || len(l.StaticRate) != 2 {
			t.Fatalf("while b may run revision 1: limit %+v, want rate 200 with reserves for 2 regions", l)
		}
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "b", Seq: 1, ConfigRevisions: []int64{2}}); err != nil {
			t.Fatal(err)
		}
		if l := limit(); l.Rate != 200 || l.StaticRate != nil || l.FloorRate != nil {
			t.Fatalf("once every region runs revision 2: limit %+v, want rate 200 without reserves", l)
		}
	})
}
