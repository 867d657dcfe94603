package regionsync

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestFreshWatchReadsOnlyWhenTheSetGrew: the first look only records; a
// look reads the marks, from the last look's time, only when the set has
// more members than then; a reset starts over.
func TestFreshWatchReadsOnlyWhenTheSetGrew(t *testing.T) {
	var f FreshWatch
	steps := []struct {
		card, nowUS int64
		read        bool
		since       int64
	}{
		{10, 1_000, false, 0},      // first look
		{10, 2_000, false, 0},      // marked again, none added
		{11, 3_000, true, 2_000},   // one added since the look at 2,000
		{9, 4_000, false, 0},       // an epoch report trimmed
		{9, 5_000, false, 0},       //
		{10, 6_000, true, 5_000},   //
		{12, 7_000, true, 6_000},   // two more
		{12, 8_000, false, 0},      //
		{13, 9_000, true, 8_000},   //
		{13, 10_000, false, 0},     //
		{20, 11_000, true, 10_000}, //
	}
	for i, s := range steps {
		read, since := f.Look(s.card, s.nowUS)
		if read != s.read || (read && since != s.since) {
			t.Fatalf("look %d (%d members at %d): read %v since %d, want %v since %d", i, s.card, s.nowUS, read, since, s.read, s.since)
		}
	}
	f.Reset()
	if read, _ := f.Look(100, 12_000); read {
		t.Fatal("the first look after a reset read the marks")
	}
}

// TestFreshKeysAreNeitherReportedNorWatched: of the keys marked since the
// last look, those the last report named (selected) or the leader watches
// are not fresh; each fresh key once, at most MaxWatched, in the marks'
// order.
func TestFreshKeysAreNeitherReportedNorWatched(t *testing.T) {
	now := int64(1_700_000_000_000_000)
	key := func(i int) quota.Key { return quota.Key{Tenant: fmt.Sprintf("t%04d", i), Class: "write"} }
	read := func(k quota.Key, demand float64) KeyRead {
		return KeyRead{Key: k, StaticRate: 300, State: luascripts.State{Rate: 300, Cap: 300, LeaseDemand: demand, NowUS: now}}
	}
	l := NewLeader()
	// key(0) is watched (demand at half the share), key(1) reported but
	// not watched (its demand is low).
	l.Report("ap", now, time.Second, Epoch, []KeyRead{read(key(0), 200), read(key(1), 80)})
	got := l.Fresh([]quota.Key{key(0), key(2), key(1), key(3), key(2)})
	if want := []quota.Key{key(2), key(3)}; !slices.Equal(got, want) {
		t.Fatalf("fresh %v, want %v", got, want)
	}
	// A watched key is one of the last report's, so it is selected too;
	// should its selection lapse first, it is still not fresh: the watch
	// reads it anyway.
	delete(l.sel, key(0))
	if got := l.Fresh([]quota.Key{key(0), key(4)}); !slices.Equal(got, []quota.Key{key(4)}) {
		t.Fatalf("fresh %v with %v watched but no longer selected, want only %v", got, key(0), key(4))
	}
	many := make([]quota.Key, MaxWatched+10)
	for i := range many {
		many[i] = key(10 + i)
	}
	if got := l.Fresh(many); len(got) != MaxWatched || got[0] != many[0] || got[MaxWatched-1] != many[MaxWatched-1] {
		t.Fatalf("fresh of %d marks: %d keys, want the first %d", len(many), len(got), MaxWatched)
	}
	// A fresh key is judged as a rise from nothing: above the rate it
	// refills at by the usual margins.
	if rose, _ := l.Moved(time.Second, []KeyRead{read(key(2), 900)}); !rose {
		t.Fatal("a fresh key asking three times its static rate did not rise")
	}
	if rose, _ := l.Moved(time.Second, []KeyRead{read(key(3), 250)}); rose {
		t.Fatal("a fresh key within its static rate rose")
	}
}
