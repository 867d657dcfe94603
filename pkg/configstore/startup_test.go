package configstore

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/pkg/config"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestAwaitEtcdConfigStartsOnEtcdsConfig: a daemon starting with a
// watcher on etcd returns only once the watcher serves etcd's config,
// never while it still serves its fallback: etcd's config wins over a
// bootstrap, a bootstrap is written when etcd holds none, and with
// neither the fallback is served (revision 0).
func TestAwaitEtcdConfigStartsOnEtcdsConfig(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := testContext(t)
	logger := slog.New(slog.DiscardHandler)

	// Neither: the fallback, revision 0, nothing written.
	empty := NewStore(srv.Client(t), "/none")
	rw := startWatcher(t, empty, nil)
	if rev, err := AwaitEtcdConfig(ctx, empty, nil, rw.Watcher, logger); err != nil || rev != 0 {
		t.Fatalf("etcd holding no config, no bootstrap: revision %d, %v; want 0, nil", rev, err)
	}
	if cfg, _, err := empty.Get(ctx); err != nil || cfg != nil {
		t.Fatalf("etcd after starting with no bootstrap: %v, %v; want no config written", cfg, err)
	}

	// A bootstrap lands in an empty etcd and is served.
	boot := withReadRate(7)
	store := NewStore(srv.Client(t), "/boot")
	rw = startWatcher(t, store, config.Default())
	rev, err := AwaitEtcdConfig(ctx, store, boot, rw.Watcher, logger)
	if err != nil || rev == 0 || readRate(rw.Current()) != 7 {
		t.Fatalf("bootstrap into an empty etcd: revision %d, %v, serving read rate %v; want the bootstrap (7) served", rev, err, readRate(rw.Current()))
	}

	// etcd's config wins over another bootstrap, and is what a watcher
	// whose fallback differs serves once it returns.
	rw = startWatcher(t, store, withReadRate(9))
	got, err := AwaitEtcdConfig(ctx, store, withReadRate(9), rw.Watcher, logger)
	if err != nil || got != rev || readRate(rw.Current()) != 7 {
		t.Fatalf("second start: revision %d, %v, serving read rate %v; want etcd's (revision %d, 7)", got, err, readRate(rw.Current()), rev)
	}
}

// TestAwaitEtcdConfigRefusesAnInvalidConfig: an invalid config stored in
// etcd (written past the store, as a hand-run tool could) stops the start
// with an error wrapping config.ErrInvalidConfig, instead of waiting.
func TestAwaitEtcdConfigRefusesAnInvalidConfig(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := testContext(t)
	store := NewStore(cli, "/bad")
	if _, err := cli.Put(ctx, store.Key(), "regions: {}\n"); err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	rw.awaited = true // the watcher refuses the document too
	_, err := AwaitEtcdConfig(ctx, store, nil, rw.Watcher, slog.New(slog.DiscardHandler))
	if !errors.Is(err, config.ErrInvalidConfig) {
		t.Fatalf("starting on an invalid stored config: %v, want an error wrapping ErrInvalidConfig", err)
	}
}

