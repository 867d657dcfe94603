package allocator

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// revisionSource is a ConfigSource with a revision but no Live: the
// config and its revision are read one after the other. A nil config
// stands for a source that has none to give.
type revisionSource struct {
	mu  sync.Mutex
	cfg *config.Config
	rev int64
}

func (r *revisionSource) Current() *config.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg
}

func (r *revisionSource) Revision() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rev
}

func (r *revisionSource) set(cfg *config.Config, rev int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cfg, r.rev = cfg, rev
}

// TestConfigOfASourceWithOnlyARevision: a source with Revision but no
// Live has each config it hands out held under its revision, the old one
// kept while a region was not heard from; a source that has no config
// any more leaves the one applied in force. A source without revisions
// has every config at revision 0: a new one replaces the old, and one
// config is in play.
func TestConfigOfASourceWithOnlyARevision(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first := parseConfig(t, loopConfig)
		src := &revisionSource{cfg: first, rev: 5}
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		second := parseConfig(t, strings.Replace(loopConfig, "rate: 100/s", "rate: 200/s", 1))
		src.set(second, 7)
		s.step(time.Now())
		state := func() (*config.Config, int64, []int64) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.applied, s.appliedRev, slices.Sorted(maps.Keys(s.held))
		}
		if cfg, rev, held := state(); cfg != second || rev != 7 || !slices.Equal(held, []int64{5, 7}) {
			t.Fatalf("after revision 7: applied the second config %v, revision %d, held %v; want true, 7, [5 7]", cfg == second, rev, held)
		}
		src.set(nil, 8)
		s.step(time.Now())
		if cfg, rev, held := state(); cfg != second || rev != 7 || !slices.Equal(held, []int64{5, 7}) {
			t.Fatalf("after the source lost its config: applied the second config %v, revision %d, held %v; want true, 7, [5 7]", cfg == second, rev, held)
		}

		mem := &memConfig{cfg: first}
		s = quietService(t, mem)
		s.promote(1, time.Now().Add(time.Hour), nil)
		mem.set(second)
		s.step(time.Now())
		if cfg, rev, held := state(); cfg != second || rev != 0 || !slices.Equal(held, []int64{0}) {
			t.Fatalf("a source without revisions, after a change: applied the second config %v, revision %d, held %v; want true, 0, [0]", cfg == second, rev, held)
		}
	})
}

// TestTimingChangeRebuildsTheAllocatorLearning: a config change of the
// epoch and the grant validity rebuilds the allocator, which learns until
// at least one old validity and one old epoch after the change (grants
// issued under the old validity, and a previous leader that saw the
// change later), and which is given the lapsed set read from the store
// and the regions the old allocator counted at their floor. The keys the
// old allocator held are held by the new one, named at the change.
func TestTimingChangeRebuildsTheAllocatorLearning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, loopConfig), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(24*time.Hour), []string{"a"})
		// Region b not heard from for long past its lease: counted at its
		// floor by the old allocator only.
		time.Sleep(time.Hour)
		if ok, err := s.alloc.LapseDurable(time.Now(), "b"); !ok || err != nil {
			t.Fatalf("lapse of b: %v, %v", ok, err)
		}
		if _, err := s.Sync(t.Context(), writeReport("a", 1)); err != nil {
			t.Fatal(err)
		}
		old := s.alloc
		src.Set(parseConfig(t, strings.Replace(strings.Replace(loopConfig, "epoch: 100ms", "epoch: 50ms", 1),
			"grant_validity: 500ms", "grant_validity: 200ms", 1)), 2)
		changed := time.Now()
		s.step(changed)
		if got := s.alloc.LapsedSet(); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("lapsed set of the rebuilt allocator %v, want [a b]", got)
		}
		acme := quota.Key{Tenant: "acme", Class: "write"}
		if s.alloc == old {
			t.Fatal("the allocator was not rebuilt")
		}
		if at, ok := s.alloc.LastNamed(acme); !ok || !at.Equal(changed) {
			t.Fatalf("the reported key in the rebuilt allocator: %v (held %v), want named at the change %v", at, ok, changed)
		}
		if keys := s.alloc.Keys(); len(keys) != 1 {
			t.Fatalf("the rebuilt allocator holds %v, want only %s", keys, acme)
		}
		// The old validity (500ms) and epoch (100ms) bound learning, not
		// the new validity (200ms).
		floor := changed.Add(600 * time.Millisecond)
		if !s.learnFloor.Equal(floor) {
			t.Fatalf("learning until at least %v after the change, want %v", s.learnFloor.Sub(changed), floor.Sub(changed))
		}
		time.Sleep(590 * time.Millisecond)
		s.step(time.Now())
		if !s.View(time.Now()).Learning {
			t.Fatal("the rebuilt allocator stopped learning before one old validity and epoch had passed")
		}
	})
}

// threeRegionsConfig: weights 2:1:1, one key class at 400/s, burst 400.
const threeRegionsConfig = `
epoch: 1s
grant_validity: 5s
regions:
  ap: {weight: 2}
  eu: {weight: 1}
  us: {weight: 1}
classes:
  write: {}
tiers:
  free: {write: {rate: 400/s, burst: 400}}
default_tier: free
`

