package allocator

import (
	"maps"
	"slices"
	"testing"
	"testing/synctest"
	"time"
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
