package configstore

import (
	"context"
	"fmt"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/config"
)

// TestStoreReadsMoreTenantsThanOneRangeRead: with more tenant keys than
// one etcd range read returns (readPage), Get, ListTenants and a watcher
// read every one of them, once.
//
// The test makes about 160 etcd requests, so no bound on the whole of it
// holds on a starved machine: each request is bounded instead, the
// store's by its own request timeout, as a deployment bounds them.
func TestStoreReadsMoreTenantsThanOneRangeRead(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	store := NewStore(cli, "")
	store.SetRequestTimeout(waitFor)
	ctx := t.Context()
	if _, err := store.Apply(ctx, config.Default(), 0); err != nil {
		t.Fatal(err)
	}
	// Written past the store, 128 keys (etcd's default --max-txn-ops) to a
	// transaction, the fastest way to reach the count.
	const extra = readPage + 1
	var ops []clientv3.Op
	flush := func() {
		tctx, cancel := context.WithTimeout(ctx, waitFor)
		defer cancel()
		if _, err := cli.Txn(tctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := range extra {
		ops = append(ops, clientv3.OpPut(store.TenantKey(fmt.Sprintf("p%05d", i)), `{"tier":"free"}`))
		if len(ops) == 128 {
			flush()
		}
	}
	gctx, cancel := context.WithTimeout(ctx, waitFor)
	doc, err := cli.Get(gctx, store.Key())
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	ops = append(ops, clientv3.OpPut(store.Key(), string(doc.Kvs[0].Value)))
	flush()
	rev := docRevOf(t, cli, store)

	c, gotRev, err := store.Get(ctx)
	if err != nil || gotRev != rev || len(c.Tenants) != extra+1 {
		t.Fatalf("Get = revision %d (want %d) with %d tenants (want %d), %v", gotRev, rev, len(c.Tenants), extra+1, err)
	}
	var listed, out, bad int
	prev := ""
	listRev, err := store.ListTenants(ctx, "p", func(e TenantEntry) bool {
		listed++
		if e.ID <= prev {
			out++
		}
		if e.Err != nil {
			bad++
		}
		prev = e.ID
		return true
	})
	if err != nil || listRev != rev || listed != extra || out != 0 || bad != 0 {
		t.Fatalf("ListTenants(p) = revision %d (want %d), %d listed (want %d), %d out of order, %d unparsed, %v",
			listRev, rev, listed, extra, out, bad, err)
	}
	rw := startWatcher(t, store, nil)
	// The watcher reads the document and two pages of tenants, each
	// bounded by the store's request timeout.
	rw.patience = 3 * waitFor
	if live := rw.awaitRevision(t, rev); len(live.Tenants) != extra+1 {
		t.Fatalf("watcher runs %d tenants, want %d", len(live.Tenants), extra+1)
	}
}

// TestWatcherStartsAfterACompactedHistory: a watcher started on an etcd
// whose history is compacted up to the config watches from the revision
// it read, so its watch never needs history that is gone.
func TestWatcherStartsAfterACompactedHistory(t *testing.T) {
	cli, store, ctx := newStore(t)
	rev1, err := store.Apply(ctx, withReadRate(100), 0)
	if err != nil {
		t.Fatal(err)
	}
	rev2, err := store.Apply(ctx, withReadRate(200), rev1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, rev2); err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	rw.awaitRevision(t, rev2)
	if _, err := store.Apply(ctx, withReadRate(300), rev2); err != nil {
		t.Fatal(err)
	}
	rw.awaitRate(t, 300)
	if v := rw.metric(t, "sluice_config_watch_errors_total"); v != 0 {
		t.Fatalf("watch_errors_total = %v, want 0: the watch asked for compacted history", v)
	}
}

// TestListTenantsFiltersAndStops: ListTenants lists only the ids with the
// prefix, in id order, and stops at the first entry fn refuses, whether
// the tenants are inside a document stored whole or under their keys.
func TestListTenantsFiltersAndStops(t *testing.T) {
	cli, store, ctx := newStore(t)
	cfg := withTenants(3, 0)
	put := putWhole(t, ctx, cli, store, cfg)
	list := func(prefix string, keep int) ([]string, int64) {
		t.Helper()
		var ids []string
		rev, err := store.ListTenants(ctx, prefix, func(e TenantEntry) bool {
			ids = append(ids, e.ID)
			return len(ids) < keep
		})
		if err != nil {
			t.Fatal(err)
		}
		return ids, rev
	}
	for _, stored := range []string{"in the document", "under their keys"} {
		if stored == "under their keys" {
			if _, err := store.Apply(ctx, cfg, put.Header.Revision); err != nil {
				t.Fatal(err)
			}
		}
		rev := docRevOf(t, cli, store)
		for _, c := range []struct {
			prefix string
			keep   int
			want   string
		}{
			{"t", 10, "t0000000 t0000001 t0000002"},
			{"", 10, "acme t0000000 t0000001 t0000002"},
			{"", 2, "acme t0000000"},
			{"t000000", 1, "t0000000"},
		} {
			ids, gotRev := list(c.prefix, c.keep)
			if got := strings.Join(ids, " "); got != c.want || gotRev != rev {
				t.Errorf("tenants %s: ListTenants(%q) stopping after %d = %q at revision %d, want %q at %d",
					stored, c.prefix, c.keep, got, gotRev, c.want, rev)
			}
		}
	}
}
