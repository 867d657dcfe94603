package configstore

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/config"
)

// applyInBatches applies cfg at expectRev and returns the new revision,
// the tenant writes Progress reported in all, and the writes of each
// batch, smallest first (batches run concurrently, in no fixed order).
func applyInBatches(t *testing.T, store *Store, cfg *config.Config, expectRev int64) (int64, int, []int) {
	t.Helper()
	var (
		mu    sync.Mutex // guards sizes, last and total
		sizes []int
		last  int
		total int
	)
	rev, err := store.ApplyWith(testContext(t), cfg, expectRev, ApplyOptions{Progress: func(done, all int) {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, done-last)
		last, total = done, all
	}})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(sizes)
	return rev, total, sizes
}

// withMore is cfg with more tenants named prefix000.. of tier free.
func withMore(cfg *config.Config, prefix string, n int) *config.Config {
	c := *cfg
	c.Tenants = maps.Clone(cfg.Tenants)
	for i := range n {
		c.Tenants[fmt.Sprintf("%s%03d", prefix, i)] = config.Tenant{Tier: "free"}
	}
	return &c
}

// TestStoreApplyWritesFewerThan120KeysInOneTransaction: a change of fewer
// than 120 tenant keys (the number docs/architecture.md gives) is one
// transaction, one revision, however many tenants stay as they are; a
// change of 120 keys or more writes the applying marker, the keys in
// batches of at most 120, then commits: a revision each.
func TestStoreApplyWritesFewerThan120KeysInOneTransaction(t *testing.T) {
	const perTxn = 120
	_, store, ctx, rev := storeWithDefault(t)

	cfg := withMore(config.Default(), "a", perTxn-1)
	next, err := store.Apply(ctx, cfg, rev)
	if err != nil || next != rev+1 {
		t.Fatalf("%d new tenants: revision %d after %d, %v; want one transaction", perTxn-1, next, rev, err)
	}
	rev = next

	// One tenant changes among perTxn+1 that do not.
	cfg.Tenants["a000"] = config.Tenant{Tier: "pro"}
	next, err = store.Apply(ctx, cfg, rev)
	if err != nil || next != rev+1 {
		t.Fatalf("one changed tenant among %d: revision %d after %d, %v; want one transaction", len(cfg.Tenants), next, rev, err)
	}
	rev = next

	for _, step := range []struct {
		prefix string
		n      int
		sizes  []int
	}{
		{"b", perTxn, []int{perTxn}},
		{"c", 2*perTxn + 1, []int{1, perTxn, perTxn}},
	} {
		cfg = withMore(cfg, step.prefix, step.n)
		next, total, sizes := applyInBatches(t, store, cfg, rev)
		if total != step.n || !reflect.DeepEqual(sizes, step.sizes) {
			t.Fatalf("%d new tenants: %d writes in batches of %v, want %d in %v", step.n, total, sizes, step.n, step.sizes)
		}
		// The marker, each batch, the commit.
		if want := rev + int64(len(step.sizes)) + 2; next != want {
			t.Fatalf("%d new tenants: revision %d after %d, want %d", step.n, next, rev, want)
		}
		rev = next
	}
	got, gotRev, err := store.Get(ctx)
	if err != nil || gotRev != rev || !reflect.DeepEqual(got, cfg) {
		t.Fatalf("Get = revision %d (want %d), %v", gotRev, rev, err)
	}
}