// TestRebuildKeepsGrantsAboveStaticToTheirExpiry: a config change from
// epoch 1s / validity 5s to 500ms / 2s rebuilds the allocator in learning
// mode while ap and eu hold grants above their static shares (200/s and
// 100/s) with more than 2s left. Each echo is re-issued with the expiry
// the region holds, not cut to the new 2s validity, so both keep their
// grants until then; us, below its share (paying for theirs), keeps its
// expiry too and is extended to the new 2s validity once less is left.
// Every region runs
// the same report cycle, applying each answer as a region does (the grant
// counts from the report's send time), and the rates in force never sum
// past the key's 400/s.
func TestRebuildKeepsGrantsAboveStaticToTheirExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, threeRegionsConfig), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		type grant struct {
			rate, burst float64
			expiry      time.Time
		}
		static := map[string]float64{"ap": 200, "eu": 100, "us": 100}
		demandOf := map[string]int64{"ap": 300, "eu": 150, "us": 60}
		held := map[string]grant{}
		var seq uint64
		cycle := func(window time.Duration) {
			s.step(time.Now())
			for _, r := range []string{"ap", "eu", "us"} {
				now := time.Now()
				kd := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: "t1", Class: "write"}, Admitted: demandOf[r] * window.Milliseconds() / 1000, WindowMs: window.Milliseconds(), Holding: 10}
				if g, ok := held[r]; ok && g.expiry.After(now) {
					kd.HeldRate, kd.HeldBurst, kd.HeldValidMs = g.rate, g.burst, g.expiry.Sub(now).Milliseconds()
				}
				seq++
				resp, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: r, Seq: seq, Keys: []*sluicev1.KeyDemand{kd}})
				if err != nil {
					t.Fatalf("%s report %d: %v", r, seq, err)
				}
				for _, g := range resp.GetGrants() {
					held[r] = grant{g.GetRate(), g.GetBurst(), now.Add(time.Duration(g.GetValidMs()) * time.Millisecond)}
				}
			}
			var sum float64
			for r, g := range held {
				if g.expiry.After(time.Now()) {
					sum += g.rate
				} else {
					sum += static[r]
				}
			}
			if sum > 400*(1+1e-9) {
				t.Fatalf("rates in force sum to %v, above the key's 400/s: %+v", sum, held)
			}
		}
		// Under 1s / 5s, reporting twice an epoch, until ap and eu hold
		// grants above their shares.
		for i := range 16 {
			if i > 0 {
				time.Sleep(500 * time.Millisecond)
			}
			cycle(500 * time.Millisecond)
		}
		for r, g := range map[string]grant{"ap": held["ap"], "eu": held["eu"]} {
			if g.rate <= static[r] || g.expiry.Sub(time.Now()) <= 2*time.Second {
				t.Fatalf("before the change %s holds %v for %v more; want above %v for more than the new 2s validity", r, g.rate, g.expiry.Sub(time.Now()), static[r])
			}
		}
		before := maps.Clone(held)
		src.Set(parseConfig(t, strings.Replace(strings.Replace(threeRegionsConfig, "epoch: 1s", "epoch: 500ms", 1),
			"grant_validity: 5s", "grant_validity: 2s", 1)), 2)
		changed := time.Now()
		// Each region reports every 500ms from here, the first at the
		// change; the old grants end before learning does (one old
		// validity and epoch).
		for time.Now().Before(before["ap"].expiry) {
			cycle(500 * time.Millisecond)
			if !s.View(time.Now()).Learning {
				t.Fatalf("%v after the change: not learning", time.Since(changed))
			}
			for _, r := range []string{"ap", "eu"} {
				g := held[r]
				if g.rate > before[r].rate || !nearRate(g.rate, before[r].rate) || g.expiry.After(before[r].expiry) || g.expiry.Before(before[r].expiry.Add(-time.Millisecond)) {
					t.Fatalf("%v after the change %s holds %v until %v after the change; want its %v re-issued until %v after it",
						time.Since(changed), r, g.rate, g.expiry.Sub(changed), before[r].rate, before[r].expiry.Sub(changed))
				}
			}
			if g := held["us"]; g.rate > before["us"].rate || !nearRate(g.rate, before["us"].rate) || !g.expiry.Equal(later(before["us"].expiry, time.Now().Add(2*time.Second))) {
				t.Fatalf("%v after the change us holds %v for %v more; want its %v until %v after the change or for 2s, whichever is later",
					time.Since(changed), g.rate, g.expiry.Sub(time.Now()), before["us"].rate, before["us"].expiry.Sub(changed))
			}
			time.Sleep(500 * time.Millisecond)
		}
	})
}

// nearRate: a re-issued grant's values are the held ones, nudged down by a
// few float steps to tell candidates apart.
func nearRate(got, want float64) bool { return got <= want && got >= want*(1-1e-12) }

