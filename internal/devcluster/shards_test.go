package devcluster

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/config"
)

// TestDevModeRunsTheConfiguredShards: with global_shards 2, dev mode runs
// both allocator shards; every region holds a static lease from each
// (none is left on its floor) and both shards' leaders learn and lead.
func TestDevModeRunsTheConfiguredShards(t *testing.T) {
	cfg := config.Default()
	cfg.GlobalShards = 2
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- RunDev(ctx, DevOptions{Config: cfg, Region: "us-east", Out: w,
			Listen: ListenAddrs{GRPC: "127.0.0.1:0", HTTP: "127.0.0.1:0"}})
		w.Close()
	}()
	defer func() {
		cancel()
		go io.Copy(io.Discard, r)
		if err := <-done; err != nil {
			t.Errorf("RunDev: %v", err)
		}
	}()
	var shard1, floor, learned bool
	lines := bufio.NewScanner(r)
	for lines.Scan() {
		l := lines.Text()
		shard1 = shard1 || strings.HasPrefix(strings.TrimSpace(l), "shard 1 ")
		floor = floor || strings.Contains(l, "on the floor")
		if strings.Contains(l, "has learned") {
			learned = true
			break
		}
	}
	if !shard1 || floor || !learned {
		t.Fatalf("banner: shard 1 listed %v, a region on its floor %v, learned %v", shard1, floor, learned)
	}
}
