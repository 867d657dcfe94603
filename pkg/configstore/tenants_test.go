package configstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/envcount"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/config"
)

// withTenants is the sample with n more tenants, t0000000..; every
// seventh is pro with an override, gen varies the override's rate.
func withTenants(n, gen int) *config.Config {
	c := config.Default()
	for i := range n {
		id := fmt.Sprintf("t%07d", i)
		if i%7 == 0 {
			c.Tenants[id] = config.Tenant{Tier: "pro", Overrides: map[string]config.LimitSpec{
				"write": {Rate: config.Rate(100 + gen), Burst: 1600}}}
		} else {
			c.Tenants[id] = config.Tenant{Tier: "free"}
		}
	}
	return c
}

// awaitLog polls the watcher's log for s.
func (rw *runningWatcher) awaitLog(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(rw.logs.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("watcher log lacks %q within %v", s, waitFor)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// awaitRevision polls until the watcher runs revision rev.
func (rw *runningWatcher) awaitRevision(t *testing.T, rev int64) *config.Config {
	t.Helper()
	deadline := time.Now().Add(max(waitFor, rw.patience))
	for {
		cfg, got := rw.Live()
		if got == rev {
			return cfg
		}
		if got > rev || time.Now().After(deadline) {
			t.Fatalf("watcher at revision %d, want %d", got, rev)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestStoreKeepsEachTenantUnderItsOwnKey(t *testing.T) {
	cli, store, ctx, rev := storeWithDefault(t)
	all, _ := snapshot(t, cli, config.DefaultPrefix)
	if !strings.Contains(all, "/sluice/config/tenants/acme={\"tier\":\"pro\",\"overrides\":{\"write\":{\"rate\":\"800/s\",\"burst\":1600}}}\n") {
		t.Fatalf("no tenant key for acme:\n%s", all)
	}
	doc, _ := cli.Get(ctx, store.Key())
	if strings.Contains(string(doc.Kvs[0].Value), "tenants") || doc.Kvs[0].ModRevision != rev {
		t.Fatalf("document at %d (want %d) still lists tenants:\n%s", doc.Kvs[0].ModRevision, rev, doc.Kvs[0].Value)
	}
	got, gotRev, err := store.Get(ctx)
	if err != nil || gotRev != rev || !reflect.DeepEqual(got, config.Default()) {
		t.Fatalf("Get = rev %d (want %d), %v, diff:\n%s", gotRev, rev, err, config.Diff(config.Default(), got))
	}
	v, err := store.Tenant(ctx, "acme")
	if err != nil || v.Revision != rev || v.Tenant == nil || v.Tenant.Tier != "pro" || len(v.Config.Tenants) != 0 {
		t.Fatalf("Tenant(acme) = %+v, %v", v, err)
	}
}

// TestStoreLoadsAndMovesASingleDocumentConfig: a config stored as one
// document with its tenants inside (as before tenants had keys) still
// loads in the store and a watcher, and the next apply moves the tenants
// to their keys without changing the config.
func TestStoreLoadsAndMovesASingleDocumentConfig(t *testing.T) {
	cli, store, ctx := newStore(t)
	legacy := withTenants(50, 0)
	put := putWhole(t, ctx, cli, store, legacy)
	rw := startWatcher(t, store, nil)
	live := rw.awaitRevision(t, put.Header.Revision)
	if !reflect.DeepEqual(live, legacy) {
		t.Fatalf("watcher loaded a different config:\n%s", config.Diff(legacy, live))
	}
	got, rev, err := store.Get(ctx)
	if err != nil || rev != put.Header.Revision || !reflect.DeepEqual(got, legacy) {
		t.Fatalf("Get of a single document = %d, %v", rev, err)
	}
	// A tenant change moves every tenant to its key.
	pro := config.Tenant{Tier: "pro"}
	rev2, err := store.SetTenants(ctx, map[string]*config.Tenant{"newcomer": &pro}, rev)
	if err != nil {
		t.Fatal(err)
	}
	legacy.Tenants["newcomer"] = pro
	live = rw.awaitRevision(t, rev2)
	if !reflect.DeepEqual(live, legacy) {
		t.Fatalf("after the move the watcher runs:\n%s", config.Diff(legacy, live))
	}
	keys, err := cli.Get(ctx, store.TenantPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || keys.Count != int64(len(legacy.Tenants)) {
		t.Fatalf("%d tenant keys after the move, want %d (%v)", keys.Count, len(legacy.Tenants), err)
	}
}

// TestBatchedApplyIsSeenAsOneRevision applies more tenants than one
// transaction holds while a watcher runs: it sees the marker, makes
// nothing live until the commit, then exactly one new config with every
// tenant; a later one-tenant change is checked on its own.
func TestBatchedApplyIsSeenAsOneRevision(t *testing.T) { testBatchedApply(t, 3000) }

// TestSoakMillionTenants is TestBatchedApplyIsSeenAsOneRevision with
// 1,000,000 tenants (SLUICE_SOAK=1; make soak), or SLUICE_SOAK_TENANTS.
// Its log line gives the apply, load and reload times BENCHMARKS.md
// records.
func TestSoakMillionTenants(t *testing.T) {
	if os.Getenv("SLUICE_SOAK") == "" {
		t.Skip("set SLUICE_SOAK=1 to apply and reload 1,000,000 tenants")
	}
	testBatchedApply(t, envcount.Get(t, "SLUICE_SOAK_TENANTS", 1_000_000, 1))
}

func testBatchedApply(t *testing.T, n int) {
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "")
	// A million tenants take minutes on a busy machine.
	patience := waitFor + time.Duration(n)*2*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	rev1, err := store.Apply(ctx, config.Default(), 0)
	if err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	rw.patience = patience
	rw.awaitRevision(t, rev1)
	appliedBefore := rw.metric(t, "sluice_config_applied_total")

	want := withTenants(n, 0)
	batches := 0
	start := time.Now()
	rev2, err := store.ApplyWith(ctx, want, rev1, ApplyOptions{Progress: func(done, total int) {
		if batches++; batches == 1 {
			// The watcher holds the batch: it runs the old config.
			rw.awaitLog(t, "a batched config apply began")
			if c, rev := rw.Live(); rev != rev1 || len(c.Tenants) != 1 {
				t.Errorf("during the apply the watcher runs revision %d with %d tenants", rev, len(c.Tenants))
			}
			// Other writers are refused meanwhile.
			pro := config.Tenant{Tier: "pro"}
			if _, err := store.SetTenants(ctx, map[string]*config.Tenant{"x": &pro}, rev1); !errors.Is(err, ErrApplyInProgress) {
				t.Errorf("a tenant write during the apply: %v, want ErrApplyInProgress", err)
			}
			// Get reads the config committed before the apply.
			if c, rev, err := store.Get(ctx); err != nil || rev != rev1 || len(c.Tenants) != 1 {
				t.Errorf("Get during the apply = revision %d, %v", rev, err)
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	applied := time.Since(start)
	if min := n / TxnOps; batches < min {
		t.Fatalf("%d batches for %d tenants, want at least %d", batches, n, min)
	}
	start = time.Now()
	live := rw.awaitRevision(t, rev2)
	reloaded := time.Since(start)
	if len(live.Tenants) != n+1 || !config.TenantEqual(live.Tenants["t0000007"], want.Tenants["t0000007"]) {
		t.Fatalf("watcher runs %d tenants, want %d", len(live.Tenants), n+1)
	}
	if got := rw.metric(t, "sluice_config_applied_total"); got != appliedBefore+1 {
		t.Fatalf("applied_total went from %v to %v: the batches were made live one by one", appliedBefore, got)
	}

	// A new daemon loads the whole set.
	start = time.Now()
	fresh := startWatcher(t, NewStore(srv.Client(t), ""), nil)
	fresh.patience = patience
	fresh.awaitRevision(t, rev2)
	loaded := time.Since(start)

	// One tenant changes: checked alone, without validating the others.
	start = time.Now()
	gold := config.Tenant{Tier: "pro", Shadow: true}
	rev3, err := store.SetTenants(ctx, map[string]*config.Tenant{"t0000001": &gold, "t0000002": nil}, rev2)
	if err != nil {
		t.Fatal(err)
	}
	live = rw.awaitRevision(t, rev3)
	oneChange := time.Since(start)
	if _, ok := live.Tenants["t0000002"]; ok || !live.Tenants["t0000001"].Shadow || len(live.Tenants) != n {
		t.Fatalf("after a two-tenant change the watcher runs %d tenants, t0000001 = %+v", len(live.Tenants), live.Tenants["t0000001"])
	}
	rw.awaitLog(t, "tenants_changed=2 validated_whole=false")
	fresh.awaitRevision(t, rev3)

	// A change of a seventh of the tenants and nothing else is batched too.
	next := withTenants(n, 1)
	delete(next.Tenants, "t0000002")
	next.Tenants["t0000001"] = gold
	start = time.Now()
	rev4, err := store.Apply(ctx, next, rev3)
	if err != nil {
		t.Fatal(err)
	}
	live = rw.awaitRevision(t, rev4)
	bigChange := time.Since(start)
	if !config.TenantEqual(live.Tenants["t0000007"], next.Tenants["t0000007"]) {
		t.Fatalf("t0000007 = %+v after the second apply", live.Tenants["t0000007"])
	}
	t.Logf("%d tenants: apply %v (%d batches), watcher made it live %v after; new watcher loaded in %v; 2-tenant change live in %v; %d-tenant change applied and live in %v",
		n, applied.Round(time.Millisecond), batches, reloaded.Round(time.Millisecond), loaded.Round(time.Millisecond),
		oneChange.Round(time.Millisecond), (n+6)/7, bigChange.Round(time.Millisecond))
}

// TestInterruptedApplyKeepsTheCommittedConfig stops a batched apply half
// way: the watchers, Get and a watcher started afterwards keep the config
// committed before it, other writers are refused, and an apply that takes
// it over finishes; the interrupted one, had it gone on, would be refused.
func TestInterruptedApplyKeepsTheCommittedConfig(t *testing.T) {
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "")
	ctx := testContext(t)
	rev1, err := store.Apply(ctx, config.Default(), 0)
	if err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	rw.awaitRevision(t, rev1)

	want := withTenants(40*TxnOps, 0)
	actx, stop := context.WithCancel(ctx)
	_, err = store.ApplyWith(actx, want, rev1, ApplyOptions{Progress: func(done, total int) {
		stop()
	}})
	if !errors.Is(err, ErrInterrupted) {
		t.Fatalf("apply cancelled half way: %v, want ErrInterrupted", err)
	}
	marker, err := store.Applying(ctx)
	if err != nil || marker == nil || marker.From != rev1 {
		t.Fatalf("marker after the interruption = %+v, %v", marker, err)
	}
	if c, rev, err := store.Get(ctx); err != nil || rev != rev1 || len(c.Tenants) != 1 {
		t.Fatalf("Get after the interruption = revision %d, %v", rev, err)
	}
	late := startWatcher(t, NewStore(srv.Client(t), ""), nil)
	if c := late.awaitRevision(t, rev1); len(c.Tenants) != 1 {
		t.Fatalf("a watcher started after the interruption runs %d tenants", len(c.Tenants))
	}
	if c, rev := rw.Live(); rev != rev1 || len(c.Tenants) != 1 {
		t.Fatalf("the watcher runs revision %d with %d tenants", rev, len(c.Tenants))
	}
	if _, err := store.Apply(ctx, config.Default(), rev1); !errors.Is(err, ErrApplyInProgress) || !errors.Is(err, ErrConflict) {
		t.Fatalf("apply over an interrupted one: %v", err)
	}

	// A takeover finishes the job, and the watchers see it at once.
	var theirs *Marker
	rev2, err := store.ApplyWith(ctx, want, rev1, ApplyOptions{Takeover: true, Progress: func(int, int) {
		if theirs == nil {
			theirs, _ = store.Applying(ctx)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if theirs == nil || theirs.Revision == marker.Revision {
		t.Fatalf("the takeover did not move the marker (%+v, was %+v)", theirs, marker)
	}
	for _, w := range []*runningWatcher{rw, late} {
		if c := w.awaitRevision(t, rev2); len(c.Tenants) != len(want.Tenants) {
			t.Fatalf("after the takeover a watcher runs %d tenants, want %d", len(c.Tenants), len(want.Tenants))
		}
	}
	if m, _ := store.Applying(ctx); m != nil {
		t.Fatalf("marker left after the commit: %+v", m)
	}
}

// TestBatchedApplyDetectsATakeover: a second writer that takes over a
// running batched apply makes the first fail at its next batch, without
// committing anything of its own.
func TestBatchedApplyDetectsATakeover(t *testing.T) {
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "")
	ctx := testContext(t)
	rev1, err := store.Apply(ctx, config.Default(), 0)
	if err != nil {
		t.Fatal(err)
	}
	other := withTenants(3*TxnOps, 5)
	var otherRev int64
	took := false
	_, err = store.ApplyWith(ctx, withTenants(3*TxnOps, 0), rev1, ApplyOptions{Progress: func(int, int) {
		if took {
			return
		}
		took = true
		var err error
		if otherRev, err = store.ApplyWith(ctx, other, rev1, ApplyOptions{Takeover: true}); err != nil {
			t.Errorf("takeover: %v", err)
		}
	}})
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "took over") {
		t.Fatalf("the apply taken over: %v, want a conflict naming the takeover", err)
	}
	got, rev, err := store.Get(ctx)
	if err != nil || rev != otherRev || !reflect.DeepEqual(got, other) {
		t.Fatalf("etcd holds revision %d (the takeover's %d), %v; diff:\n%s", rev, otherRev, err, config.Diff(other, got))
	}
}

func TestWatcherRefusesATenantKeyThatDoesNotParse(t *testing.T) {
	cli, store, ctx, rev1 := storeWithDefault(t)
	rw := startWatcher(t, store, nil)
	good := rw.awaitRevision(t, rev1)
	doc, _ := cli.Get(ctx, store.Key())
	// Written past the store, as a hand-run tool could: a garbled tenant,
	// then another with an unknown tier, each with a document write.
	for i, v := range []string{`{"tier": "pro", "sahdow": true}`, `{"tier": "gold"}`} {
		resp, err := cli.Txn(ctx).Then(clientv3.OpPut(store.TenantKey("acme"), v), clientv3.OpPut(store.Key(), string(doc.Kvs[0].Value))).Commit()
		if err != nil {
			t.Fatal(err)
		}
		rw.awaitMetric(t, "sluice_config_rejected_total", float64(i+1))
		if rw.Current() != good {
			t.Fatalf("revision %d: an invalid tenant replaced the live config", resp.Header.Revision)
		}
	}
	for _, want := range []string{`unknown field "sahdow"`, `tenants.acme.tier: tier "gold" is not configured`} {
		rw.awaitLog(t, strconv.Quote(want)[1:len(strconv.Quote(want))-1])
	}
	pro := config.Tenant{Tier: "free"}
	rev, err := store.SetTenants(ctx, map[string]*config.Tenant{"acme": &pro}, docRevOf(t, cli, store))
	if err != nil {
		t.Fatal(err)
	}
	if c := rw.awaitRevision(t, rev); c.Tenants["acme"].Tier != "free" {
		t.Fatalf("acme = %+v", c.Tenants["acme"])
	}
}

func docRevOf(t *testing.T, cli *clientv3.Client, store *Store) int64 {
	t.Helper()
	resp, err := cli.Get(testContext(t), store.Key())
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("read %s: %v", store.Key(), err)
	}
	return resp.Kvs[0].ModRevision
}

func TestSetTenantsChecksTheChangeAgainstTheDocument(t *testing.T) {
	cli, store, ctx, rev := storeWithDefault(t)
	before, beforeRev := snapshot(t, cli, config.DefaultPrefix)
	gold := config.Tenant{Tier: "gold"}
	if _, err := store.SetTenants(ctx, map[string]*config.Tenant{"beta": &gold}, rev); !errors.Is(err, config.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), `tenants.beta.tier: tier "gold"`) {
		t.Fatalf("SetTenants of an unknown tier: %v", err)
	}
	pro := config.Tenant{Tier: "pro"}
	if _, err := store.SetTenants(ctx, map[string]*config.Tenant{"beta": &pro}, rev-1); !errors.Is(err, ErrConflict) {
		t.Fatalf("SetTenants at a stale revision: %v", err)
	}
	if after, afterRev := snapshot(t, cli, config.DefaultPrefix); after != before || afterRev != beforeRev {
		t.Fatal("refused tenant writes changed etcd")
	}
	var ids []string
	if _, err := store.ListTenants(ctx, "", func(e TenantEntry) bool { ids = append(ids, e.ID); return true }); err != nil ||
		!reflect.DeepEqual(ids, []string{"acme"}) {
		t.Fatalf("ListTenants = %v, %v", ids, err)
	}
}

// TestStoreAppliesAConfigLargerThanOneEtcdRequest: a config whose single
// document would exceed what etcd accepts in one request (2.2 MB here)
// is stored, read back and loaded by a watcher.
func TestStoreAppliesAConfigLargerThanOneEtcdRequest(t *testing.T) {
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "")
	// Some 60 transactions: slow on a busy machine under the race detector.
	ctx, cancel := context.WithTimeout(context.Background(), 10*waitFor)
	defer cancel()
	c := config.Default()
	for i := range 7500 {
		c.Tenants[fmt.Sprintf("tenant-%0120d", i)] = config.Tenant{Tier: "pro", Overrides: map[string]config.LimitSpec{
			"read": {Rate: 2000, Burst: 4000}, "write": {Rate: 800, Burst: 1600}, "export": {Rate: 1, Burst: 5}}}
	}
	if data, _ := c.Marshal(); len(data) < 2<<20 {
		t.Fatalf("the document is only %d bytes", len(data))
	}
	rev, err := store.Apply(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, gotRev, err := store.Get(ctx)
	if err != nil || gotRev != rev || !reflect.DeepEqual(got, c) {
		t.Fatalf("Get = revision %d (want %d), %v", gotRev, rev, err)
	}
	rw := startWatcher(t, store, nil)
	rw.patience = 10 * waitFor
	if live := rw.awaitRevision(t, rev); len(live.Tenants) != len(c.Tenants) {
		t.Fatalf("watcher runs %d tenants, want %d", len(live.Tenants), len(c.Tenants))
	}
}
