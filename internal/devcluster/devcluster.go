// Package devcluster runs a whole Sluice deployment inside one process:
// an embedded etcd holding the config, one Redis per region (a real
// redis-server when installed, an embedded one otherwise), the regional
// services of every region with their region leaders, and global allocator
// replicas — all talking real gRPC on loopback. Development mode, the
// simulator's live mode and the multi-region tests use it.
package devcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/embedetcd"
	"github.com/sluicehq/sluice/internal/redisproc"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/regional"
)

// Options configure a cluster. Zero values pick the defaults.
type Options struct {
	// Config is written to etcd before anything starts. Required.
	Config *config.Config
	// Regions to run. Optional, default every region of Config.
	Regions []string
	// ReplicasPerRegion is the regional services per region. Optional,
	// default 1.
	ReplicasPerRegion int
	// GlobalReplicas is the global allocator replicas. Optional, default 1;
	// -1 runs none (regions stay on static shares).
	GlobalReplicas int
	// SessionTTL of every election. Optional, default 2s.
	SessionTTL time.Duration
	// AllowEmbeddedRedis falls back to an in-process Redis when
	// redis-server is not installed (logged as a warning). Optional.
	AllowEmbeddedRedis bool
	// DataDir holds etcd's data. Optional, default a fresh temporary
	// directory removed by Stop.
	DataDir string
	// DialGlobal, when set, dials every region leader's connections to the
	// global tier (tests inject partitions with it). Optional.
	DialGlobal func(ctx context.Context, region, addr string) (net.Conn, error)
	// Logger. Optional, default discards.
	Logger *slog.Logger
}

// Cluster is a running deployment. Safe for concurrent use.
type Cluster struct {
	opts    Options
	Etcd    *embed.Etcd
	Client  *clientv3.Client // etcd client for callers (sluicectl-style work)
	Store   *configstore.Store
	Global  []*GlobalReplica
	Regions map[string]*Region

	ctx     context.Context
	cancel  context.CancelFunc
	tmpDir  string
	mu      sync.Mutex // guards closers
	closers []func()
}

// GlobalReplica is one global allocator process.
type GlobalReplica struct {
	Daemon *allocator.Daemon
	etcd   *clientv3.Client
}

// Region is one region's Redis and regional replicas.
type Region struct {
	Name     string
	Redis    *redisproc.Proc
	Replicas []*RegionalReplica
}

// RegionalReplica is one regional process: its daemon, its config watcher
// and its own etcd client.
type RegionalReplica struct {
	Daemon  *regional.Daemon
	Watcher *configstore.Watcher
	Global  *allocator.Client
	etcd    *clientv3.Client
}

// Start brings the cluster up: etcd, config, global replicas, regions.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.Config == nil {
		return nil, errors.New("devcluster: Config is required")
	}
	if len(o.Regions) == 0 {
		for r := range o.Config.Regions {
			o.Regions = append(o.Regions, r)
		}
		slices.Sort(o.Regions)
	}
	if o.ReplicasPerRegion == 0 {
		o.ReplicasPerRegion = 1
	}
	if o.GlobalReplicas == 0 {
		o.GlobalReplicas = 1
	}
	if o.SessionTTL == 0 {
		o.SessionTTL = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	c = &Cluster{opts: o, Regions: map[string]*Region{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	dir := o.DataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "sluice-dev-etcd-"); err != nil {
			return nil, err
		}
		c.tmpDir = dir
	}
	if c.Etcd, err = embedetcd.Start("sluice-dev", dir, nil); err != nil {
		return nil, err
	}
	c.onStop(c.Etcd.Close)
	if c.Client, err = c.NewEtcdClient(); err != nil {
		return nil, err
	}
	c.Store = configstore.NewStore(c.Client, config.DefaultPrefix)
	if _, err := c.Store.Apply(ctx, o.Config, 0); err != nil {
		return nil, fmt.Errorf("devcluster: write config: %w", err)
	}
	for i := 0; i < o.GlobalReplicas; i++ {
		if _, err := c.AddGlobal(ctx); err != nil {
			return nil, err
		}
	}
	for _, name := range o.Regions {
		if _, ok := o.Config.Regions[name]; !ok {
			return nil, fmt.Errorf("devcluster: region %q is not in the config", name)
		}
		p, err := redisproc.Start(o.AllowEmbeddedRedis)
		if err != nil {
			return nil, fmt.Errorf("devcluster: region %s: %w", name, err)
		}
		if p.Embedded() {
			o.Logger.Warn("redis-server is not installed: region runs on an embedded Redis (apt-get install redis-server for the real one)", "region", name)
		}
		c.onStop(p.Stop)
		reg := &Region{Name: name, Redis: p}
		c.Regions[name] = reg
		for i := 0; i < o.ReplicasPerRegion; i++ {
			if _, err := c.AddRegional(ctx, name); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// NewEtcdClient returns a fresh client of the embedded etcd, closed by Stop.
func (c *Cluster) NewEtcdClient() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{c.Etcd.Clients[0].Addr().String()},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(), // the etcd client logs retries of cancelled calls at shutdown
	})
	if err != nil {
		return nil, fmt.Errorf("devcluster: etcd client: %w", err)
	}
	c.onStop(func() { cli.Close() })
	return cli, nil
}

