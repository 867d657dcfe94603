package regional_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// staticWrites watches the scripts that store the static lease (their
// first key the lease's) on a real Redis client: while fail is set each
// fails before reaching Redis; otherwise it runs and ok counts those that
// succeeded.
type staticWrites struct {
	fail       atomic.Bool
	ok, failed atomic.Int64
}

func (*staticWrites) DialHook(next redis.DialHook) redis.DialHook { return next }

func (*staticWrites) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (w *staticWrites) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if (cmd.Name() != "evalsha" && cmd.Name() != "eval") || len(args) < 4 || fmt.Sprint(args[3]) != staticKey {
			return next(ctx, cmd)
		}
		if w.fail.Load() {
			err := errors.New("injected: the static lease write failed")
			cmd.SetErr(err)
			w.failed.Add(1)
			return err
		}
		err := next(ctx, cmd)
		if err == nil {
			w.ok.Add(1)
		}
		return err
	}
}

const staticWriteFailed = "storing the static lease failed"

// TestFailedStaticLeaseWriteIsLogged: a leader whose answer extends the
// static lease logs a warning when storing it in Redis fails, and none
// when it is stored. Real allocator daemon, embedded etcd, real
// redis-server; the write fails by injection on the client.
func TestFailedStaticLeaseWriteIsLogged(t *testing.T) {
	ctx := context.Background()
	r := newLeaseRig(t)
	writes := &staticWrites{}
	r.rdb.AddHook(writes)
	logs := &logtest.Buffer{}
	srv, err := regional.New(regional.Options{Region: "eu", Redis: r.rdb, Config: r.regionCfg,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	l, err := regional.NewLeader(srv, regional.LeaderOptions{
		Etcd: r.cli, ElectionPrefix: "/sl/election/", Global: r.tier, Identity: "eu-logged",
	})
	if err != nil {
		t.Fatal(err)
	}

	// Each round whose write of the lease succeeded logs no warning (a
	// round whose write outlived its deadline on a starved machine may).
	for i := 0; writes.ok.Load() < 2; i++ {
		if i >= 20 {
			t.Fatalf("%d rounds stored the static lease %d times, want 2", i, writes.ok.Load())
		}
		before, stored := logs.Count(staticWriteFailed), writes.ok.Load()
		r.syncOnce(ctx, l)
		if writes.ok.Load() > stored && logs.Count(staticWriteFailed) != before {
			t.Fatalf("a round that stored the static lease logged its failure:\n%s", logs)
		}
	}
	if r.stored() == 0 {
		t.Fatal("no static lease stored")
	}

	writes.fail.Store(true)
	before := logs.Count(staticWriteFailed)
	for i := 0; writes.failed.Load() == 0; i++ {
		if i >= 20 {
			t.Fatalf("%d rounds never tried to store the static lease", i)
		}
		r.syncOnce(ctx, l)
	}
	var line string
	for _, s := range strings.Split(logs.String(), "\n") {
		if strings.Contains(s, staticWriteFailed) && strings.Contains(s, "injected") {
			line = s
		}
	}
	if logs.Count(staticWriteFailed) <= before || line == "" {
		t.Fatalf("a failed write of the static lease logged no warning:\n%s", logs)
	}
	if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "shard=0") {
		t.Fatalf("the failed write's line %q, want a WARN naming shard 0", line)
	}
}
