package regional_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// restartRig is two regions reporting to the real allocator daemon: us on
// a config source the test sets (cut off from etcd when the test says
// so), eu on the real configstore Watcher of the config in a real etcd,
// each with its real Redis. eu's process can be restarted: a new Watcher
// and Server on the same Redis.
type restartRig struct {
	cli       *clientv3.Client
	store     *configstore.Store
	globalSrc *configtest.Source
	alloc     *allocator.Daemon
	us        *leadRegion
	euRedis   *redis.Client
	eu        *regional.Server
	euWatch   *configstore.Watcher
	euLeader  *regional.Leader
	stopEU    func()
}

var restartKey = quota.Key{Tenant: "acme", Class: "write"}

func newRestartRig(ctx context.Context, t *testing.T, prefix string, first *config.Config) (*restartRig, int64) {
	t.Helper()
	r := &restartRig{cli: etcdtest.Start(t).Client(t)}
	r.store = configstore.NewStore(r.cli, prefix)
	rev, err := r.store.Apply(ctx, first, 0)
	if err != nil {
		t.Fatal(err)
	}
	r.globalSrc = configtest.NewSource(first, rev)
	r.alloc = startLeadingAllocator(ctx, t, r.cli, prefix, r.globalSrc)
	usSrc := configtest.NewSource(first, rev)
	usRedis := redistest.Start(t).Client()
	usSrv, err := regional.New(regional.Options{Region: "us", Redis: usRedis, Config: usSrc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(usSrv.Close)
	r.us = &leadRegion{src: usSrc, srv: usSrv, rdb: usRedis, leader: r.leader(t, prefix, usSrv, "us")}
	r.euRedis = redistest.Start(t).Client()
	r.startEU(ctx, t, prefix)
	t.Cleanup(func() { r.stopEU() })
	return r, rev
}

func (r *restartRig) leader(t *testing.T, prefix string, srv *regional.Server, name string) *regional.Leader {
	t.Helper()
	l, err := regional.NewLeader(srv, regional.LeaderOptions{
		Etcd: r.cli, ElectionPrefix: prefix + "/election/", Global: serviceTier{r.alloc.Service}, Identity: name,
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// startEU starts eu's process as cmd/regional does: a Watcher, the config
// etcd holds awaited, then the server with its chain resumed (the result
// of ResumeChain returned).
func (r *restartRig) startEU(ctx context.Context, t *testing.T, prefix string) error {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	w := configstore.NewWatcher(configstore.NewStore(r.cli, prefix), nil, quiet, nil)
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(wctx) }()
	if _, err := configstore.AwaitEtcdConfig(ctx, r.store, nil, w, quiet); err != nil {
		cancel()
		<-done
		t.Fatal(err)
	}
	srv, err := regional.New(regional.Options{Region: "eu", Redis: r.euRedis, Config: w})
	if err != nil {
		t.Fatal(err)
	}
	r.stopEU = func() { srv.Close(); cancel(); <-done }
	resumed := srv.ResumeChain(ctx)
	r.eu, r.euWatch, r.euLeader = srv, w, r.leader(t, prefix, srv, "eu")
	return resumed
}

func (r *restartRig) restartEU(ctx context.Context, t *testing.T, prefix string) error {
	t.Helper()
	r.stopEU()
	return r.startEU(ctx, t, prefix)
}

func (r *restartRig) syncEU(ctx context.Context, t *testing.T) {
	t.Helper()
	syncRetrying(ctx, t, "eu: ", r.euLeader)
}

// syncBoth is a round of untilConfirmed: eu's leader syncs, then us's.
func (r *restartRig) syncBoth(ctx context.Context) func() error {
	return func() error {
		if err := r.euLeader.SyncOnce(ctx, nil); err != nil {
			return err
		}
		return r.us.leader.SyncOnce(ctx, nil)
	}
}

// rates are the static rates eu and us hand their scripts for
// restartKey.
func (r *restartRig) rates(t *testing.T) (eu, us float64) {
	t.Helper()
	_, c, _, err := r.eu.CommonFor(r.euWatch.Current(), restartKey)
	if err != nil {
		t.Fatal(err)
	}
	_, cu, _, err := r.us.srv.CommonFor(r.us.src.Current(), restartKey)
	if err != nil {
		t.Fatal(err)
	}
	return c.StaticRate, cu.StaticRate
}

func (r *restartRig) check(t *testing.T, step string, wantEU, wantUS float64) {
	t.Helper()
	eu, us := r.rates(t)
	if eu+us > 100*(1+1e-9) {
		t.Errorf("%s: static rates eu %v + us %v exceed r = 100", step, eu, us)
	}
	if !near(eu, wantEU) || !near(us, wantUS) {
		t.Errorf("%s: static rates eu %v us %v, want %v and %v", step, eu, us, wantEU, wantUS)
	}
}

// confirmBoth has both regions report until revision rev is stored as
// confirmed in eu's Redis.
func (r *restartRig) confirmBoth(ctx context.Context, t *testing.T, rev int64) {
	t.Helper()
	r.syncEU(ctx, t)
	r.us.sync(ctx, t)
	r.syncEU(ctx, t)
	v, err := r.euRedis.Get(ctx, luascripts.DefaultPrefix+"confirmed").Int64()
	if err != nil || v != rev {
		t.Fatalf("eu stored confirmed revision %v (%v), want %d", v, err, rev)
	}
}

// TestRestartOntoARaisedWeightWaitsForEveryRegion: both regions run
// revision A and it is confirmed; a weight raise for eu (revision B) is
// written to etcd while us, cut off, keeps A. eu's process restarts onto
// B: it reads A back from etcd (the revision its leader stored as
// confirmed) and keeps A's smaller share until the global tier confirms
// B, which it does only once us adopts and reports B. A process that
// counted B as confirmed from its start ran 75/s beside us's 50/s.
func TestRestartOntoARaisedWeightWaitsForEveryRegion(t *testing.T) {
	ctx := context.Background()
	const prefix = "/rs"
	old, grown := weightsConfig(t, 1, 1), weightsConfig(t, 3, 1) // eu 50/s → 75/s, us 50/s → 25/s
	r, revA := newRestartRig(ctx, t, prefix, old)
	r.confirmBoth(ctx, t, revA)
	r.check(t, "both on revision A, confirmed", 50, 50)

	revB, err := r.store.Apply(ctx, grown, revA)
	if err != nil {
		t.Fatal(err)
	}
	r.globalSrc.Set(grown, revB) // us is cut off from etcd: it keeps A
	if err := r.restartEU(ctx, t, prefix); err != nil {
		t.Fatalf("eu restarted onto revision B: %v", err)
	}
	if got := r.euWatch.Revision(); got != revB {
		t.Fatalf("eu restarted on revision %d, want B = %d", got, revB)
	}
	r.syncEU(ctx, t) // its static lease: it runs its static share
	r.check(t, "eu restarted onto the raised weight", 50, 50)
	r.us.sync(ctx, t)
	r.syncEU(ctx, t)
	r.check(t, "the global tier heard eu on B and us on A", 50, 50)

	r.us.src.Set(grown, revB)
	r.check(t, "us adopted its smaller weight", 50, 25)
	r.us.sync(ctx, t) // every region reported B now
	r.syncEU(ctx, t)
	r.check(t, "every region reported B, not confirmed yet", 50, 25)
	untilConfirmed(ctx, t, grown, revB, r.syncBoth(ctx), r.euRedis, r.us.rdb)
	r.check(t, "the global tier confirmed revision B", 75, 25)
}

// TestRestartWithTheConfirmedRevisionCompacted: when etcd compacted the
// revision eu's leader stored as confirmed, and the revision before the
// new config's commit too, the restarted process cannot know the old
// config: it says so (configstore.ErrHistoryGone) and counts the config
// it starts on as confirmed, as a process with no history does (the
// residual gap of docs/architecture.md).
func TestRestartWithTheConfirmedRevisionCompacted(t *testing.T) {
	ctx := context.Background()
	const prefix = "/rc"
	old, grown := weightsConfig(t, 1, 1), weightsConfig(t, 3, 1)
	r, revA := newRestartRig(ctx, t, prefix, old)
	r.confirmBoth(ctx, t, revA)
	revB, err := r.store.Apply(ctx, grown, revA)
	if err != nil {
		t.Fatal(err)
	}
	r.globalSrc.Set(grown, revB)
	put, err := r.cli.Put(ctx, "/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.cli.Compact(ctx, put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if err := r.restartEU(ctx, t, prefix); !errors.Is(err, configstore.ErrHistoryGone) {
		t.Fatalf("eu restarted with revision A compacted: %v, want ErrHistoryGone", err)
	} else if regional.ResumeChainRetryable(err) {
		t.Fatalf("eu restarted with revision A compacted: %v counts as passing, but reading again finds it no less compacted", err)
	}
	r.syncEU(ctx, t)
	// The fallback, the residual gap: Σ static rates 125 above r = 100
	// until us adopts B.
	if eu, us := r.rates(t); !near(eu, 75) || !near(us, 50) {
		t.Fatalf("eu restarted onto B with A unknown: static rates eu %v us %v, want 75 and 50", eu, us)
	}
}

// TestRestartBoundedByAConfirmationNotYetStored: revision Z (a smaller
// weight for eu, a larger one for us) is confirmed when us reports it,
// and us runs its raised share at once; eu, which ran Z too, has not
// synced since, so its Redis still holds A as confirmed. A raise for eu
// (C) is written while us, cut off, keeps Z, and eu's process restarts
// onto C. It reads A and every config committed after it (Z), so Z still
// bounds it: A and C alone would let eu run 50/s beside us's 75/s.
func TestRestartBoundedByAConfirmationNotYetStored(t *testing.T) {
	ctx := context.Background()
	const prefix = "/rz"
	a, z, c := weightsConfig(t, 1, 1), weightsConfig(t, 1, 3), weightsConfig(t, 3, 1) // eu 50, 25, 75/s; us 50, 75, 25/s
	r, revA := newRestartRig(ctx, t, prefix, a)
	r.confirmBoth(ctx, t, revA)

	updates, stop := r.euWatch.Subscribe()
	revZ, err := r.store.Apply(ctx, z, revA)
	if err != nil {
		t.Fatal(err)
	}
	for r.euWatch.Revision() != revZ {
		select {
		case <-updates:
		case <-time.After(10 * time.Second):
			t.Fatalf("eu's watcher did not adopt revision Z (%d) within 10s", revZ)
		}
	}
	stop()
	r.globalSrc.Set(z, revZ)
	r.us.src.Set(z, revZ)
	r.syncEU(ctx, t) // eu reports A and Z
	// us too: Z is confirmed once grants sized before have ended, and us
	// stores it.
	untilConfirmed(ctx, t, z, revZ, func() error { return r.us.leader.SyncOnce(ctx, nil) }, r.us.rdb)
	r.check(t, "Z confirmed; eu not told yet", 25, 75)
	if v, err := r.euRedis.Get(ctx, luascripts.DefaultPrefix+"confirmed").Int64(); err != nil || v != revA {
		t.Fatalf("eu stored confirmed revision %v (%v), want A = %d", v, err, revA)
	}

	revC, err := r.store.Apply(ctx, c, revZ)
	if err != nil {
		t.Fatal(err)
	}
	r.globalSrc.Set(c, revC) // us is cut off: it keeps Z
	if err := r.restartEU(ctx, t, prefix); err != nil {
		t.Fatalf("eu restarted onto revision C: %v", err)
	}
	r.syncEU(ctx, t) // told Z is confirmed now
	r.check(t, "eu restarted onto C with Z confirmed", 25, 75)

	r.us.src.Set(c, revC)
	untilConfirmed(ctx, t, c, revC, r.syncBoth(ctx), r.euRedis, r.us.rdb)
	r.check(t, "the global tier confirmed revision C", 75, 25)
}