// TestRegionKeptByAConfigChangeKeepsItsReportedRevisions: a config change
// that keeps a region keeps what it reported: b reported only revision 1
// (a static share of 50/s), so once revision 2 gives it 75/s the global
// tier still reserves b 50/s, not the larger share of a region it never
// heard from; a, reporting 1 and 2, is reserved the smaller of its shares.
func TestRegionKeptByAConfigChangeKeepsItsReportedRevisions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, loopConfig), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		acme := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}, Admitted: 5, WindowMs: 100}
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "b", Seq: 1, ConfigRevisions: []int64{1}}); err != nil {
			t.Fatal(err)
		}
		src.Set(parseConfig(t, strings.Replace(loopConfig, "b: {weight: 1}", "b: {weight: 3}", 1)), 2)
		s.step(time.Now())
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 1, ConfigRevisions: []int64{1, 2},
			Keys: []*sluicev1.KeyDemand{acme}}); err != nil {
			t.Fatal(err)
		}
		l, ok := limitOf(s, quota.Key{Tenant: "acme", Class: "write"})
		want := []float64{25, 50}
		if !ok || !slices.EqualFunc(l.StaticRate, want, func(got, want float64) bool { return math.Abs(got-want) < 1e-6 }) {
			t.Fatalf("static reserves of a and b %v (tracked %v), want %v", l.StaticRate, ok, want)
		}
	})
}

// TestHeldConfigsAreTheNewestUpToTheBound: while a region not heard from
// may run any of them, the configs held are the newest maxHeldConfigs
// (twice the revisions a report carries), the live one among them.
func TestHeldConfigsAreTheNewestUpToTheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, loopConfig), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		const last = 2*regionsync.MaxConfigs + 4
		for rev := int64(2); rev <= last; rev++ {
			src.Set(parseConfig(t, strings.Replace(loopConfig, "rate: 100/s", fmt.Sprintf("rate: %d/s", 100+rev), 1)), rev)
			s.step(time.Now())
		}
		var want []int64
		for rev := int64(last - 2*regionsync.MaxConfigs + 1); rev <= last; rev++ {
			want = append(want, rev)
		}
		if got := slices.Sorted(maps.Keys(s.held)); !slices.Equal(got, want) {
			t.Fatalf("configs held %v, want %v", got, want)
		}
	})
}

// TestLiveConfigIsHeldBeforeAnyRegionReportsIt: the live config stays
// held while every region still reports only the one before it, so a
// tracked key carries reserves for both until the regions move on.
func TestLiveConfigIsHeldBeforeAnyRegionReportsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, loopConfig), 1)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		acme := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}, Admitted: 5, WindowMs: 100}
		for _, region := range []string{"a", "b"} {
			if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: region, Seq: 1, ConfigRevisions: []int64{1},
				Keys: []*sluicev1.KeyDemand{acme}}); err != nil {
				t.Fatal(err)
			}
		}
		src.Set(parseConfig(t, strings.Replace(loopConfig, "rate: 100/s", "rate: 200/s", 1)), 2)
		s.step(time.Now())
		if got := slices.Sorted(maps.Keys(s.held)); !slices.Equal(got, []int64{1, 2}) {
			t.Fatalf("configs held %v, want [1 2]", got)
		}
		if l, ok := limitOf(s, quota.Key{Tenant: "acme", Class: "write"}); !ok || l.Rate != 200 || len(l.StaticRate) != 2 {
			t.Fatalf("limit %+v (tracked %v), want rate 200 with reserves for 2 regions", l, ok)
		}
	})
}

// TestRaisedValidityLearnsOneNewValidityAndLogsIt: raising the epoch and
// the grant validity (200ms/1s to 500ms/3s) keeps the rebuilt allocator
// learning for one new validity, past one old validity and epoch (a
// previous leader that applied the change first may have issued grants
// of the new validity), and the log names that end, not the old one's.
func TestRaisedValidityLearnsOneNewValidityAndLogsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fast := strings.Replace(strings.Replace(loopConfig, "epoch: 100ms", "epoch: 200ms", 1), "grant_validity: 500ms", "grant_validity: 1s", 1)
		slow := strings.Replace(strings.Replace(loopConfig, "epoch: 100ms", "epoch: 500ms", 1), "grant_validity: 500ms", "grant_validity: 3s", 1)
		src := configtest.NewSource(parseConfig(t, fast), 1)
		s, logs := loggedService(t, src)
		s.promote(1, time.Now().Add(24*time.Hour), nil)
		time.Sleep(time.Hour)
		s.step(time.Now())
		src.Set(parseConfig(t, slow), 2)
		changed := time.Now()
		s.step(changed)
		end := changed.Add(3 * time.Second)
		if want := "learning_until_at_least=" + end.Format("2006-01-02T15:04:05.000Z07:00"); !strings.Contains(logs.String(), want) {
			t.Fatalf("rebuild log lacks %s:\n%s", want, logs)
		}
		time.Sleep(3*time.Second - time.Millisecond)
		s.step(time.Now())
		if !s.View(time.Now()).Learning {
			t.Fatal("learning ended before one new validity")
		}
		time.Sleep(time.Millisecond + 500*time.Millisecond)
		s.step(time.Now())
		if s.View(time.Now()).Learning {
			t.Fatal("learning lasted past one new validity and one epoch")
		}
	})
}
