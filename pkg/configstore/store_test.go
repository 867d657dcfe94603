package configstore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/pkg/config"
)

// waitFor bounds every wait on etcd or the watcher; generous because the
// machine running the tests may be busy.
const waitFor = 20 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

// withReadRate is the sample with tiers.free.read at rate r: configs that
// differ in one visible place.
func withReadRate(r config.Rate) *config.Config {
	c := config.Default()
	c.Tiers["free"]["read"] = config.LimitSpec{Rate: r, Burst: 20}
	return c
}

func readRate(c *config.Config) config.Rate { return c.Tiers["free"]["read"].Rate }

// readTestdata is one of pkg/config's test configs.
func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "config", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// putWhole writes cfg as one document past the store (as a hand-run tool
// or an older release could), with its tenants inside it.
func putWhole(t *testing.T, ctx context.Context, cli *clientv3.Client, store *Store, cfg *config.Config) *clientv3.PutResponse {
	t.Helper()
	data, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	put, err := cli.Put(ctx, store.Key(), string(data))
	if err != nil {
		t.Fatal(err)
	}
	return put
}

// newStore starts an embedded etcd and a Store on it under the default
// prefix, with a context that ends with the test.
func newStore(t *testing.T) (*clientv3.Client, *Store, context.Context) {
	t.Helper()
	cli := etcdtest.Start(t).Client(t)
	return cli, NewStore(cli, ""), testContext(t)
}

// storeWithDefault starts an embedded etcd and a Store on it holding
// config.Default() as its first revision, rev.
func storeWithDefault(t *testing.T) (cli *clientv3.Client, store *Store, ctx context.Context, rev int64) {
	t.Helper()
	cli, store, ctx = newStore(t)
	rev, err := store.Apply(ctx, config.Default(), 0)
	if err != nil {
		t.Fatal(err)
	}
	return cli, store, ctx, rev
}

// snapshot is everything in etcd under prefix, and the store revision.
func snapshot(t *testing.T, cli *clientv3.Client, prefix string) (string, int64) {
	t.Helper()
	resp, err := cli.Get(testContext(t), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, kv := range resp.Kvs {
		b.WriteString(string(kv.Key) + "=" + string(kv.Value) + "\n")
	}
	return b.String(), resp.Header.Revision
}

func TestStoreApplyGetRoundTrip(t *testing.T) {
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "/test/")
	ctx := testContext(t)
	if store.Key() != "/test/config" || store.ElectionPrefix() != "/test/election/" {
		t.Fatalf("keys = %q, %q", store.Key(), store.ElectionPrefix())
	}

	got, rev, err := store.Get(ctx)
	if got != nil || rev != 0 || err != nil {
		t.Fatalf("Get on empty etcd = %v, %d, %v; want nil, 0, nil", got, rev, err)
	}

	want, err := config.Parse(readTestdata(t, "full.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rev1, err := store.Apply(ctx, want, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, rev, err = store.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rev != rev1 || !reflect.DeepEqual(got, want) {
		t.Fatalf("Get = rev %d (want %d), diff:\n%s", rev, rev1, config.Diff(want, got))
	}

	rev2, err := store.Apply(ctx, config.Default(), rev1)
	if err != nil {
		t.Fatal(err)
	}
	if rev2 <= rev1 {
		t.Fatalf("second apply at revision %d, not after %d", rev2, rev1)
	}
	if got, rev, err = store.Get(ctx); err != nil || rev != rev2 || !reflect.DeepEqual(got, config.Default()) {
		t.Fatalf("Get after second apply = rev %d, %v", rev, err)
	}
}

func TestStoreApplyRefusesInvalidConfig(t *testing.T) {
	cli, store, ctx := newStore(t)

	bad := withReadRate(0)
	if _, err := store.Apply(ctx, bad, 0); !errors.Is(err, config.ErrInvalidConfig) {
		t.Fatalf("Apply of an invalid config to empty etcd: %v", err)
	}
	if all, _ := snapshot(t, cli, config.DefaultPrefix); all != "" {
		t.Fatalf("empty etcd now holds:\n%s", all)
	}

	rev, err := store.Apply(ctx, config.Default(), 0)
	if err != nil {
		t.Fatal(err)
	}
	before, beforeRev := snapshot(t, cli, config.DefaultPrefix)
	_, err = store.Apply(ctx, bad, rev)
	if !errors.Is(err, config.ErrInvalidConfig) || !strings.Contains(err.Error(), `tiers.free.read.rate: must be > 0, got "0/s"`) {
		t.Fatalf("Apply of rate 0: %v", err)
	}
	if _, err := store.Apply(ctx, nil, rev); !errors.Is(err, config.ErrInvalidConfig) {
		t.Fatalf("Apply(nil): %v", err)
	}
	after, afterRev := snapshot(t, cli, config.DefaultPrefix)
	if after != before || afterRev != beforeRev {
		t.Fatalf("etcd changed: revision %d -> %d\n%s\n---\n%s", beforeRev, afterRev, before, after)
	}
}

func TestStoreApplyConflicts(t *testing.T) {
	_, store, ctx := newStore(t)

	rev1, err := store.Apply(ctx, withReadRate(1), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Apply(ctx, withReadRate(2), 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("create over an existing config: %v", err)
	}
	rev2, err := store.Apply(ctx, withReadRate(3), rev1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = store.Apply(ctx, withReadRate(4), rev1)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "expected") {
		t.Fatalf("stale revision: %v", err)
	}
	if got, rev, err := store.Get(ctx); err != nil || rev != rev2 || readRate(got) != 3 {
		t.Fatalf("after conflicts Get = rev %d (want %d), %v", rev, rev2, err)
	}

	// Two writers racing from the same revision: exactly one wins.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { _, errs[i] = store.Apply(ctx, withReadRate(config.Rate(10+i)), rev2) })
	}
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, ErrConflict):
			t.Fatalf("racing apply: %v", err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d racing applies won, want 1 (%v)", wins, errs)
	}
}

