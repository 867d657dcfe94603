package devcluster

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/configstore"
)

// StartAgent runs a local agent (pkg/agent, as cmd/agent runs it) of
// region: a lease client of the region's first replica, following the
// config in etcd, answering Envoy's rate limit service and POST /v1/allow
// on free loopback ports. It returns once the agent serves etcd's config,
// so a request sent right after is decided, not answered "no config
// loaded yet". Stop (the cluster's) stops it first, so it returns its
// tokens while the region still runs.
func (c *Cluster) StartAgent(region string) (*agent.Agent, error) {
	c.mu.Lock()
	reg := c.Regions[region]
	c.mu.Unlock()
	if reg == nil || len(reg.Replicas) == 0 {
		return nil, fmt.Errorf("devcluster: no region %q to run an agent of", region)
	}
	cli, err := c.NewEtcdClient()
	if err != nil {
		return nil, err
	}
	registry := prometheus.NewRegistry()
	store := configstore.NewStore(cli, c.opts.Prefix)
	watcher := configstore.NewWatcher(store, c.opts.Config, c.opts.Logger, registry)
	ctx, stopWatch := context.WithCancel(c.ctx)
	watched := make(chan struct{})
	go func() { watcher.Run(ctx); close(watched) }()
	c.onStop(func() { stopWatch(); <-watched })
	if _, err := configstore.AwaitEtcdConfig(ctx, store, nil, watcher, c.opts.Logger); err != nil {
		return nil, fmt.Errorf("devcluster: agent of region %s: %w", region, err)
	}
	a, err := agent.Start(agent.Options{
		RegionAddr: reg.Replicas[0].Addr(), Region: region, Config: agent.Watched{W: watcher},
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		Registry: registry, Logger: c.opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("devcluster: agent of region %s: %w", region, err)
	}
	c.onStop(a.Stop)
	return a, nil
}
