package regional_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestAStoppedLeaderSaysItResigned: a region leader stopped (a replica's
// SIGTERM) resigns its election, so another replica takes over at once,
// and says so; its log went from the drain straight to "regional service
// stopped", leaving the operator of a rolling restart to guess whether
// the region waits out a session TTL for its next leader.
func TestAStoppedLeaderSaysItResigned(t *testing.T) {
	ctx := context.Background()
	cfg := leaseConfig(t)
	cli := etcdtest.Start(t).Client(t)
	d := startLeadingAllocator(ctx, t, cli, "/sl", configtest.NewSource(cfg, 1))
	rs := redistest.Start(t)
	logs := &logtest.Buffer{}
	srv, err := regional.New(regional.Options{Region: "eu", Redis: rs.Client(), Config: regional.StaticConfig{C: cfg},
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	l, err := regional.NewLeader(srv, regional.LeaderOptions{Etcd: cli, ElectionPrefix: "/sl/election/", Global: serviceTier{d.Service}, Identity: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Run(rctx) }()
	defer func() { cancel(); <-done }()
	// Ten session TTLs (the default, 5s): a lone candidate wins at once.
	patience := 50 * time.Second
	for deadline := time.Now().Add(patience); !l.IsLeading(); {
		if time.Now().After(deadline) {
			t.Fatalf("no region leader elected within %v\n%s", patience, logs.String())
		}
		time.Sleep(10 * time.Millisecond) // polling the election with a deadline
	}
	cancel()
	<-done
	const resigned = `level=INFO msg="resigned the region's leadership; another replica takes over at once" region=eu`
	if !strings.Contains(logs.String(), resigned) {
		t.Errorf("the log of a stopped leader lacks %q:\n%s", resigned, logs.String())
	}
	resp, err := cli.Get(ctx, "/sl/election/region/eu", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the region's election after the stop: %v (%v), want no key left", resp.Kvs, err)
	}
}