func TestStoreGetReportsInvalidContent(t *testing.T) {
	cli, store, ctx := newStore(t)
	put, err := cli.Put(ctx, store.Key(), "epoch: soon\n")
	if err != nil {
		t.Fatal(err)
	}
	c, rev, err := store.Get(ctx)
	if c != nil || rev != put.Header.Revision || !errors.Is(err, config.ErrInvalidConfig) {
		t.Fatalf("Get of garbage = %v, %d, %v", c, rev, err)
	}
	// Its revision lets an operator replace it.
	if _, err := store.Apply(ctx, config.Default(), rev); err != nil {
		t.Fatal(err)
	}
}

type runningWatcher struct {
	*Watcher
	reg      *prometheus.Registry
	logs     *logtest.Buffer
	updates  <-chan *config.Config
	cancel   context.CancelFunc
	finished chan struct{} // closed when Run has returned
	runErr   error         // Run's result; read after finished is closed
	awaited  bool          // the test checked Run's result itself
	// patience, when longer than waitFor, bounds awaitRevision instead.
	patience time.Duration
}

// startWatcher runs a Watcher until the test ends (or stop is called).
func startWatcher(t *testing.T, store *Store, fallback *config.Config) *runningWatcher {
	t.Helper()
	rw := &runningWatcher{reg: prometheus.NewRegistry(), logs: &logtest.Buffer{}, finished: make(chan struct{})}
	rw.Watcher = NewWatcher(store, fallback, slog.New(slog.NewTextHandler(rw.logs, nil)), rw.reg)
	rw.updates, _ = rw.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	rw.cancel = cancel
	go func() {
		defer close(rw.finished)
		rw.runErr = rw.Run(ctx)
	}()
	t.Cleanup(func() {
		if err := rw.stop(); err != nil && !rw.awaited {
			t.Errorf("Run: %v", err)
		}
		if t.Failed() {
			t.Logf("watcher log:\n%s", rw.logs)
		}
	})
	return rw
}

// wait waits for Run to return by itself and returns its error.
func (rw *runningWatcher) wait(t *testing.T) error {
	t.Helper()
	rw.awaited = true
	select {
	case <-rw.finished:
		return rw.runErr
	case <-time.After(waitFor):
		t.Fatalf("Run did not return within %v", waitFor)
		return nil
	}
}

// stop ends Run's context and returns Run's error.
func (rw *runningWatcher) stop() error {
	rw.cancel()
	select {
	case <-rw.finished:
		return rw.runErr
	case <-time.After(waitFor):
		return errors.New("Run did not return after its context ended")
	}
}

// awaitRate waits for the watcher to publish a config with the given
// free/read rate, skipping older ones.
func (rw *runningWatcher) awaitRate(t *testing.T, want config.Rate) *config.Config {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	for {
		select {
		case c := <-rw.updates:
			if readRate(c) == want {
				return c
			}
		case <-timer.C:
			t.Fatalf("watcher did not publish rate %v within %v; live rate %v at revision %d",
				want, waitFor, readRate(rw.Current()), rw.Revision())
			return nil
		}
	}
}

