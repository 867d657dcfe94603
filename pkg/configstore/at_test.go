package configstore

import (
	"errors"
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
