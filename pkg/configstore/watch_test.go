package configstore

import (
	"bytes"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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
	cli, store, ctx, rev := storeWithDefault(t)
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

// TestWatcherJudgesEachRevisionOnceAcrossARead: after its watch breaks
// (here on a compacted history), a watcher reads the config again; a
// config it refused before is not judged and counted again, and the
// revisions it saw are kept, not forgotten as if etcd's history had gone
// backwards.
func TestWatcherJudgesEachRevisionOnceAcrossARead(t *testing.T) {
	srv := etcdtest.Start(t)
	link := srv.Link(t)
	cli := srv.Client(t)
	store := NewStore(link.Client(t), "")
	writer := NewStore(cli, "")
	ctx := testContext(t)
	if _, err := writer.Apply(ctx, withReadRate(100), 0); err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	rw.awaitRate(t, 100)
	data, err := withReadRate(100).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	put, err := cli.Put(ctx, writer.Key(), string(bytes.Replace(data, []byte("rate: 100/s"), []byte("rate: 0/s"), 1)))
	if err != nil {
		t.Fatal(err)
	}
	rw.awaitMetric(t, "sluice_config_rejected_total", 1)

	// Cut off, the watcher misses a write outside the config and a
	// compaction up to it, so its watch cannot resume: it reads again.
	link.Cut()
	var other *clientv3.PutResponse
	for range 2 { // a watch can resume at the compacted revision itself
		if other, err = cli.Put(ctx, "/not-the-config", "x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Compact(ctx, other.Header.Revision); err != nil {
		t.Fatal(err)
	}
	link.Mend()
	if _, err := writer.Apply(ctx, withReadRate(300), put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	// Only a read after the cut can see this config: the watch broke.
	rw.awaitRate(t, 300)
	rw.awaitMetric(t, "sluice_config_watch_errors_total", 1)
	if v := rw.metric(t, "sluice_config_rejected_total"); v != 1 {
		t.Fatalf("rejected_total = %v after the read, want 1: the refused config was judged again", v)
	}
	if v := rw.metric(t, "sluice_config_applied_total"); v != 2 {
		t.Fatalf("applied_total = %v, want 2", v)
	}
	if logs := rw.logs.String(); bytes.Contains([]byte(logs), []byte("went backwards")) {
		t.Fatalf("the read after the cut forgot the revisions seen:\n%s", logs)
	}
}

// TestWatcherMakesARevisionLiveWithAllItsChanges: a revision is made live
// with every change it holds, whatever their order in its transaction:
// here the document is written before the tenant keys, as a hand-run tool
// could.
func TestWatcherMakesARevisionLiveWithAllItsChanges(t *testing.T) {
	cli, store, ctx, rev := storeWithDefault(t)
	rw := startWatcher(t, store, nil)
	rw.awaitRevision(t, rev)
	doc, err := cli.Get(ctx, store.Key())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Txn(ctx).Then(
		clientv3.OpPut(store.Key(), string(doc.Kvs[0].Value)),
		clientv3.OpPut(store.TenantKey("acme"), `{"tier":"free"}`),
		clientv3.OpPut(store.TenantKey("beta"), `{"tier":"pro"}`),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	live := rw.awaitRevision(t, resp.Header.Revision)
	if len(live.Tenants) != 2 || live.Tenants["acme"].Tier != "free" || live.Tenants["beta"].Tier != "pro" {
		t.Fatalf("revision %d made live with tenants %v, want acme free and beta pro", resp.Header.Revision, live.Tenants)
	}
}

// TestWatcherAssemblesTheTenants: the live config lists the tenants of a
// document stored whole together with those under keys (a key wins), and
// a config without tenants is made live as it was written, with no
// tenants at all.
func TestWatcherAssemblesTheTenants(t *testing.T) {
	cli, store, ctx := newStore(t)
	// The sample lists one tenant, acme, inside the document.
	legacy, err := config.Default().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Txn(ctx).Then(
		clientv3.OpPut(store.Key(), string(legacy)),
		clientv3.OpPut(store.TenantKey("beta"), `{"tier":"pro"}`),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	live := rw.awaitRevision(t, resp.Header.Revision)
	if len(live.Tenants) != 2 || live.Tenants["acme"].Tier != "pro" || live.Tenants["beta"].Tier != "pro" {
		t.Fatalf("live tenants %v, want acme from the document and beta from its key", live.Tenants)
	}

	none := config.Default()
	none.Tenants = nil
	rev, err := store.Apply(ctx, none, resp.Header.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if live := rw.awaitRevision(t, rev); live.Tenants != nil {
		t.Fatalf("a config without tenants made live with tenants %#v, want none", live.Tenants)
	}
}

// TestWatcherReportsAnEtcdItCannotReach: a watch whose etcd stops
// answering is an interrupted watch, counted in
// sluice_config_watch_errors_total and logged once as "config watch
// interrupted" however long the outage lasts, and its end is logged once;
// then changes arrive again. The etcd client's watch waits silently through
// a hung etcd (every byte held, as a SIGSTOP holds them) or a stopped one:
// the metric stayed 0 and nothing was logged, so SluiceConfigWatchFailing
// and the runbook's log line never came.
func TestWatcherReportsAnEtcdItCannotReach(t *testing.T) {
	for _, tc := range []struct {
		name      string
		out, back func(srv *etcdtest.Server, link *etcdtest.Link)
	}{
		{"hung", func(_ *etcdtest.Server, l *etcdtest.Link) { l.Hang() }, func(_ *etcdtest.Server, l *etcdtest.Link) { l.Mend() }},
		{"stopped", func(s *etcdtest.Server, _ *etcdtest.Link) { s.Stop() }, func(s *etcdtest.Server, _ *etcdtest.Link) { s.Restart() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Each outage has an etcd of its own, and the run is mostly
			// waiting for the watcher's probes and retries: the two run
			// side by side.
			t.Parallel()
			srv := etcdtest.Start(t)
			link := srv.Link(t)
			store := NewStore(link.Client(t), "")
			writer := NewStore(srv.Client(t), "")
			rev, err := writer.Apply(testContext(t), withReadRate(100), 0)
			if err != nil {
				t.Fatal(err)
			}
			rw := startWatcher(t, store, nil)
			rw.awaitRate(t, 100)
			// Many of the watcher's own periods: a probe every interval,
			// each read bounded by the request timeout, and the reads
			// again after a growing pause.
			wait := 10 * (watchProbeInterval + watchRequestTimeout + watchRetryMax)
			poll := func(what string, ok func() bool) {
				t.Helper()
				for deadline := time.Now().Add(wait); !ok(); {
					if time.Now().After(deadline) {
						t.Fatalf("%s: not within %v\nwatcher log:\n%s", what, wait, rw.logs)
					}
					time.Sleep(watchProbeInterval / 20) // polling the watcher with a deadline
				}
			}
			count := func(s string) int { return strings.Count(rw.logs.String(), s) }
			const down, up = "config watch interrupted", "config watch resumed"

			tc.out(srv, link)
			poll("two watch errors counted", func() bool { return rw.metric(t, "sluice_config_watch_errors_total") >= 2 })
			if n := count(down); n != 1 {
				t.Errorf("one outage logged %q %d times, want once", down, n)
			}
			tc.back(srv, link)
			poll("the end of the outage logged", func() bool { return count(up) == 1 })
			ctx := testContext(t)
			if _, err := writer.Apply(ctx, withReadRate(200), rev); err != nil {
				t.Fatal(err)
			}
			rw.awaitRate(t, 200)
			if n := count(down); n != 1 {
				t.Errorf("one outage logged %q %d times, want once", down, n)
			}
		})
	}
}

// TestWatcherFollowsAnEtcdRestoredFromABackup: etcd restored from an older
// backup within moments serves revisions the watcher saw before, its own
// history again. The etcd client resumed the watch there silently, at a
// revision the restored etcd had not reached, and every read the watcher
// probed with answered: it kept running a config etcd no longer held and
// never saw the configs applied next, until etcd's revision passed the one
// it had watched from. It must notice, read again and follow what the
// restored etcd holds: the configs applied after the restore, and the
// backed-up config itself even when the restored etcd's revision passed
// the watched one first (other keys written: elections, sessions).
func TestWatcherFollowsAnEtcdRestoredFromABackup(t *testing.T) {
	for _, tc := range []struct {
		name string
		pass bool // the restored etcd passes the watched revision at once
	}{{"behind", false}, {"passed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // mostly waiting for the watcher's probe
			srv := etcdtest.Start(t)
			cli := srv.Client(t)
			store := NewStore(srv.Client(t), "")
			writer := NewStore(cli, "")
			ctx := testContext(t)
			backedUp, err := writer.Apply(ctx, withReadRate(100), 0)
			if err != nil {
				t.Fatal(err)
			}
			rw := startWatcher(t, store, nil)
			rw.awaitRate(t, 100)
			restore := srv.Backup()
			rev := backedUp
			for _, r := range []config.Rate{200, 300, 400} {
				if rev, err = writer.Apply(ctx, withReadRate(r), rev); err != nil {
					t.Fatal(err)
				}
			}
			rw.awaitRate(t, 400)

			restore()
			want, wantRate := backedUp, config.Rate(100)
			if tc.pass {
				for at := int64(0); at <= rev; {
					put, err := cli.Put(ctx, "/not-the-config", "x")
					if err != nil {
						t.Fatal(err)
					}
					at = put.Header.Revision
				}
			} else {
				// The next apply lands at a revision the watcher saw before
				// the restore.
				if want, err = writer.Apply(ctx, withReadRate(500), backedUp); err != nil {
					t.Fatal(err)
				}
				if wantRate = 500; want > rev {
					t.Fatalf("the apply after the restore is at revision %d, past %d: etcd did not go back", want, rev)
				}
			}
			// A probe finds it, and the read after it is retried at most as
			// often as an outage's.
			wait := 4 * (watchProbeInterval + watchRequestTimeout + watchRetryMax)
			for deadline := time.Now().Add(wait); ; {
				cfg, got := rw.Live()
				if got == want {
					if readRate(cfg) != wantRate {
						t.Fatalf("revision %d live with rate %v, want %v", want, readRate(cfg), wantRate)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("watcher runs revision %d (rate %v) %v after the restore; etcd holds revision %d (rate %v)",
						got, readRate(cfg), wait, want, wantRate)
				}
				time.Sleep(watchProbeInterval / 20) // polling the watcher with a deadline
			}
			rw.awaitLog(t, "etcd revision went backwards")
		})
	}
}
