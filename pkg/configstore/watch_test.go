package configstore

import (
	"bytes"
	"testing"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/config"
)

// TestWatcherLeavesAConfigItMadeLiveUnchanged: configs a watcher handed
// out are shared and never modified: a later tenant change, a tenant
// deleted or added, makes a new config and leaves the old one's tenants
// as they were.
func TestWatcherLeavesAConfigItMadeLiveUnchanged(t *testing.T) {
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "")
	ctx := testContext(t)
	rev, err := store.Apply(ctx, config.Default(), 0)
	if err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	old := rw.awaitRevision(t, rev)
	free := config.Tenant{Tier: "free"}
	for _, changes := range []map[string]*config.Tenant{
		{"acme": &free},
		{"acme": nil, "beta": &free},
	} {
		if rev, err = store.SetTenants(ctx, changes, rev); err != nil {
			t.Fatal(err)
		}
		rw.awaitRevision(t, rev)
		if len(old.Tenants) != 1 || old.Tenants["acme"].Tier != "pro" {
			t.Fatalf("a tenant change at revision %d changed a config made live before it: tenants %v", rev, old.Tenants)
		}
	}
	if live := rw.Current(); len(live.Tenants) != 1 || live.Tenants["beta"].Tier != "free" {
		t.Fatalf("live tenants %v, want beta alone", live.Tenants)
	}
}

// TestWatcherChecksTheTenantsAgainstAChangedDocument: a new document is
// checked with every tenant, not only the tenants that changed with it: a
// document that drops the tier a stored tenant uses is refused, and the
// last good config stays live.
func TestWatcherChecksTheTenantsAgainstAChangedDocument(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	store := NewStore(cli, "")
	ctx := testContext(t)
	rev, err := store.Apply(ctx, config.Default(), 0)
	if err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	good := rw.awaitRevision(t, rev)

	// The document alone is valid without tier pro, which acme's key uses;
	// written past the store, as a hand-run tool could.
	noPro := config.Default()
	noPro.Tenants = nil
	delete(noPro.Tiers, "pro")
	if err := noPro.Validate(); err != nil {
		t.Fatal(err)
	}
	data, err := noPro.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte("pro")) {
		t.Fatalf("the document still names pro:\n%s", data)
	}
	if _, err := cli.Put(ctx, store.Key(), string(data)); err != nil {
		t.Fatal(err)
	}
	rw.awaitMetric(t, "sluice_config_rejected_total", 1)
	if c, got := rw.Live(); c != good || got != rev {
		t.Fatalf("the watcher runs revision %d, want %d: a document that drops acme's tier was made live", got, rev)
	}
	rw.awaitLog(t, `tenants.acme.tier: tier \"pro\" is not configured`)
}
