package devcluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// TestARestartedReplicaStartsOnEtcdsConfig: a regional replica restarted
// after a config change serves etcd's config from its first chain on, as
// cmd/regional does, never the config the cluster started with (its
// config watcher's fallback until the watch's first read). Restarted
// onto the first config, a region drained since ran its full static share
// beside grants sized with it at its floor (live mode's region-drain, Σ
// rates 1.25 r).
func TestARestartedReplicaStartsOnEtcdsConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	var revs []int64 // the current revision of every chain us-east's replica stored, in order
	c, err := Start(ctx, Options{Config: config.Default(), Regions: []string{"us-east"},
		OnChain: func(region string, _ int, ch regionsync.Chain) {
			mu.Lock()
			defer mu.Unlock()
			revs = append(revs, ch.Current().Rev)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()

	_, first, err := c.Store.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	drained := config.Default()
	r := drained.Regions["eu-west"]
	r.Drained = true
	drained.Regions["eu-west"] = r
	rev, err := c.Store.Apply(ctx, drained, first)
	if err != nil {
		t.Fatal(err)
	}
	adopted := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range revs {
			if r == rev {
				return true
			}
		}
		return false
	}
	for !adopted() {
		if ctx.Err() != nil {
			t.Fatalf("the replica never adopted revision %d", rev)
		}
		time.Sleep(10 * time.Millisecond) // polling the chains with the test's deadline
	}

	// Every replica's process serves etcd's config once started, before
	// its daemon reads the config (the watch's first read is not left to
	// win a race).
	p, err := c.startProcess()
	if err != nil {
		t.Fatal(err)
	}
	got := p.watcher.Revision()
	p.end()
	if got != rev {
		t.Fatalf("a process started after revision %d serves revision %d", rev, got)
	}

	rep := c.Regions["us-east"].Replicas[0]
	rep.Kill()
	mu.Lock()
	from := len(revs)
	mu.Unlock()
	if err := rep.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	after := append([]int64(nil), revs[from:]...)
	mu.Unlock()
	if len(after) == 0 {
		t.Fatal("the restarted replica stored no chain before it was up")
	}
	for i, r := range after {
		if r != rev {
			t.Fatalf("the restarted replica's chain %d runs revision %d, want etcd's %d from the first (chains since the restart: %v)", i, r, rev, after)
		}
	}
}
