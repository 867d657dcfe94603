package configstore

import (
	"errors"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/pkg/config"
)

// TestAtReadsTheConfigOfAnEarlierRevision: At hands out the config a
// revision committed, read at that revision, and once etcd compacted it,
// at the revision just before the next config's commit (the way a process
// restarted onto a new config reads the one last confirmed to its
// region); once that is compacted too, an error wrapping ErrHistoryGone.
// A revision that did not write the config is an error of another kind.
func TestAtReadsTheConfigOfAnEarlierRevision(t *testing.T) {
	cli, store, ctx := newStore(t)
	revA, err := store.Apply(ctx, withReadRate(100), 0)
	if err != nil {
		t.Fatal(err)
	}
	other, err := cli.Put(ctx, "/elsewhere", "x") // a revision between the two configs
	if err != nil {
		t.Fatal(err)
	}
	revB, err := store.Apply(ctx, withReadRate(200), revA)
	if err != nil {
		t.Fatal(err)
	}
	at := func(step string, rev int64, want config.Rate) {
		t.Helper()
		c, err := store.At(ctx, rev)
		if err != nil {
			t.Fatalf("%s: At(%d): %v", step, rev, err)
		}
		if got := readRate(c); got != want {
			t.Fatalf("%s: At(%d) has read rate %v, want %v", step, rev, got, want)
		}
	}
	at("nothing compacted", revA, 100)
	at("nothing compacted", revB, 200)
	if _, err := store.At(ctx, other.Header.Revision); err == nil || errors.Is(err, ErrHistoryGone) {
		t.Fatalf("At(%d), a revision that wrote no config: %v, want an error not wrapping ErrHistoryGone", other.Header.Revision, err)
	}

	if _, err := cli.Compact(ctx, revB-1); err != nil { // revA is gone, revB-1 still readable
		t.Fatal(err)
	}
	at("revision A compacted", revA, 100)

	after, err := cli.Put(ctx, "/elsewhere", "y")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, after.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if _, err := store.At(ctx, revA); !errors.Is(err, ErrHistoryGone) {
		t.Fatalf("At(%d) with every revision before %d compacted: %v, want ErrHistoryGone", revA, after.Header.Revision, err)
	}
	at("revision B compacted but still the committed config", revB, 200)
}

// TestHistoryReadsTheConfigsCommittedSince: RevisionsBetween lists the
// revisions that committed a config strictly between two revisions, the
// newest max of them, oldest first; a Watcher's History reads the config
// of the first revision and those after it, before the last.
func TestHistoryReadsTheConfigsCommittedSince(t *testing.T) {
	cli, store, ctx := newStore(t)
	var revs []int64
	prev := int64(0)
	for i, r := range []config.Rate{100, 200, 300, 400} {
		rev, err := store.Apply(ctx, withReadRate(r), prev)
		if err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			if _, err := cli.Put(ctx, "/elsewhere", "x"); err != nil {
				t.Fatal(err)
			}
		}
		revs, prev = append(revs, rev), rev
	}
	a, b, c, d := revs[0], revs[1], revs[2], revs[3]
	for _, tc := range []struct {
		from, until int64
		max         int
		want        []int64
	}{
		{a, d, 10, []int64{b, c}},
		{a, d, 1, []int64{c}},
		{a, b, 10, nil},
		{b, d + 1, 10, []int64{c, d}},
	} {
		got, err := store.RevisionsBetween(ctx, tc.from, tc.until, tc.max)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("RevisionsBetween(%d, %d, %d) = %v, %v; want %v", tc.from, tc.until, tc.max, got, err, tc.want)
		}
	}
	w := NewWatcher(store, nil, nil, nil)
	// More committed since than read: the newest are read, and History
	// says the older ones were left out (a caller warns: a confirmation of
	// one of them does not bound it).
	for _, tc := range []struct {
		max       int
		want      []config.Rate
		truncated bool
	}{{3, []config.Rate{100, 200, 300}, false}, {2, []config.Rate{100, 300}, true}, {1, []config.Rate{100}, true}} {
		h, err := w.History(ctx, a, d, tc.max)
		if tc.truncated != errors.Is(err, ErrHistoryTruncated) || (err != nil && !tc.truncated) {
			t.Fatalf("History(%d, %d, %d): error %v; want one wrapping ErrHistoryTruncated: %v", a, d, tc.max, err, tc.truncated)
		}
		var got []config.Rate
		for _, e := range h {
			got = append(got, readRate(e.Cfg))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("History(%d, %d, %d) has read rates %v, want %v", a, d, tc.max, got, tc.want)
		}
	}
}
