package allocator

import (
	"log/slog"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestLapsedKeyTrimsThePrefix: the lapsed set's key is the prefix (the
// default one when empty) without trailing slashes, then /global/lapsed.
func TestLapsedKeyTrimsThePrefix(t *testing.T) {
	for prefix, want := range map[string]string{
		"":       "/sluice/global/lapsed",
		"/x":     "/x/global/lapsed",
		"/x/":    "/x/global/lapsed",
		"/x//":   "/x/global/lapsed",
		"/a/b/":  "/a/b/global/lapsed",
		"/":      "/global/lapsed",
		"x/y":    "x/y/global/lapsed",
		"/x/y//": "/x/y/global/lapsed",
	} {
		if got := LapsedKey(prefix); got != want {
			t.Errorf("LapsedKey(%q) = %q, want %q", prefix, got, want)
		}
	}
}

// TestLapsePlanWritesOnlyWhatChanged: a leader plans a write of the
// lapsed set when a region has been silent for longer than region_lease +
// validity + margin (that region pending, the set what the allocator
// keeps plus it, each region once); once written, the region is counted at
// its floor and nothing more is written while the set is as stored; once
// the region is conferred a lease again the set without it is written. A
// replica that does not lead plans nothing.
func TestLapsePlanWritesOnlyWhatChanged(t *testing.T) {
	for _, stored := range [][]string{nil, {"a"}} {
		synctest.Test(t, func(t *testing.T) {
			cfg := parseConfig(t, loopConfig+"region_lease: 2s\n")
			s, err := newService(serviceOptions{config: StaticConfig{C: cfg}, advertise: "self:7500",
				logger: slog.New(slog.DiscardHandler)}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if plan := s.planLapses(time.Now()); plan.write || plan.pending != nil || plan.set != nil {
				t.Fatalf("stored %v: a replica not leading plans %+v", stored, plan)
			}
			s.promote(1, time.Now().Add(time.Hour), stored)
			s.mu.Lock()
			after := s.lapseAfterLocked()
			s.mu.Unlock()
			epoch := 100 * time.Millisecond
			start := time.Now()
			seq := uint64(0)
			// b reports every epoch; a stays silent.
			for time.Since(start) <= after+epoch {
				seq++
				if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "b", Seq: seq}); err != nil {
					t.Fatal(err)
				}
				if time.Since(start) < after {
					if plan := s.planLapses(time.Now()); plan.write || len(plan.pending) != 0 || !slices.Equal(plan.set, stored) {
						t.Fatalf("stored %v: planned %+v after %v of silence (lapse after %v)", stored, plan, time.Since(start), after)
					}
				}
				time.Sleep(epoch)
			}
			// Past its leadership's deadline it plans nothing, a pending.
			if plan := s.planLapses(time.Now().Add(time.Hour)); plan.write || plan.pending != nil || plan.set != nil {
				t.Fatalf("stored %v: past its deadline the replica planned %+v", stored, plan)
			}
			plan := s.planLapses(time.Now())
			if !plan.write || !slices.Equal(plan.pending, []string{"a"}) || !slices.Equal(plan.set, []string{"a"}) {
				t.Fatalf("stored %v: a silent for %v planned %+v, want a pending and the set [a] written", stored, time.Since(start), plan)
			}
			s.lapsesWritten(time.Now(), plan)
			if st := s.alloc.LapsedSet(); !slices.Equal(st, []string{"a"}) {
				t.Fatalf("stored %v: lapsed set %v after the write, want [a]", stored, st)
			}
			if plan := s.planLapses(time.Now()); plan.write || len(plan.pending) != 0 {
				t.Fatalf("stored %v: planned %+v with the set as stored", stored, plan)
			}
			// a reports again: returning, it is conferred a lease at the
			// latest once every grant issued while it was lapsed has expired
			// (at once here: no key has a fence), and leaves the set with the
			// next write.
			back := time.Now()
			for {
				seq++
				g, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: seq})
				if err != nil {
					t.Fatal(err)
				}
				if g.GetStaticLeaseMs() > 0 {
					break
				}
				if time.Since(back) > 500*time.Millisecond+epoch { // the grant validity and an epoch
					t.Fatalf("stored %v: a not conferred a lease %v after it came back", stored, time.Since(back))
				}
				time.Sleep(epoch)
			}
			if plan := s.planLapses(time.Now()); !plan.write || len(plan.pending) != 0 || len(plan.set) != 0 {
				t.Fatalf("stored %v: planned %+v once a was conferred a lease, want the empty set written", stored, plan)
			}
		})
	}
}

// TestLapsePlanIgnoresTheStoredOrder: a stored set that names the regions
// the allocator holds lapsed, in another order, is as stored: nothing is
// planned; a stored set naming a region the allocator does not hold is
// written without it.
func TestLapsePlanIgnoresTheStoredOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, c := range []struct {
			stored []string
			write  bool
			set    []string
		}{
			{[]string{"b", "a"}, false, []string{"a", "b"}},
			{[]string{"a", "b"}, false, []string{"a", "b"}},
			{[]string{"b", "gone", "a"}, true, []string{"a", "b"}},
		} {
			s := newEdgeService(t)
			s.promote(1, time.Now().Add(time.Hour), c.stored)
			plan := s.planLapses(time.Now())
			if plan.write != c.write || len(plan.pending) != 0 || !slices.Equal(plan.set, c.set) {
				t.Errorf("stored %v: planned %+v, want write %v of %v", c.stored, plan, c.write, c.set)
			}
		}
	})
}

// TestShardOutOfTheConfigLapsesNoRegion: no region reports to a shard the
// live config's map leaves out, so its silence says nothing of them: past
// the lapse time such a shard plans no lapse, where one in the map plans
// both silent regions'.
func TestShardOutOfTheConfigLapsesNoRegion(t *testing.T) {
	for _, tc := range []struct {
		shard int
		want  []string
	}{{0, []string{"a", "b"}}, {2, nil}} {
		synctest.Test(t, func(t *testing.T) {
			cfg := parseConfig(t, loopConfig+"region_lease: 2s\nglobal_shards: 2\n")
			s, err := newService(serviceOptions{config: StaticConfig{C: cfg}, advertise: "self:7500",
				logger: slog.New(slog.DiscardHandler)}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			s.sh.index = tc.shard
			s.promote(1, time.Now().Add(time.Hour), nil)
			s.mu.Lock()
			after := s.lapseAfterLocked()
			s.mu.Unlock()
			time.Sleep(after + time.Millisecond) // the fake clock of the bubble
			if plan := s.planLapses(time.Now()); !slices.Equal(plan.pending, tc.want) {
				t.Fatalf("shard %d of 2, every region silent for %v: planned %+v, want pending %v", tc.shard, after, plan, tc.want)
			}
		})
	}
}
