package allocator

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestAcceptedConfigChangeLogsNoRefusal: a config change the allocator
// takes (a region's weight, then a tracked key's rate) is logged as a
// change, never as a refusal that keeps the previous regions or limits.
func TestAcceptedConfigChangeLogsNoRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, loopConfig), 1)
		s, logs := loggedService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		seq := uint64(0)
		sync := func() {
			t.Helper()
			seq++
			if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: seq,
				Keys: []*sluicev1.KeyDemand{{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}, Admitted: 5, WindowMs: 100}}}); err != nil {
				t.Fatal(err)
			}
		}
		sync()
		src.Set(parseConfig(t, strings.Replace(loopConfig, "a: {weight: 1}", "a: {weight: 3}", 1)), 2)
		sync()
		if got := logs.Count(`msg="regions changed"`); got != 1 {
			t.Fatalf("a weight change logged %d region changes, want 1:\n%s", got, logs)
		}
		src.Set(parseConfig(t, strings.Replace(strings.Replace(loopConfig, "a: {weight: 1}", "a: {weight: 3}", 1), "rate: 100/s", "rate: 200/s", 1)), 3)
		sync()
		if strings.Contains(logs.String(), "level=ERROR") || strings.Contains(logs.String(), "refused") {
			t.Fatalf("an accepted change logged as refused:\n%s", logs)
		}
		for _, kv := range s.View(time.Now()).Keys {
			if kv.Limit.Rate != 200 {
				t.Fatalf("key %v at rate %g after the change, want 200", kv.Key, kv.Limit.Rate)
			}
		}
	})
}

// liveOnlySource has Live but no Revision.
type liveOnlySource struct {
	cfg *config.Config
	rev int64
}

func (l liveOnlySource) Current() *config.Config       { return l.cfg }
func (l liveOnlySource) Live() (*config.Config, int64) { return l.cfg, l.rev }

// TestLiveSourceRevisionIsHeldFromTheStart: a source with Live and no
// Revision has its first config applied and held under the revision Live
// gives with it.
func TestLiveSourceRevisionIsHeldFromTheStart(t *testing.T) {
	s := quietService(t, liveOnlySource{cfg: parseConfig(t, loopConfig), rev: 7})
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, held := s.held[7]; s.appliedRev != 7 || !held || len(s.held) != 1 {
		t.Fatalf("applied revision %d, held %v: want revision 7 alone", s.appliedRev, s.held)
	}
}

// TestConfigNoHeardRegionRunsIsLetGo: once every region was heard from,
// an older config that none of them reports is no longer held, even when
// no revision is confirmed yet: a region none of whose revisions is held
// (here one that reports none) is reserved the largest share under the
// configs still in play, not under that older one.
func TestConfigNoHeardRegionRunsIsLetGo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		high := strings.Replace(loopConfig, "rate: 100/s", "rate: 200/s", 1)
		src := configtest.NewSource(parseConfig(t, high), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		src.Set(parseConfig(t, loopConfig), 2)
		limit := func() hierarchy.KeyLimit {
			t.Helper()
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
		if l := limit(); l.Rate != 100 || len(l.StaticRate) != 2 || l.StaticRate[1] < 99 {
			t.Fatalf("while b was not heard from: limit %+v, want rate 100 with b reserved revision 1's share (100 of 200)", l)
		}
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "b", Seq: 1}); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		_, held := s.held[1]
		s.mu.Unlock()
		if l := limit(); held || l.Rate != 100 || l.StaticRate != nil {
			t.Fatalf("once every region was heard from, none running revision 1: held %v, limit %+v, want revision 1 let go and no reserves", held, l)
		}
	})
}

// TestRebuildKeepsAStoredLapseUntilItIsRewritten: a region named in the
// lapsed set a replica read when it won, conferred a lease again since,
// stays in the set handed to an allocator rebuilt for a timing change
// until the set is written without it: the rebuilt allocator confers it
// no lease while it learns.
func TestRebuildKeepsAStoredLapseUntilItIsRewritten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := loopConfig + "region_lease: 2s\n"
		src := configtest.NewSource(parseConfig(t, base), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), []string{"a"})
		seq := uint64(0)
		syncA := func() *sluicev1.RegionGrants {
			t.Helper()
			seq++
			g, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: seq})
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		rebuildKeepsTheLapse(t, s, src, base, syncA)
	})
}