// TestAwaitEtcdConfigWaitsForEtcdUntilCancelled: with etcd unreachable
// the start waits (it never starts on its fallback), and ends with the
// context's error when the daemon is stopped before etcd answers.
func TestAwaitEtcdConfigWaitsForEtcdUntilCancelled(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{grpctest.RefusedAddr(t)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	store := NewStore(cli, "/gone")
	w := NewWatcher(store, nil, slog.New(slog.DiscardHandler), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := AwaitEtcdConfig(ctx, store, nil, w, slog.New(slog.DiscardHandler))
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while waiting for etcd: %v, want context.Canceled", err)
	}
}

// TestAwaitEtcdConfigAfterTheKeyWasDeletedStartsOnItsLastConfig: with the
// config key deleted past sluicectl (etcdctl del) the running daemons keep
// the last config; a daemon starting then starts on that config too, never
// writing its bootstrap over the others' (they would reload onto it) nor
// running the built-in sample, and reports the key missing. With that
// config compacted from etcd's history the start fails naming the fix. A
// key deleted before a compaction that removed the deletion's record too
// is an etcd that holds no config, as a new one.
func TestAwaitEtcdConfigAfterTheKeyWasDeletedStartsOnItsLastConfig(t *testing.T) {
	cli, store, ctx, first := storeWithDefault(t)
	good, err := store.Apply(ctx, withReadRate(9), first)
	if err != nil {
		t.Fatal(err)
	}
	del, err := cli.Delete(ctx, store.Key())
	if err != nil {
		t.Fatal(err)
	}
	for _, boot := range []*config.Config{nil, withReadRate(7)} {
		rw := startWatcher(t, store, config.Default())
		logs := &logtest.Buffer{}
		got, err := AwaitEtcdConfig(ctx, store, boot, rw.Watcher, slog.New(slog.NewTextHandler(logs, nil)))
		if err != nil || got != good || readRate(rw.Current()) != 9 {
			t.Fatalf("start (bootstrap %v) after the key's deletion: revision %d, %v, rate %v; want the last config (revision %d, rate 9)",
				boot != nil, got, err, readRate(rw.Current()), good)
		}
		if cfg, _, err := store.Get(ctx); err != nil || cfg != nil {
			t.Fatalf("etcd after the start: %v, %v; want still no config (no bootstrap written)", cfg, err)
		}
		if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "deleted_at_revision="+strconv.FormatInt(del.Header.Revision, 10)) {
			t.Fatalf("start on a deleted key's last config not logged at ERROR with the deletion's revision:\n%s", logs)
		}
		rw.awaitMetric(t, "sluice_config_stored_refused", 1)
		rw.cancel()
	}

	// Its last config compacted, the deletion still on record: no start.
	if _, err := cli.Compact(ctx, del.Header.Revision); err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, config.Default())
	rw.awaited = true
	_, err = AwaitEtcdConfig(ctx, store, withReadRate(7), rw.Watcher, slog.New(slog.DiscardHandler))
	if !errors.Is(err, config.ErrInvalidConfig) || !strings.Contains(err.Error(), "sluicectl apply") {
		t.Fatalf("start with the deleted key's config compacted: %v; want an error wrapping ErrInvalidConfig naming sluicectl apply", err)
	}
	if cfg, _, err := store.Get(ctx); err != nil || cfg != nil {
		t.Fatalf("etcd after the refused start: %v, %v; want no config written", cfg, err)
	}

	// The deletion's record compacted too: a new etcd, the bootstrap lands.
	put, err := cli.Put(ctx, "/unrelated", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	rw = startWatcher(t, store, config.Default())
	got, err := AwaitEtcdConfig(ctx, store, withReadRate(7), rw.Watcher, slog.New(slog.DiscardHandler))
	if err != nil || got <= put.Header.Revision || readRate(rw.Current()) != 7 {
		t.Fatalf("start with no record of the deletion: revision %d, %v, rate %v; want the bootstrap (7) written and served", got, err, readRate(rw.Current()))
	}
}

// TestDeletedAtReadsTheHistoryUpToItsRevision: DeletedAt is the last
// deletion of the config key at or before the revision it is given, read
// from the key's history: a later write or deletion does not count, and a
// write after a deletion undoes it.
func TestDeletedAtReadsTheHistoryUpToItsRevision(t *testing.T) {
	cli, store, ctx := newStore(t)
	var revs []int64 // put, delete, put, delete, put
	for i := range 5 {
		var rev int64
		if i%2 == 0 {
			r, err := cli.Put(ctx, store.Key(), "x")
			if err != nil {
				t.Fatal(err)
			}
			rev = r.Header.Revision
		} else {
			r, err := cli.Delete(ctx, store.Key())
			if err != nil {
				t.Fatal(err)
			}
			rev = r.Header.Revision
		}
		revs = append(revs, rev)
	}
	for _, c := range []struct {
		upTo, want int64
	}{
		{revs[0] - 1, 0}, {revs[0], 0}, {revs[1], revs[1]}, {revs[2], 0}, {revs[3], revs[3]}, {revs[4], 0},
	} {
		if got, err := store.DeletedAt(ctx, c.upTo); err != nil || got != c.want {
			t.Errorf("DeletedAt(%d) = %d, %v; want %d (history: put %d, delete %d, put %d, delete %d, put %d)",
				c.upTo, got, err, c.want, revs[0], revs[1], revs[2], revs[3], revs[4])
		}
	}
}