// AddGlobal starts one more global allocator replica.
func (c *Cluster) AddGlobal(ctx context.Context) (*GlobalReplica, error) {
	cli, err := c.NewEtcdClient()
	if err != nil {
		return nil, err
	}
	store := configstore.NewStore(cli, config.DefaultPrefix)
	reg := prometheus.NewRegistry()
	w := configstore.NewWatcher(store, c.opts.Config, c.opts.Logger, reg)
	go w.Run(c.ctx)
	d, err := allocator.StartDaemon(ctx, allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Etcd: cli,
		SessionTTL: c.opts.SessionTTL, Config: w, Registry: reg, Logger: c.opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("devcluster: global replica: %w", err)
	}
	c.onStop(d.Stop)
	g := &GlobalReplica{Daemon: d, etcd: cli}
	c.mu.Lock()
	c.Global = append(c.Global, g)
	c.mu.Unlock()
	return g, nil
}

// GlobalAddrs are the gRPC addresses of every global replica.
func (c *Cluster) GlobalAddrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, g := range c.Global {
		out = append(out, g.Daemon.GRPCAddr())
	}
	return out
}

// AddRegional starts one more regional replica of region.
func (c *Cluster) AddRegional(ctx context.Context, region string) (*RegionalReplica, error) {
	reg := c.Regions[region]
	if reg == nil {
		return nil, fmt.Errorf("devcluster: no region %q", region)
	}
	cli, err := c.NewEtcdClient()
	if err != nil {
		return nil, err
	}
	store := configstore.NewStore(cli, config.DefaultPrefix)
	registry := prometheus.NewRegistry()
	w := configstore.NewWatcher(store, c.opts.Config, c.opts.Logger, registry)
	go w.Run(c.ctx)
	var lo *regional.LeaderOptions
	var gc *allocator.Client
	if addrs := c.GlobalAddrs(); len(addrs) > 0 {
		dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if c.opts.DialGlobal != nil {
			dial = append(dial, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return c.opts.DialGlobal(ctx, region, addr)
			}))
		}
		gc, err = allocator.NewClient(addrs, dial...)
		if err != nil {
			return nil, err
		}
		c.onStop(func() { gc.Close() })
		lo = &regional.LeaderOptions{Etcd: cli, ElectionPrefix: store.ElectionPrefix(), Global: gc, SessionTTL: c.opts.SessionTTL}
	}
	d, err := regional.StartDaemon(ctx, regional.DaemonOptions{
		Region: region, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RedisAddr: reg.Redis.Addr(),
		Config: w, ColdStart: regional.ColdStartFull, Leader: lo, Registry: registry, Logger: c.opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("devcluster: region %s: %w", region, err)
	}
	c.onStop(d.Stop)
	r := &RegionalReplica{Daemon: d, Watcher: w, Global: gc, etcd: cli}
	c.mu.Lock()
	reg.Replicas = append(reg.Replicas, r)
	c.mu.Unlock()
	return r, nil
}

// RegionalAddrs are the gRPC addresses of region's replicas.
func (c *Cluster) RegionalAddrs(region string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.Regions[region].Replicas {
		out = append(out, r.Daemon.GRPCAddr())
	}
	return out
}

func (c *Cluster) onStop(f func()) {
	c.mu.Lock()
	c.closers = append(c.closers, f)
	c.mu.Unlock()
}

// Stop stops everything, newest first. Idempotent.
func (c *Cluster) Stop() {
	c.mu.Lock()
	closers := c.closers
	c.closers = nil
	c.mu.Unlock()
	c.cancel()
	for i := len(closers) - 1; i >= 0; i-- {
		closers[i]()
	}
	if c.tmpDir != "" {
		os.RemoveAll(c.tmpDir)
		c.tmpDir = ""
	}
}

// Kill ends the replica as a crash would: its etcd connection goes first,
// so it cannot resign, and its leadership lapses only when its session
// expires; then its server stops.
func (g *GlobalReplica) Kill() {
	g.etcd.Close()
	g.Daemon.Stop()
}