// withBigTenants is the sample with 110 more classes and, instead of its
// tenant, n tenants whose keys and values are exactly size bytes together.
func withBigTenants(t *testing.T, n, size int) *config.Config {
	t.Helper()
	c := config.Default()
	for i := range 110 {
		name := fmt.Sprintf("class-%054d", i)
		c.Classes[name] = c.Classes["read"]
		for _, tier := range c.Tiers {
			tier[name] = config.LimitSpec{Rate: 10, Burst: 20}
		}
	}
	big := config.Tenant{Tier: "pro", Overrides: map[string]config.LimitSpec{}}
	store := NewStore(nil, "")
	idLen := 0
	for _, class := range slices.Sorted(maps.Keys(c.Classes)) {
		big.Overrides[class] = config.LimitSpec{Rate: 5, Burst: 10}
		v, err := config.MarshalTenant(big)
		if err != nil {
			t.Fatal(err)
		}
		if idLen = size - len(store.TenantKey("")) - len(v); idLen <= 100 {
			break
		}
	}
	if idLen < 4 {
		t.Fatalf("tenant ids of %d bytes", idLen)
	}
	c.Tenants = map[string]config.Tenant{}
	for i := range n {
		c.Tenants[fmt.Sprintf("t%0*d", idLen-1, i)] = big
	}
	return c
}

// TestStoreApplyBatchesHoldAtMostHalfAMebibyte: a batch takes tenant
// writes while they hold less than 512 KiB (docs/architecture.md), so a
// first tenant of 8 KiB - 1 byte and 64 of 8 KiB (1 byte short) go in one
// batch with one more, and 64 of 8 KiB (exactly 512 KiB) fill the next.
func TestStoreApplyBatchesHoldAtMostHalfAMebibyte(t *testing.T) {
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "")
	cfg := withBigTenants(t, 130, 8<<10)
	first := slices.Min(slices.Collect(maps.Keys(cfg.Tenants)))
	// One byte shorter, and still first in key order.
	cfg.Tenants["s"+first[2:]] = cfg.Tenants[first]
	delete(cfg.Tenants, first)
	_, total, sizes := applyInBatches(t, store, cfg, 0)
	if want := []int{1, 64, 65}; total != 130 || !reflect.DeepEqual(sizes, want) {
		t.Fatalf("130 tenant writes of 8 KiB went %d in batches of %v, want %v", total, sizes, want)
	}
}

// TestStoreApplyRefusesANegativeRevision: a negative expected revision is
// a caller's mistake, not a conflict, and writes nothing.
func TestStoreApplyRefusesANegativeRevision(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	store := NewStore(cli, "")
	_, err := store.Apply(testContext(t), config.Default(), -1)
	if err == nil || errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "negative") {
		t.Fatalf("Apply at revision -1: %v, want an error naming the negative revision, not a conflict", err)
	}
	if all, _ := snapshot(t, cli, config.DefaultPrefix); all != "" {
		t.Fatalf("a refused apply wrote:\n%s", all)
	}
}

// TestSetTenantsAtARevisionNotYetWrittenIsAConflict: an expected revision
// past the config's is a stale read like any other, refused before any
// read at that revision.
func TestSetTenantsAtARevisionNotYetWrittenIsAConflict(t *testing.T) {
	cli, store, ctx, rev := storeWithDefault(t)
	before, beforeRev := snapshot(t, cli, config.DefaultPrefix)
	pro := config.Tenant{Tier: "pro"}
	if _, err := store.SetTenants(ctx, map[string]*config.Tenant{"beta": &pro}, rev+1000); !errors.Is(err, ErrConflict) {
		t.Fatalf("SetTenants at a revision not yet written: %v, want ErrConflict", err)
	}
	if after, afterRev := snapshot(t, cli, config.DefaultPrefix); after != before || afterRev != beforeRev {
		t.Fatal("a refused tenant write changed etcd")
	}
}

// TestStoreGetNamesATenantKeyThatDoesNotParse: Get of a config with a
// tenant key that does not parse fails naming that key, with the
// revision, so the config can be overwritten.
func TestStoreGetNamesATenantKeyThatDoesNotParse(t *testing.T) {
	cli, store, ctx := newStore(t)
	if _, err := store.Apply(ctx, config.Default(), 0); err != nil {
		t.Fatal(err)
	}
	doc, err := cli.Get(ctx, store.Key())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Txn(ctx).Then(clientv3.OpPut(store.TenantKey("acme"), `{"tier": "pro", "sahdow": true}`),
		clientv3.OpPut(store.Key(), string(doc.Kvs[0].Value))).Commit()
	if err != nil {
		t.Fatal(err)
	}
	c, rev, err := store.Get(ctx)
	if c != nil || rev != resp.Header.Revision || !errors.Is(err, config.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "tenant key "+store.TenantKey("acme")) || !strings.Contains(err.Error(), `unknown field "sahdow"`) {
		t.Fatalf("Get with a garbled tenant key = %v, revision %d (want %d), %v", c, rev, resp.Header.Revision, err)
	}
	if _, err := store.Apply(ctx, config.Default(), rev); err != nil {
		t.Fatal(err)
	}
}

