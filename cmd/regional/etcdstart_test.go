package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
)

// TestStartsOnEtcdsConfigWithoutAFile: with -etcd-endpoints and no
// -config, the service starts on the config etcd holds, even when its
// region is not in the built-in sample (it waited for etcd's config
// instead of checking its region against the sample first, and refused to
// start: `region "east" is not in the config`).
func TestStartsOnEtcdsConfigWithoutAFile(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg, err := config.Parse([]byte(`
regions: {east: {weight: 1}, west: {weight: 1}}
classes: {read: {}}
tiers: {free: {read: {rate: 10/s, burst: 10}}}
default_tier: free
`))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := configstore.NewStore(srv.Client(t), "/ours").Apply(ctx, cfg, 0); err != nil {
		t.Fatal(err)
	}
	rs := redistest.Start(t)
	done := make(chan error, 1)
	served := make(chan string, 1)
	go func() {
		done <- runNotifying(ctx, []string{"-region", "east", "-listen", "127.0.0.1:0", "-metrics-listen", "off",
			"-redis-addr", rs.Addr(), "-etcd-endpoints", strings.Join(srv.Endpoints(), ","), "-etcd-prefix", "/ours",
			"-log-level", "error"}, os.Stdout, func(addr string) { served <- addr })
	}()
	select {
	case <-served:
	case err := <-done:
		t.Fatalf("the service ended before it served: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
