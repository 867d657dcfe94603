package allocator

import (
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
)

// TestWrittenLapseIsLoggedOnceAndOutlivesARebuild: a lapse made durable
// is logged once, naming the region, not again when the same set is
// written once more; the region, conferred a lease again since, stays in
// the set handed to an allocator rebuilt for a timing change until the
// set is written without it, so the rebuilt allocator confers it no
// lease while it learns.
func TestWrittenLapseIsLoggedOnceAndOutlivesARebuild(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := loopConfig + "region_lease: 2s\n"
		src := configtest.NewSource(parseConfig(t, base), 1)
		s, logs := loggedService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		s.mu.Lock()
		after := s.lapseAfterLocked()
		s.mu.Unlock()
		epoch := 100 * time.Millisecond
		seq := map[string]uint64{}
		sync := func(region string) *sluicev1.RegionGrants {
			t.Helper()
			seq[region]++
			g, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: region, Seq: seq[region]})
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		// b reports every epoch; a stays silent until it lapses.
		start := time.Now()
		for time.Since(start) <= after+epoch {
			sync("b")
			time.Sleep(epoch)
		}
		plan := s.planLapses(time.Now())
		if !slices.Equal(plan.pending, []string{"a"}) {
			t.Fatalf("a silent for %v: planned %+v, want a pending", time.Since(start), plan)
		}
		const msg = `msg="region's static lease lapsed`
		s.lapsesWritten(time.Now(), plan)
		if n := logs.Count(msg); n != 1 || !strings.Contains(logs.String(), "region=a") {
			t.Fatalf("lapse logged %d times, want once naming a:\n%s", n, logs)
		}
		s.lapsesWritten(time.Now(), plan)
		if n := logs.Count(msg); n != 1 {
			t.Fatalf("lapse logged %d times after the same set was written again, want once:\n%s", n, logs)
		}
		rebuildKeepsTheLapse(t, s, src, base, func() *sluicev1.RegionGrants { return sync("a") })
	})
}

// rebuildKeepsTheLapse checks, in a synctest bubble, that region a, in the
// lapsed set the allocator was given, is conferred a lease again within
// half a second and an epoch of syncA's reports, is then lapsed no more in
// the allocator, and is conferred none by the allocator rebuilt for a
// timing change (base's region_lease of 2s made 3s) while it learns: the
// stored set, not yet rewritten, still names it.
func rebuildKeepsTheLapse(t *testing.T, s *Service, src *configtest.Source, base string, syncA func() *sluicev1.RegionGrants) {
	t.Helper()
	const epoch = 100 * time.Millisecond // loopConfig's
	back := time.Now()
	for syncA().GetStaticLeaseMs() == 0 {
		if time.Since(back) > 500*time.Millisecond+epoch {
			t.Fatalf("a not conferred a lease %v after it came back", time.Since(back))
		}
		time.Sleep(epoch)
	}
	if st := s.alloc.LapsedSet(); len(st) != 0 {
		t.Fatalf("allocator holds %v lapsed once a was conferred a lease, want none", st)
	}
	src.Set(parseConfig(t, strings.Replace(base, "region_lease: 2s", "region_lease: 3s", 1)), 2)
	if g := syncA(); g.GetStaticLeaseMs() != 0 || !g.GetLearning() {
		t.Fatalf("rebuilt allocator answered a with a %d ms lease (learning %v); want none while it learns, a still in the stored set",
			g.GetStaticLeaseMs(), g.GetLearning())
	}
}