// TestStoreTenantReadsTheCommittedTenant: Tenant of an empty etcd is an
// empty view (and ListTenants lists nothing); of a tenant not listed, the document without a tenant; of a
// config stored as one document (tenants inside), the tenant from the
// document; and while a batched apply writes its tenants, Tenant and
// ListTenants read the tenants as committed before it began, not as the
// apply wrote them.
func TestStoreTenantReadsTheCommittedTenant(t *testing.T) {
	cli, store, ctx := newStore(t)
	if v, err := store.Tenant(ctx, "acme"); err != nil || v.Config != nil || v.Tenant != nil || v.Revision != 0 {
		t.Fatalf("Tenant on an empty etcd = %+v, %v", v, err)
	}
	if rev, err := store.ListTenants(ctx, "", func(e TenantEntry) bool { t.Errorf("ListTenants on an empty etcd listed %s", e.ID); return true }); rev != 0 || err != nil {
		t.Fatalf("ListTenants on an empty etcd = revision %d, %v", rev, err)
	}

	legacy := withTenants(3, 0)
	put := putWhole(t, ctx, cli, store, legacy)
	v, err := store.Tenant(ctx, "t0000001")
	if err != nil || v.Revision != put.Header.Revision || v.Tenant == nil || !config.TenantEqual(*v.Tenant, legacy.Tenants["t0000001"]) {
		t.Fatalf("Tenant(t0000001) of a single document = %+v, %v", v, err)
	}
	if v, err := store.Tenant(ctx, "nobody"); err != nil || v.Config == nil || v.Tenant != nil || v.Revision != put.Header.Revision {
		t.Fatalf("Tenant(nobody) = %+v, %v", v, err)
	}

	rev, err := store.Apply(ctx, config.Default(), put.Header.Revision)
	if err != nil {
		t.Fatal(err)
	}
	// Exactly one batch: acme changes and 119 tenants are new.
	next := withMore(config.Default(), "n", 119)
	next.Tenants["acme"] = config.Tenant{Tier: "free"}
	checked := false
	_, err = store.ApplyWith(ctx, next, rev, ApplyOptions{Progress: func(done, total int) {
		checked = true
		if v, err := store.Tenant(ctx, "acme"); err != nil || v.Revision != rev || v.Tenant == nil || v.Tenant.Tier != "pro" {
			t.Errorf("Tenant(acme) while its change is written = %+v, %v; want the committed pro tenant", v, err)
		}
		if v, err := store.Tenant(ctx, "n000"); err != nil || v.Revision != rev || v.Tenant != nil {
			t.Errorf("Tenant(n000) while it is written = %+v, %v; want none committed", v, err)
		}
		var listed []TenantEntry
		listRev, err := store.ListTenants(ctx, "", func(e TenantEntry) bool { listed = append(listed, e); return true })
		if err != nil || listRev != rev || len(listed) != 1 || listed[0].ID != "acme" || listed[0].Tenant.Tier != "pro" {
			t.Errorf("ListTenants while tenants are written = revision %d (want %d), %+v, %v; want the committed acme alone", listRev, rev, listed, err)
		}
	}})
	if err != nil || !checked {
		t.Fatalf("batched apply: %v (a batch written: %v)", err, checked)
	}
	if v, err := store.Tenant(ctx, "n000"); err != nil || v.Tenant == nil || v.Tenant.Tier != "free" {
		t.Fatalf("Tenant(n000) after the commit = %+v, %v", v, err)
	}
}

