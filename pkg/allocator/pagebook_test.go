package allocator

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestDropStaleKeepsWhatIsExactlyMaxAgeOld: an epoch forgets the reports
// in progress started, and the paged answers kept, more than maxAge
// before now; what is exactly maxAge old or younger stays. The bytes
// counted held are those of the reports still in progress.
func TestDropStaleKeepsWhatIsExactlyMaxAgeOld(t *testing.T) {
	now := time.Unix(1000, 0)
	maxAge := 500 * time.Millisecond
	b := pageBook{
		inProgress: map[string]*assembly{
			"old":    {started: now.Add(-maxAge - time.Nanosecond), wire: 1, nkeys: 1},
			"edge":   {started: now.Add(-maxAge), wire: 10, nkeys: 2},
			"recent": {started: now.Add(-time.Millisecond), wire: 100, nkeys: 3},
		},
		answers: map[string]*pagedAnswer{
			"old":    {at: now.Add(-maxAge - time.Nanosecond)},
			"edge":   {at: now.Add(-maxAge)},
			"recent": {at: now},
		},
	}
	if got, want := b.heldBytes(), 111+6*heldBytesPerKey; got != want {
		t.Fatalf("held bytes %d before dropping, want %d", got, want)
	}
	b.dropStale(now, maxAge)
	want := []string{"edge", "recent"}
	if got := slices.Sorted(maps.Keys(b.inProgress)); !slices.Equal(got, want) {
		t.Errorf("reports in progress kept: %v, want %v", got, want)
	}
	if got := slices.Sorted(maps.Keys(b.answers)); !slices.Equal(got, want) {
		t.Errorf("answers kept: %v, want %v", got, want)
	}
	if got, want := b.heldBytes(), 110+5*heldBytesPerKey; got != want {
		t.Errorf("held bytes %d after dropping, want %d", got, want)
	}
}

// TestStepDropsPagesOlderThanAValidity: an epoch of the leader keeps the
// pages of a report started exactly one grant validity before and drops
// them once they are older; an epoch of a replica that does not lead
// drops every page held.
func TestStepDropsPagesOlderThanAValidity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newEdgeService(t)
		s.promote(1, time.Now().Add(time.Hour), nil)
		held := func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.pages.inProgress["a"] != nil
		}
		start := time.Now()
		if _, err := s.SyncPage(t.Context(), page(1, 0, 2, pkey(0))); err != nil {
			t.Fatal(err)
		}
		validity := 500 * time.Millisecond // loopConfig's grant_validity
		s.step(start.Add(validity))
		if !held() {
			t.Fatal("pages exactly one validity old dropped")
		}
		s.step(start.Add(validity + time.Nanosecond))
		if held() {
			t.Fatal("pages older than a validity kept")
		}
		if _, err := s.SyncPage(t.Context(), page(2, 0, 2, pkey(0))); err != nil {
			t.Fatal(err)
		}
		s.demote(1)
		s.step(time.Now())
		if held() {
			t.Fatal("a replica that no longer leads kept the pages")
		}
	})
}

// TestAnswerPagesCount: an answer of grants for twice the keys of a page
// comes in exactly two pages, one of a page and a key in three, the last
// holding the rest; each page carries its index, the count and the
// answer's seq, and a page past the last is refused.
func TestAnswerPagesCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := newService(serviceOptions{config: StaticConfig{C: parseConfig(t, fuzzConfig)}, advertise: "self:7500",
			maxKeys: 2, logger: slog.New(slog.DiscardHandler)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s.promote(1, time.Now().Add(time.Hour), nil)
		for _, c := range []struct {
			seq   uint64
			keys  int
			sizes []int
		}{{1, 4, []int{2, 2}}, {2, 5, []int{2, 2, 1}}} {
			keys := heldKeys(c.keys)
			var ans *sluicev1.RegionGrants
			for p := 0; p*2 < c.keys; p++ {
				if ans, err = s.SyncPage(t.Context(), page(c.seq, uint32(p), uint32(len(c.sizes)), keys[2*p:min(2*p+2, c.keys)]...)); err != nil {
					t.Fatalf("seq %d page %d: %v", c.seq, p, err)
				}
			}
			for p, size := range c.sizes {
				if p > 0 {
					if ans, err = s.SyncPage(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: c.seq, AnswerPage: uint32(p)}); err != nil {
						t.Fatalf("seq %d answer page %d: %v", c.seq, p, err)
					}
				}
				if ans.GetSeq() != c.seq || ans.GetPage() != uint32(p) || ans.GetPages() != uint32(len(c.sizes)) || len(ans.GetGrants()) != size {
					t.Fatalf("seq %d answer page %d: page %d of %d, seq %d, %d grants; want page %d of %d, %d grants",
						c.seq, p, ans.GetPage(), ans.GetPages(), ans.GetSeq(), len(ans.GetGrants()), p, len(c.sizes), size)
				}
				if want := fmt.Sprintf("p%d", 2*p); ans.GetGrants()[0].GetKey().GetTenant() != want {
					t.Fatalf("seq %d answer page %d starts with %v, want %s", c.seq, p, ans.GetGrants()[0].GetKey(), want)
				}
			}
			if _, err := s.SyncPage(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: c.seq, AnswerPage: uint32(len(c.sizes))}); status.Code(err) != codes.InvalidArgument {
				t.Fatalf("seq %d answer page %d, past the last: %v, want InvalidArgument", c.seq, len(c.sizes), err)
			}
		}
	})
}

// TestSyncPageRefusesAPagePastAOnePageReport: SyncPage takes page 0 of
// one page (or of none) as a whole report and refuses page 1 of one page
// with InvalidArgument, taking nothing.
func TestSyncPageRefusesAPagePastAOnePageReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newEdgeService(t)
		s.promote(1, time.Now().Add(time.Hour), nil)
		for seq, pages := range []uint32{0, 1} {
			if g, err := s.SyncPage(t.Context(), page(uint64(seq+1), 0, pages, pkey(0))); err != nil || g.GetSeq() != uint64(seq+1) || g.GetPagesReceived() != 0 {
				t.Fatalf("page 0 of %d pages: %v, %v; want it answered whole", pages, g, err)
			}
		}
		if _, err := s.SyncPage(t.Context(), page(3, 1, 1, pkey(0))); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("page 1 of 1 page: %v, want InvalidArgument", err)
		}
		if last, _ := s.alloc.LastSeq("a"); last != 2 {
			t.Fatalf("last seq %d after the refusal, want 2", last)
		}
	})
}
