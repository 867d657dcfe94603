package allocator_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/configstore"
)

// syncBuffer is a log sink the daemon writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRegionLeaseBelowFailoverIsFlagged runs the allocator daemon on
// embedded etcd with its config from etcd (a configstore.Watcher, as
// cmd/global has it) and applies configs whose region_lease is one
// millisecond below, at, and again below FailoverBound of the daemon's
// session TTL and the config's epoch: the check fires at start and on
// every config loaded below the bound (ERROR log, gauge 1) and not at it.
func TestRegionLeaseBelowFailoverIsFlagged(t *testing.T) {
	bound := allocator.FailoverBound(testTTL, testEpoch)
	if want := testTTL + 500*time.Millisecond + 5*testEpoch + testEpoch/4; bound != want {
		t.Fatalf("FailoverBound(%v, %v) = %v, want %v", testTTL, testEpoch, bound, want)
	}
	withLease := func(d time.Duration) string {
		return strings.Replace(twoRegions, "grant_validity: 500ms", fmt.Sprintf("grant_validity: 500ms\nregion_lease: %s", d), 1)
	}
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	store := configstore.NewStore(cli, "/test")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rev, err := store.Apply(ctx, mustConfig(t, withLease(bound-time.Millisecond)), 0)
	if err != nil {
		t.Fatal(err)
	}
	watcher := configstore.NewWatcher(store, nil, nil, nil)
	wctx, stopWatch := context.WithCancel(context.Background())
	watchDone := make(chan error, 1)
	go func() { watchDone <- watcher.Run(wctx) }()
	t.Cleanup(func() { stopWatch(); <-watchDone })
	waitFor(t, 10*time.Second, "the watcher loads the config in etcd", func() bool { return watcher.Revision() == rev })

	logs := &syncBuffer{}
	d, err := allocator.StartDaemon(ctx, allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Etcd: srv.Client(t), Prefix: "/test",
		SessionTTL: testTTL, Config: watcher, DrainTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)

	const below = "region_lease is shorter than the global tier's failover"
	gauge := func(v int) func() bool {
		return func() bool {
			return strings.Contains(scrape(t, d), fmt.Sprintf("\nsluice_global_region_lease_below_failover %d\n", v))
		}
	}
	// At start: below the bound by a millisecond.
	if n := strings.Count(logs.String(), below); n != 1 {
		t.Fatalf("at start with region_lease %v < %v: %d ERROR lines %q, want 1:\n%s", bound-time.Millisecond, bound, n, below, logs)
	}
	if !strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("the line is not at ERROR:\n%s", logs)
	}
	waitFor(t, 5*time.Second, "gauge 1 below the bound", gauge(1))

	// At the bound: covered, the gauge falls, nothing more at ERROR.
	if rev, err = store.Apply(ctx, mustConfig(t, withLease(bound)), rev); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "gauge 0 at the bound", gauge(0))
	if n := strings.Count(logs.String(), below); n != 1 {
		t.Fatalf("region_lease at the bound logged %d ERROR lines in all, want still 1:\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), "region_lease covers the global tier's failover again") {
		t.Fatalf("no INFO line when the config covers the failover again:\n%s", logs)
	}

	// Below again: every config loaded is checked.
	if _, err = store.Apply(ctx, mustConfig(t, withLease(bound-time.Millisecond)), rev); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "gauge 1 below the bound again", gauge(1))
	waitFor(t, 5*time.Second, "a second ERROR line", func() bool { return strings.Count(logs.String(), below) == 2 })
}