// TestSetTenantsWithoutAConfigIsInvalid: tenants cannot be added to an
// etcd that holds no config; that is no conflict to retry.
func TestSetTenantsWithoutAConfigIsInvalid(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	store := NewStore(cli, "")
	pro := config.Tenant{Tier: "pro"}
	_, err := store.SetTenants(testContext(t), map[string]*config.Tenant{"beta": &pro}, 0)
	if !errors.Is(err, config.ErrInvalidConfig) || errors.Is(err, ErrConflict) {
		t.Fatalf("SetTenants on an empty etcd: %v, want ErrInvalidConfig", err)
	}
	if all, _ := snapshot(t, cli, config.DefaultPrefix); all != "" {
		t.Fatalf("a refused tenant write wrote:\n%s", all)
	}
}

// TestSetTenantsOf120ChangesOrMoreIsABatchedApply: SetTenants writes
// fewer than 120 changes in one transaction; 120 (the number
// docs/architecture.md gives) go through a whole apply, in batches after
// the marker, first to a config that had no tenants, then with a tenant
// deleted among them.
func TestSetTenantsOf120ChangesOrMoreIsABatchedApply(t *testing.T) {
	const perTxn = 120
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "")
	ctx := testContext(t)
	cfg := config.Default()
	cfg.Tenants = nil
	rev, err := store.Apply(ctx, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := config.Default()
	want.Tenants = map[string]config.Tenant{}
	for _, step := range []struct {
		prefix    string
		n         int
		deletes   []string
		revisions int64
	}{
		{"a", perTxn, nil, 3}, // the marker, one batch, the commit
		{"b", perTxn - 1, nil, 1},
		{"c", perTxn - 1, []string{"a000"}, 3},
	} {
		changes := map[string]*config.Tenant{}
		for i := range step.n {
			id := fmt.Sprintf("%s%03d", step.prefix, i)
			changes[id] = &config.Tenant{Tier: "pro"}
			want.Tenants[id] = config.Tenant{Tier: "pro"}
		}
		for _, id := range step.deletes {
			changes[id] = nil
			delete(want.Tenants, id)
		}
		next, err := store.SetTenants(ctx, changes, rev)
		if err != nil || next-rev != step.revisions {
			t.Fatalf("SetTenants of %d tenants: %v, written in %d revisions, want %d", len(changes), err, next-rev, step.revisions)
		}
		rev = next
	}
	got, gotRev, err := store.Get(ctx)
	if err != nil || gotRev != rev || !reflect.DeepEqual(got, want) {
		t.Fatalf("Get = revision %d (want %d), %v", gotRev, rev, err)
	}
}

// TestSetTenantsMovesTheOneTenantOfASingleDocument: a tenant change to a
// config stored as one document moves its tenants to their keys, even
// when it lists a single tenant.
func TestSetTenantsMovesTheOneTenantOfASingleDocument(t *testing.T) {
	cli, store, ctx := newStore(t)
	legacy := config.Default()
	if len(legacy.Tenants) != 1 {
		t.Fatalf("the sample lists %d tenants, want 1", len(legacy.Tenants))
	}
	put := putWhole(t, ctx, cli, store, legacy)
	pro := config.Tenant{Tier: "pro"}
	rev, err := store.SetTenants(ctx, map[string]*config.Tenant{"beta": &pro}, put.Header.Revision)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := cli.Get(ctx, store.Key())
	if err != nil || doc.Kvs[0].ModRevision != rev || strings.Contains(string(doc.Kvs[0].Value), "tenants") {
		t.Fatalf("document at revision %d (want %d) after the change, %v:\n%s", doc.Kvs[0].ModRevision, rev, err, doc.Kvs[0].Value)
	}
	if keys, err := cli.Get(ctx, store.TenantPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || keys.Count != 2 {
		t.Fatalf("%d tenant keys after the change, want 2 (%v)", keys.Count, err)
	}
}
