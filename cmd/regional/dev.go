package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/pkg/config"
)

// runDev runs a whole deployment in this process — embedded etcd holding
// cfg, the region's Redis (redis-server when installed, embedded
// otherwise), a global allocator and the regional service with its region
// leader — prints where everything is and an example call, and serves
// until ctx ends.
func runDev(ctx context.Context, f *flags, cfg *config.Config, logger *slog.Logger, out io.Writer) error {
	if _, ok := cfg.Regions[f.region]; !ok {
		return fmt.Errorf("-region %q is not in the config (regions: %v)", f.region, regionNames(cfg))
	}
	start := time.Now()
	c, err := devcluster.Start(ctx, devcluster.Options{
		Config: cfg, Regions: []string{f.region}, GlobalReplicas: 1,
		AllowEmbeddedRedis: true, Logger: logger,
	})
	if err != nil {
		return err
	}
	defer c.Stop()
	reg := c.Regions[f.region]
	rep := reg.Replicas[0].Daemon
	redisKind := "redis-server"
	if reg.Redis.Embedded() {
		redisKind = "embedded Redis (redis-server not installed)"
	}
	tenant := "acme"
	if _, ok := cfg.Tenants[tenant]; !ok {
		tenant = "demo"
	}
	class := "read"
	if _, ok := cfg.Classes[class]; !ok {
		for name := range cfg.Classes {
			class = name
			break
		}
	}
	fmt.Fprintf(out, `Sluice dev mode is up (%v)
  region %-10s LeaseService + health  %s
                    metrics                 http://%s/metrics
  global allocator  AllocatorService        %s
  etcd              %s
  redis             %s (%s)

Take a lease (ready to paste):
  go run ./cmd/sluicectl lease -addr %s -tenant %s -class %s -want 10

See the allocation:
  go run ./cmd/sluicectl -etcd-endpoints %s -global-addr %s status

Ctrl-C stops everything.
`, time.Since(start).Round(time.Millisecond), f.region, rep.GRPCAddr(), rep.HTTPAddr(), c.GlobalAddrs()[0],
		c.Etcd.Clients[0].Addr(), reg.Redis.Addr(), redisKind,
		rep.GRPCAddr(), tenant, class,
		c.Etcd.Clients[0].Addr(), c.GlobalAddrs()[0])
	<-ctx.Done()
	fmt.Fprintln(out, "stopping")
	return nil
}

func regionNames(cfg *config.Config) []string {
	var out []string
	for r := range cfg.Regions {
		out = append(out, r)
	}
	return out
}
