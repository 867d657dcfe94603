package configstore

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/pkg/config"
)

// TestWatcherReportsATenantKeyWrittenOutsideAnApply: a tenant key written
// straight into etcd (not through an apply, so the document is not
// rewritten) is seen by a running watcher: refused, logged, counted, and
// sluice_config_stored_refused stays 1 while it is stored, however many
// further hand writes follow, until an apply commits a good config. The
// live config never changes meanwhile.
func TestWatcherReportsATenantKeyWrittenOutsideAnApply(t *testing.T) {
	cli, store, ctx, rev := storeWithDefault(t)
	rw := startWatcher(t, store, nil)
	good := rw.awaitRevision(t, rev)

	if _, err := cli.Put(ctx, store.TenantKey("t7"), "not json"); err != nil {
		t.Fatal(err)
	}
	rw.awaitMetric(t, "sluice_config_rejected_total", 1)
	if v := rw.metric(t, "sluice_config_stored_refused"); v != 1 {
		t.Fatalf("stored_refused = %v after a hand-written bad tenant key, want 1", v)
	}
	if rw.Current() != good || rw.Revision() != rev {
		t.Fatalf("a hand-written tenant key changed the live config (revision %d, want %d)", rw.Revision(), rev)
	}
	rw.awaitLog(t, store.TenantKey("t7")+" written at revision")

	// A valid hand-written key is not run either: the running daemons and
	// a starting one would otherwise disagree under one revision.
	if _, err := cli.Put(ctx, store.TenantKey("t8"), `{"tier":"pro"}`); err != nil {
		t.Fatal(err)
	}
	rw.awaitMetric(t, "sluice_config_rejected_total", 2)
	if v := rw.metric(t, "sluice_config_stored_refused"); v != 1 || rw.Revision() != rev {
		t.Fatalf("stored_refused = %v, live revision %d after a second hand write; want 1, %d", v, rw.Revision(), rev)
	}
	if _, _, err := store.Get(ctx); !errors.Is(err, config.ErrInvalidConfig) || !strings.Contains(err.Error(), store.TenantKey("t7")) {
		t.Fatalf("Get with hand-written tenant keys: %v; want an error wrapping ErrInvalidConfig naming %s", err, store.TenantKey("t7"))
	}

	// An apply of a good config (which replaces the hand-written keys)
	// is live and clears the gauge.
	next, err := store.Apply(ctx, withReadRate(33), rev)
	if err != nil {
		t.Fatal(err)
	}
	rw.awaitRevision(t, next)
	if v := rw.metric(t, "sluice_config_stored_refused"); v != 0 {
		t.Fatalf("stored_refused = %v after a good apply, want 0", v)
	}
}

// TestAwaitEtcdConfigStartsOnTheNewestValidRevision: a daemon starting
// while the stored config is refused (a bad tenant key or a bad document
// written past sluicectl) starts on the newest valid config in etcd's
// history, the one running daemons kept, and reports the refusal.
func TestAwaitEtcdConfigStartsOnTheNewestValidRevision(t *testing.T) {
	cli, store, ctx := newStore(t)
	if _, err := store.Apply(ctx, withReadRate(7), 0); err != nil {
		t.Fatal(err)
	}
	rev, err := store.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	good, err := store.Apply(ctx, withReadRate(9), rev)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct{ key, value string }{
		{store.TenantKey("t7"), "not json"},
		{store.TenantKey("t7"), `{"tier":"nope"}`},
		{store.Key(), "regions: {}\n"},
	} {
		if _, err := cli.Put(ctx, bad.key, bad.value); err != nil {
			t.Fatal(err)
		}
		rw := startWatcher(t, store, nil)
		logs := &logtest.Buffer{}
		got, err := AwaitEtcdConfig(ctx, store, nil, rw.Watcher, slog.New(slog.NewTextHandler(logs, nil)))
		if err != nil || got != good || readRate(rw.Current()) != 9 {
			t.Fatalf("start with %s = %q: revision %d, %v, rate %v; want revision %d, rate 9", bad.key, bad.value, got, err, readRate(rw.Current()), good)
		}
		if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "sluicectl apply") {
			t.Fatalf("start on an older revision not logged at ERROR with the fix:\n%s", logs)
		}
		rw.awaitMetric(t, "sluice_config_stored_refused", 1)
		if v := rw.metric(t, "sluice_config_started_on_older_revision_total"); v != 1 {
			t.Fatalf("started_on_older_revision_total = %v, want 1", v)
		}
		rw.cancel()
	}
}

// TestAwaitEtcdConfigWithNoValidHistoryNamesTheFix: with no valid config
// left in etcd's history (compacted), the start fails naming the refused
// key and sluicectl apply.
func TestAwaitEtcdConfigWithNoValidHistoryNamesTheFix(t *testing.T) {
	cli, store, ctx, _ := storeWithDefault(t)
	put, err := cli.Put(ctx, store.TenantKey("t7"), "not json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	_, err = AwaitEtcdConfig(ctx, store, nil, rw.Watcher, slog.New(slog.DiscardHandler))
	if !errors.Is(err, config.ErrInvalidConfig) || !errors.Is(err, ErrNoValidHistory) ||
		!strings.Contains(err.Error(), store.TenantKey("t7")) || !strings.Contains(err.Error(), "sluicectl apply") {
		t.Fatalf("start with no valid history: %v; want an error naming %s and sluicectl apply", err, store.TenantKey("t7"))
	}
}

// TestWatcherReportsADeletedConfigKey: the config key deleted past
// sluicectl (etcdctl del) is no change: the live config stays. But it is
// no longer stored, so a daemon that starts would run something else, and
// sluice_config_stored_refused says so until a config is applied again.
func TestWatcherReportsADeletedConfigKey(t *testing.T) {
	cli, store, ctx, rev := storeWithDefault(t)
	rw := startWatcher(t, store, nil)
	good := rw.awaitRevision(t, rev)
	if v := rw.metric(t, "sluice_config_stored_refused"); v != 0 {
		t.Fatalf("stored_refused = %v with a good config stored, want 0", v)
	}

	if _, err := cli.Delete(ctx, store.Key()); err != nil {
		t.Fatal(err)
	}
	rw.awaitMetric(t, "sluice_config_stored_refused", 1)
	rw.awaitLog(t, "config key deleted from etcd")
	if rw.Current() != good || rw.Revision() != rev {
		t.Fatalf("deleting the config key changed the live config (revision %d, want %d)", rw.Revision(), rev)
	}

	next, err := store.Apply(ctx, withReadRate(33), 0)
	if err != nil {
		t.Fatal(err)
	}
	rw.awaitRevision(t, next)
	if v := rw.metric(t, "sluice_config_stored_refused"); v != 0 {
		t.Fatalf("stored_refused = %v after a config was applied again, want 0", v)
	}
}