func (rw *runningWatcher) metric(t *testing.T, name string) float64 {
	t.Helper()
	families, err := rw.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		m := f.GetMetric()[0]
		if m.GetCounter() != nil {
			return m.GetCounter().GetValue()
		}
		return m.GetGauge().GetValue()
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// awaitMetric polls a metric until it reaches want, then checks it did not
// overshoot.
func (rw *runningWatcher) awaitMetric(t *testing.T, name string, want float64) {
	t.Helper()
	deadline := time.NewTimer(waitFor)
	defer deadline.Stop()
	poll := time.NewTicker(5 * time.Millisecond)
	defer poll.Stop()
	for rw.metric(t, name) < want {
		select {
		case <-poll.C:
		case <-deadline.C:
			t.Fatalf("%s = %v, want %v within %v", name, rw.metric(t, name), want, waitFor)
		}
	}
	if got := rw.metric(t, name); got != want {
		t.Fatalf("%s = %v, want exactly %v", name, got, want)
	}
}

func TestWatcherHotReloadsValidChanges(t *testing.T) {
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "")
	ctx := testContext(t)

	fallback := withReadRate(1)
	rw := startWatcher(t, store, fallback)
	if rw.Current() != fallback || rw.Revision() != 0 {
		t.Fatal("the fallback is not live before etcd has a config")
	}

	rev1, err := store.Apply(ctx, withReadRate(100), 0)
	if err != nil {
		t.Fatal(err)
	}
	got := rw.awaitRate(t, 100)
	if rw.Current() != got || rw.Revision() != rev1 {
		t.Fatalf("live config is not the published one (revision %d, want %d)", rw.Revision(), rev1)
	}
	if v := rw.metric(t, "sluice_config_last_applied_revision"); v != float64(rev1) {
		t.Fatalf("last applied revision metric = %v, want %d", v, rev1)
	}

	rev2, err := store.Apply(ctx, withReadRate(200), rev1)
	if err != nil {
		t.Fatal(err)
	}
	rw.awaitRate(t, 200)
	if rw.Revision() != rev2 || rw.metric(t, "sluice_config_last_applied_revision") != float64(rev2) {
		t.Fatalf("revision %d, metric %v; want %d", rw.Revision(), rw.metric(t, "sluice_config_last_applied_revision"), rev2)
	}
	if v := rw.metric(t, "sluice_config_applied_total"); v != 2 {
		t.Fatalf("applied_total = %v, want 2", v)
	}
	if v := rw.metric(t, "sluice_config_rejected_total"); v != 0 {
		t.Fatalf("rejected_total = %v, want 0", v)
	}
}

func TestWatcherRefusesInvalidConfig(t *testing.T) {
	cli, store, ctx := newStore(t)

	rev1, err := store.Apply(ctx, withReadRate(100), 0)
	if err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	good := rw.awaitRate(t, 100)

	// Apply refuses invalid configs, so write one past it, as a buggy or
	// hand-run tool could.
	data, err := withReadRate(100).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte("rate: 100/s")) {
		t.Fatalf("rendering lacks the free/read rate:\n%s", data)
	}
	data = bytes.Replace(data, []byte("rate: 100/s"), []byte("rate: 0/s"), 1)
	put, err := cli.Put(ctx, store.Key(), string(data))
	if err != nil {
		t.Fatal(err)
	}
	rw.awaitMetric(t, "sluice_config_rejected_total", 1)
	if rw.Current() != good || rw.Revision() != rev1 {
		t.Fatalf("invalid config replaced the live one (revision %d, want %d)", rw.Revision(), rev1)
	}
	if v := rw.metric(t, "sluice_config_last_applied_revision"); v != float64(rev1) {
		t.Fatalf("last applied revision metric = %v, want %d", v, rev1)
	}
	logs := rw.logs.String()
	if !strings.Contains(logs, "refused invalid config") || !strings.Contains(logs, `tiers.free.read.rate: must be > 0`) {
		t.Fatalf("log does not name the problem:\n%s", logs)
	}

	if _, err := store.Apply(ctx, withReadRate(300), put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	rw.awaitRate(t, 300)
	if v := rw.metric(t, "sluice_config_rejected_total"); v != 1 {
		t.Fatalf("rejected_total = %v after a valid change, want 1", v)
	}
}

