package allocator

import (
	"math"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
)

// TestFreshReplicaLearnsTheLongerValidityCommittedBeforeItStarted: the
// config was changed from a 3 s grant validity to 500 ms just before this
// replica started, so the leader that ran the old config may have issued
// grants of 3 s that regions still hold. A replica that watched the change
// rebuilt its allocator (PriorValidity, learning floor); one that started
// after it only reads the live config. Leading, it must still learn until
// one old validity and one old epoch after it started, and re-issue a held
// grant with what it has left, not cut to 500 ms: a region silent to it
// may hold such a grant, and a grant cut short leaves its region on its
// static share beside it (docs/architecture.md, failure table, "epoch or
// grant validity changed").
func TestFreshReplicaLearnsTheLongerValidityCommittedBeforeItStarted(t *testing.T) {
	srv := etcdtest.Start(t)
	store := configstore.NewStore(srv.Client(t), "/test")
	long := parseConfig(t, strings.Replace(strings.Replace(loopConfig, "grant_validity: 500ms", "grant_validity: 3s", 1),
		"epoch: 100ms", "epoch: 200ms", 1))
	short := parseConfig(t, loopConfig)
	revs := applyAll(t, store, long, short)
	started := time.Now()
	d, _ := startLoggedLeader(t, srv, short, revs[1])
	s := d.Service
	// The floor is counted from the replica's start, which came after the
	// change was committed: a grant of the old validity ends before it.
	floor := started.Add(3*time.Second + 200*time.Millisecond)
	// a holds 80/s of the 100/s key (its static share is 50/s) for 2.5 s
	// more, issued under the old config.
	now := time.Now()
	if !now.Before(floor.Add(-2500 * time.Millisecond)) {
		t.Skipf("the replica led %v after it started: too late for a grant of the old validity to be held", now.Sub(started))
	}
	ans, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 1, ConfigRevisions: []int64{revs[1]},
		Keys: []*sluicev1.KeyDemand{{Key: &sluicev1.QuotaKey{Tenant: "t", Class: "write"}, Admitted: 80, WindowMs: 1000,
			HeldRate: 80, HeldBurst: 80, HeldValidMs: 2500, Holding: 40}}})
	if err != nil {
		t.Fatal(err)
	}
	if !ans.Learning {
		t.Fatalf("answer %v after the replica started is not learning: want learning until %v after it started", time.Since(started), floor.Sub(started))
	}
	if len(ans.Grants) != 1 || ans.Grants[0].ValidMs != 2500 || math.Abs(ans.Grants[0].Rate-80) > 1e-6 {
		t.Fatalf("held grant of 80/s for 2.5 s re-issued as %v; want it kept to its expiry, not cut to the live 500 ms", ans.Grants)
	}
	// Learning lasts to the floor, not one live validity after the election.
	for time.Now().Before(floor.Add(-100 * time.Millisecond)) {
		if !s.View(time.Now()).Learning && time.Now().Before(floor.Add(-100*time.Millisecond)) {
			t.Fatalf("learning ended %v after the replica started, want it to last %v", time.Since(started), floor.Sub(started))
		}
		time.Sleep(20 * time.Millisecond) // polling until the floor
	}
}

// startLoggedLeader starts a global replica on srv's etcd whose config
// source holds live at rev, keeping its log, and waits for it to lead.
func startLoggedLeader(t *testing.T, srv *etcdtest.Server, live *config.Config, rev int64) (*Daemon, *capturedLogs) {
	t.Helper()
	d, logs := startReplica(t, srv, configtest.NewSource(live, rev))
	awaitLeading(t, d, logs)
	return d, logs
}

const longerValidityLine = "had a longer grant validity"

// TestFreshReplicaLeadsOverACompactedHistory: etcd compacted the history
// before the live config, so the replica cannot know what came before: it
// leads all the same (a history gone is no error to campaign again on),
// learning one live validity.
func TestFreshReplicaLeadsOverACompactedHistory(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	store := configstore.NewStore(cli, "/test")
	long := parseConfig(t, strings.Replace(loopConfig, "grant_validity: 500ms", "grant_validity: 3s", 1))
	revs := applyAll(t, store, long, parseConfig(t, loopConfig))
	if _, err := cli.Compact(t.Context(), revs[1]); err != nil {
		t.Fatal(err)
	}
	_, logs := startLoggedLeader(t, srv, parseConfig(t, loopConfig), revs[1])
	if got := logs.with(longerValidityLine); len(got) != 0 {
		t.Fatalf("a compacted history read as a longer validity: %q", got)
	}
}

// TestFreshReplicaLearnsNoLongerForAnEqualValidity: the config before the
// live one had the same validity (only its epoch differed), so grants
// under it end within the live validity: nothing to learn for longer.
func TestFreshReplicaLearnsNoLongerForAnEqualValidity(t *testing.T) {
	srv := etcdtest.Start(t)
	store := configstore.NewStore(srv.Client(t), "/test")
	slower := parseConfig(t, strings.Replace(loopConfig, "epoch: 100ms", "epoch: 125ms", 1))
	revs := applyAll(t, store, slower, parseConfig(t, loopConfig))
	_, logs := startLoggedLeader(t, srv, parseConfig(t, loopConfig), revs[1])
	if got := logs.with(longerValidityLine); len(got) != 0 {
		t.Fatalf("an equal validity committed before the live config rebuilt the allocator: %q", got)
	}
}

// TestFreshReplicaLeadsPastAConfigItRefuses: the config committed before
// the live one is one this build does not accept (written past Apply, as
// an older version or a hand-run tool could). The read back stops there
// with a warning, as at a compaction, and the replica leads: a history it
// cannot read must not keep the global tier without a leader.
func TestFreshReplicaLeadsPastAConfigItRefuses(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	store := configstore.NewStore(cli, "/test")
	first := applyAll(t, store, parseConfig(t, loopConfig))[0]
	put, err := cli.Put(t.Context(), store.Key(), "epoch: soon\n")
	if err != nil {
		t.Fatal(err)
	}
	if put.Header.Revision <= first {
		t.Fatalf("the refused config's revision %d is not after %d", put.Header.Revision, first)
	}
	live := parseConfig(t, loopConfig)
	rev, err := store.Apply(t.Context(), live, put.Header.Revision)
	if err != nil {
		t.Fatal(err)
	}
	_, logs := startLoggedLeader(t, srv, live, rev)
	if got := logs.with("level=WARN", "could not read back a config committed before"); len(got) != 1 {
		t.Fatalf("warnings of the refused config: %q, want one", got)
	}
}
