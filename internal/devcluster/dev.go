package devcluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
)

// DevOptions configure RunDev.
type DevOptions struct {
	// Config is the deployment's config. Required.
	Config *config.Config
	// Region is the one region to run; it must be in Config. Required.
	Region string
	// Logger receives the daemons' logs. Optional, default discards.
	Logger *slog.Logger
	// Out receives where everything is and an example call. Optional,
	// default discards.
	Out io.Writer
}

// RunDev is development mode (`regional -dev`): a whole deployment in this
// process — embedded etcd holding the config, the region's Redis
// (redis-server when installed, embedded otherwise), a global allocator
// and the region's regional service with its region leader. It prints
// where everything is and a ready-to-paste example call, serves until ctx
// ends, then stops everything. A region not in the config is an error and
// starts nothing.
func RunDev(ctx context.Context, o DevOptions) error {
	cfg := o.Config
	if cfg == nil {
		return fmt.Errorf("devcluster: dev mode needs a config")
	}
	if _, ok := cfg.Regions[o.Region]; !ok {
		var names []string
		for r := range cfg.Regions {
			names = append(names, r)
		}
		slices.Sort(names)
		return fmt.Errorf("-region %q is not in the config (regions: %v)", o.Region, names)
	}
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	start := time.Now()
	c, err := Start(ctx, Options{
		Config: cfg, Regions: []string{o.Region}, GlobalReplicas: 1,
		AllowEmbeddedRedis: true, Logger: o.Logger,
	})
	if err != nil {
		return err
	}
	defer c.Stop()
	reg := c.Regions[o.Region]
	rep := reg.Replicas[0].Daemon()
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
		var names []string
		for name := range cfg.Classes {
			names = append(names, name)
		}
		slices.Sort(names)
		if len(names) > 0 {
			class = names[0]
		}
	}
	global := c.GlobalAddrs()[0]
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
`, time.Since(start).Round(time.Millisecond), o.Region, rep.GRPCAddr(), rep.HTTPAddr(), global,
		c.EtcdAddr(), reg.Redis.Addr(), redisKind,
		rep.GRPCAddr(), tenant, class,
		c.EtcdAddr(), global)
	<-ctx.Done()
	fmt.Fprintln(out, "stopping")
	return nil
}