func TestWatcherStartsOnFallbackWhenEtcdHoldsGarbage(t *testing.T) {
	cli, store, ctx := newStore(t)
	put, err := cli.Put(ctx, store.Key(), "regions: {}\n")
	if err != nil {
		t.Fatal(err)
	}
	fallback := withReadRate(5)
	rw := startWatcher(t, store, fallback)
	rw.awaitMetric(t, "sluice_config_rejected_total", 1)
	if rw.Current() != fallback || rw.Revision() != 0 {
		t.Fatal("fallback is not live after the etcd config was refused")
	}
	if _, err := store.Apply(ctx, withReadRate(6), put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	rw.awaitRate(t, 6)
}

func TestWatcherSurvivesEtcdRestart(t *testing.T) {
	srv := etcdtest.Start(t)
	store := NewStore(srv.Client(t), "")
	writer := NewStore(srv.Client(t), "")
	ctx := testContext(t)

	rev1, err := writer.Apply(ctx, withReadRate(100), 0)
	if err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	live := rw.awaitRate(t, 100)

	srv.Stop()
	if rw.Current() != live {
		t.Fatal("live config dropped when etcd stopped")
	}
	srv.Restart()

	// The writer reconnects too; retry its first write until it gets through.
	deadline := time.Now().Add(waitFor)
	for {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := writer.Apply(wctx, withReadRate(200), rev1)
		cancel()
		if err == nil {
			break
		}
		if errors.Is(err, ErrConflict) {
			// An earlier attempt may have committed with its reply lost.
			if c, _, gerr := writer.Get(ctx); gerr == nil && readRate(c) == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("apply after restart: %v", err)
		}
	}
	rw.awaitRate(t, 200)
}

// TestWatcherRecoversFromCompaction cuts the watcher off while the config
// changes twice and the history is compacted, so its watch cannot resume
// where it was; it must read the config again and go on watching.
func TestWatcherRecoversFromCompaction(t *testing.T) {
	srv := etcdtest.Start(t)
	link := srv.Link(t)
	store := NewStore(link.Client(t), "")
	writer := NewStore(srv.Client(t), "")
	ctx := testContext(t)

	rev1, err := writer.Apply(ctx, withReadRate(100), 0)
	if err != nil {
		t.Fatal(err)
	}
	rw := startWatcher(t, store, nil)
	rw.awaitRate(t, 100)

	link.Cut()
	rev2, err := writer.Apply(ctx, withReadRate(200), rev1)
	if err != nil {
		t.Fatal(err)
	}
	rev3, err := writer.Apply(ctx, withReadRate(300), rev2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client(t).Compact(ctx, rev3); err != nil {
		t.Fatal(err)
	}
	link.Mend()

	rw.awaitRate(t, 300)
	if rw.Revision() != rev3 {
		t.Fatalf("revision %d, want %d", rw.Revision(), rev3)
	}
	if v := rw.metric(t, "sluice_config_watch_errors_total"); v < 1 {
		t.Fatalf("watch_errors_total = %v: the compacted watch was not noticed", v)
	}
	if logs := rw.logs.String(); !strings.Contains(logs, "compacted") {
		t.Fatalf("log does not mention the compaction:\n%s", logs)
	}

	// Watching goes on after the re-read.
	if _, err := writer.Apply(ctx, withReadRate(400), rev3); err != nil {
		t.Fatal(err)
	}
	rw.awaitRate(t, 400)
}

func TestWatcherRunRefusesASecondRunAndEndsWhenItsClientCloses(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Link(t).Client(t)
	rw := startWatcher(t, NewStore(cli, ""), nil)
	deadline := time.Now().Add(waitFor)
	for !rw.running.Load() {
		if time.Now().After(deadline) {
			t.Fatal("Run did not start")
		}
		runtime.Gosched()
	}
	if err := rw.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("a second Run returned %v, want an error", err)
	}
	cli.Close()
	if err := rw.wait(t); err == nil || !strings.Contains(err.Error(), "etcd client closed") {
		t.Fatalf("Run returned %v, want an error naming the closed client", err)
	}
}

func TestSubscribersGetTheLatestWithoutBlocking(t *testing.T) {
	w := NewWatcher(NewStore(nil, ""), nil, nil, nil)
	sub, cancel := w.Subscribe()
	updates := w.Updates()
	if w.Updates() != updates {
		t.Fatal("Updates returned a different channel on the second call")
	}
	configs := []*config.Config{withReadRate(1), withReadRate(2), withReadRate(3)}
	for _, c := range configs {
		w.publish(c) // nobody reads: must not block
	}
	for name, ch := range map[string]<-chan *config.Config{"Subscribe": sub, "Updates": updates} {
		select {
		case got := <-ch:
			if got != configs[2] {
				t.Errorf("%s delivered rate %v, want the latest (3)", name, readRate(got))
			}
		default:
			t.Errorf("%s delivered nothing", name)
		}
		select {
		case got := <-ch:
			t.Errorf("%s delivered a second config, rate %v", name, readRate(got))
		default:
		}
	}
	cancel()
	w.publish(configs[0])
	select {
	case <-sub:
		t.Error("a cancelled subscription still receives")
	default:
	}
}
