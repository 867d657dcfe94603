// Package devcluster runs a whole Sluice deployment inside one process:
// an embedded etcd holding the config, one Redis per region (a real
// redis-server when installed, an embedded one otherwise), the regional
// services of every region with their region leaders, and global allocator
// replicas — all talking real gRPC on loopback. Development mode (RunDev),
// the simulator's live mode (sim/live) and the multi-region tests use it:
// it is the one way to start such a deployment.
//
// Every part can fail and come back as in production: a replica stops
// gracefully (Stop, resigning its leadership) or crashes (Kill: its etcd
// session lapses only after its TTL) and Restart starts it again at the
// same address, where its peers already dial; etcd stops and restarts on
// the same data and endpoint (StopEtcd, RestartEtcd); a region's Redis
// restarts empty on its port (Region.Redis).
//
// Safe for concurrent use. Stop ends everything Start and the Add methods
// started, whatever state it is in.
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
	"google.golang.org/grpc/reflection"

	"github.com/sluicehq/sluice/internal/embedetcd"
	"github.com/sluicehq/sluice/internal/etcdflags"
	"github.com/sluicehq/sluice/internal/redisproc"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// Options configure a cluster. Zero values pick the defaults.
type Options struct {
	// Config is written to etcd before anything starts. Required.
	Config *config.Config
	// Regions to run, in this order. Optional, default every region of
	// Config.
	Regions []string
	// ReplicasPerRegion is the regional services per region. Optional,
	// default 1.
	ReplicasPerRegion int
	// GlobalReplicas is the global allocator replicas of each shard of the
	// config (global_shards, pkg/shard). Optional, default 1; -1 runs none
	// (regions stay on static shares).
	GlobalReplicas int
	// SessionTTL of every election. Optional, default 2s.
	SessionTTL time.Duration
	// Prefix is the etcd key prefix of the config and the elections.
	// Optional, default config.DefaultPrefix.
	Prefix string
	// StaticConfig makes every daemon serve Config as given instead of
	// watching etcd for it: no hot reload, and nothing an etcd outage or a
	// write to etcd does changes the config they run on. etcd still holds
	// Config. Optional; by default each replica runs a configstore.Watcher.
	StaticConfig bool
	// ConservativeColdStart starts every regional replica with
	// regional.ColdStartConservative. Optional; by default replicas use
	// regional.ColdStartFull, as each region's Redis starts empty with the
	// cluster.
	ConservativeColdStart bool
	// AllowEmbeddedRedis falls back to an in-process Redis when
	// redis-server is not installed (logged as a warning). Optional.
	AllowEmbeddedRedis bool
	// DataDir holds etcd's data. Optional, default a fresh temporary
	// directory removed by Stop.
	DataDir string
	// DialGlobal, when set, dials every region leader's connections to the
	// global tier (tests inject partitions with it). Optional.
	DialGlobal func(ctx context.Context, region, addr string) (net.Conn, error)
	// WrapGlobal, when set, wraps every regional replica's way to the
	// global tier (faults injected above the connection). Optional.
	WrapGlobal func(region string, next regional.GlobalTier) regional.GlobalTier
	// OnApplied, when set, is every region leader's
	// regional.LeaderOptions.OnApplied, told its region. It must not
	// block. Optional.
	OnApplied func(region string, k quota.Key, rate, burst float64, expiryUS int64)
	// OnStaticLease, when set, is every region leader's
	// regional.LeaderOptions.OnStaticLease, told its region. It must not
	// block. Optional.
	OnStaticLease func(region string, shard int, untilUS int64)
	// OnHeld, when set, is every region leader's
	// regional.LeaderOptions.OnHeld, told its region. It must not
	// block. Optional.
	OnHeld func(region string, k quota.Key, rate, burst float64, expiryUS int64)
	// OnChain, when set, is every regional replica's
	// regional.Options.OnChain, told its region and which replica: a
	// number unique in the cluster, kept across the replica's restarts.
	// It must not block. Optional.
	OnChain func(region string, replica int, c regionsync.Chain)
	// Listen fixes the addresses of a region's first replica (dev mode:
	// the region the banner's examples call). Optional; by default, and
	// for every other replica, free loopback ports.
	Listen map[string]ListenAddrs
	// Envoy serves, on every regional replica's gRPC listener, the Envoy
	// rate limit service (deciding from a loopback lease client of the
	// replica's own LeaseService, as cmd/regional does) and gRPC server
	// reflection. Optional.
	Envoy bool
	// Logger. Optional, default discards.
	Logger *slog.Logger
}

// ListenAddrs are a regional replica's listen addresses (host:port; port
// 0 picks a free one, empty means 127.0.0.1:0).
type ListenAddrs struct {
	GRPC, HTTP string
}

// Cluster is a running deployment. Safe for concurrent use.
type Cluster struct {
	opts    Options
	Client  *clientv3.Client // etcd client for callers (sluicectl-style work)
	Store   *configstore.Store
	Global  []*GlobalReplica // fixed once Start returns, unless AddGlobal
	Regions map[string]*Region

	ctx    context.Context
	cancel context.CancelFunc
	tmpDir string

	etcdMu   sync.Mutex // guards etcd
	etcd     *embed.Etcd
	etcdDir  string
	etcdAddr string // client endpoint, fixed so a restarted etcd is where clients dial
	peerAddr string

	mu       sync.Mutex // guards Global and Region.Replicas while adding, closers and replicas
	closers  []func()
	replicas int // regional replicas added
}

// Region is one region's Redis and regional replicas.
type Region struct {
	Name     string
	Redis    *redisproc.Proc
	Replicas []*RegionalReplica // in start order; fixed unless AddRegional
}

// Start brings the cluster up: etcd, config, global replicas, regions.
// On error, everything already started is stopped.
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
	if o.Prefix == "" {
		o.Prefix = config.DefaultPrefix
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	for _, name := range o.Regions {
		if _, ok := o.Config.Regions[name]; !ok {
			return nil, fmt.Errorf("devcluster: region %q is not in the config", name)
		}
	}
	c = &Cluster{opts: o, Regions: map[string]*Region{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	started := c // the error returns below set c to nil
	defer func() {
		if err != nil {
			started.Stop()
		}
	}()

	c.etcdDir = o.DataDir
	if c.etcdDir == "" {
		if c.etcdDir, err = os.MkdirTemp("", "sluice-dev-etcd-"); err != nil {
			return nil, err
		}
		c.tmpDir = c.etcdDir
	}
	e, err := embedetcd.Start("sluice-dev", c.etcdDir, nil)
	if err != nil {
		return nil, err
	}
	c.etcd = e
	c.etcdAddr = e.Clients[0].Addr().String()
	c.peerAddr = e.Peers[0].Addr().String()
	c.onStop(c.StopEtcd)
	if c.Client, err = c.NewEtcdClient(); err != nil {
		return nil, err
	}
	c.Store = configstore.NewStore(c.Client, o.Prefix)
	if _, err := c.Store.Apply(ctx, o.Config, 0); err != nil {
		return nil, fmt.Errorf("devcluster: write config: %w", err)
	}
	for sh := range o.Config.ShardMap().N() {
		for i := 0; i < o.GlobalReplicas; i++ {
			if _, err := c.AddGlobalShard(ctx, sh); err != nil {
				return nil, err
			}
		}
	}
	for _, name := range o.Regions {
		p, err := redisproc.Start(o.AllowEmbeddedRedis)
		if err != nil {
			return nil, fmt.Errorf("devcluster: region %s: %w", name, err)
		}
		if p.Embedded() {
			o.Logger.Warn("redis-server is not installed: region runs on an embedded Redis (apt-get install redis-server for the real one)", "region", name)
		}
		c.onStop(p.Stop)
		c.mu.Lock()
		c.Regions[name] = &Region{Name: name, Redis: p}
		c.mu.Unlock()
		for i := 0; i < o.ReplicasPerRegion; i++ {
			if _, err := c.AddRegional(ctx, name); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// EtcdAddr is the embedded etcd's client endpoint (host:port). It stays
// the same across StopEtcd and RestartEtcd.
func (c *Cluster) EtcdAddr() string { return c.etcdAddr }

// SessionTTL is the etcd session TTL of every election in the cluster (the
// option, or its default).
func (c *Cluster) SessionTTL() time.Duration { return c.opts.SessionTTL }

// StopEtcd shuts the embedded etcd down: every client loses it until
// RestartEtcd. Idempotent.
func (c *Cluster) StopEtcd() {
	c.etcdMu.Lock()
	e := c.etcd
	c.etcd = nil
	c.etcdMu.Unlock()
	if e != nil {
		e.Close()
	}
}

// RestartEtcd starts the embedded etcd again, on the same data and
// addresses, after StopEtcd. It is an error while etcd runs.
func (c *Cluster) RestartEtcd() error {
	c.etcdMu.Lock()
	defer c.etcdMu.Unlock()
	if c.etcd != nil {
		return errors.New("devcluster: etcd is running")
	}
	e, err := embedetcd.StartAt("sluice-dev", c.etcdDir, c.etcdAddr, c.peerAddr, nil)
	if err != nil {
		return err
	}
	c.etcd = e
	return nil
}

// NewEtcdClient returns a fresh client of the embedded etcd, closed by Stop.
func (c *Cluster) NewEtcdClient() (*clientv3.Client, error) {
	cli, err := c.etcdClient()
	if err != nil {
		return nil, err
	}
	c.onStop(func() { cli.Close() })
	return cli, nil
}

// etcdClient is a new client of the embedded etcd; the caller closes it.
func (c *Cluster) etcdClient() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{c.etcdAddr},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(), // the etcd client logs retries of cancelled calls at shutdown
		// The daemons' own reconnect policy: live mode's etcd outage
		// measures what the daemons do when etcd comes back.
		DialOptions: etcdflags.DialOptions(),
	})
	if err != nil {
		return nil, fmt.Errorf("devcluster: etcd client: %w", err)
	}
	return cli, nil
}

// process is what every replica starts with: its own etcd client (so a
// crash cuts only its session), and its config source — a Watcher of
// etcd, or the static config.
type process struct {
	closers   []func() // run by end, first
	etcd      *clientv3.Client
	watcher   *configstore.Watcher // nil with Options.StaticConfig
	stopWatch context.CancelFunc
	registry  *prometheus.Registry
}

func (c *Cluster) startProcess() (*process, error) {
	cli, err := c.etcdClient()
	if err != nil {
		return nil, err
	}
	p := &process{etcd: cli, registry: prometheus.NewRegistry(), stopWatch: func() {}}
	if !c.opts.StaticConfig {
		store := configstore.NewStore(cli, c.opts.Prefix)
		p.watcher = configstore.NewWatcher(store, c.opts.Config, c.opts.Logger, p.registry)
		var wctx context.Context
		wctx, p.stopWatch = context.WithCancel(c.ctx)
		go p.watcher.Run(wctx)
		// Start on etcd's config, as cmd/regional and cmd/global do, never
		// on the watcher's fallback (the cluster's first config): a
		// replica restarted after a config change would serve the old
		// config until its watch's first read, a drained region its full
		// static share beside grants sized with it at its floor (seen in
		// live mode's region-drain, Σ rates 1.25 r).
		if _, err := configstore.AwaitEtcdConfig(wctx, store, nil, p.watcher, c.opts.Logger); err != nil {
			p.end()
			return nil, fmt.Errorf("devcluster: awaiting etcd's config: %w", err)
		}
	}
	return p, nil
}

// end stops the watcher and closes the etcd client.
func (p *process) end() {
	for _, f := range p.closers {
		f()
	}
	p.stopWatch()
	p.etcd.Close()
}

// GlobalReplica is one global allocator process at a fixed address.
type GlobalReplica struct {
	c     *Cluster
	addr  string
	shard int

	mu sync.Mutex // guards d and p
	d  *allocator.Daemon
	p  *process
}

// AddGlobal starts one more global allocator replica of shard 0.
func (c *Cluster) AddGlobal(ctx context.Context) (*GlobalReplica, error) {
	return c.AddGlobalShard(ctx, 0)
}

// AddGlobalShard starts one more global allocator replica of shard.
func (c *Cluster) AddGlobalShard(ctx context.Context, shard int) (*GlobalReplica, error) {
	g := &GlobalReplica{c: c, addr: "127.0.0.1:0", shard: shard}
	if err := g.start(ctx); err != nil {
		return nil, err
	}
	g.addr = g.d.GRPCAddr()
	c.onStop(g.Stop)
	c.mu.Lock()
	c.Global = append(c.Global, g)
	c.mu.Unlock()
	return g, nil
}

func (g *GlobalReplica) start(ctx context.Context) error {
	c := g.c
	p, err := c.startProcess()
	if err != nil {
		return err
	}
	var source allocator.ConfigSource = allocator.StaticConfig{C: c.opts.Config}
	if p.watcher != nil {
		source = p.watcher
	}
	d, err := allocator.StartDaemon(ctx, allocator.DaemonOptions{
		GRPCAddr: g.addr, HTTPAddr: "127.0.0.1:0", Etcd: p.etcd, Prefix: c.opts.Prefix, Shard: g.shard,
		SessionTTL: c.opts.SessionTTL, Config: source, Registry: p.registry, Logger: c.opts.Logger,
	})
	if err != nil {
		p.end()
		return fmt.Errorf("devcluster: global replica %s: %w", g.addr, err)
	}
	g.mu.Lock()
	g.d, g.p = d, p
	g.mu.Unlock()
	return nil
}

// Addr is the replica's gRPC address, the same across restarts.
func (g *GlobalReplica) Addr() string { return g.addr }

// Shard is the global-tier shard the replica serves.
func (g *GlobalReplica) Shard() int { return g.shard }

// Daemon is the running daemon, nil while the replica is down.
func (g *GlobalReplica) Daemon() *allocator.Daemon {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.d
}

func (g *GlobalReplica) take() (*allocator.Daemon, *process) {
	g.mu.Lock()
	defer g.mu.Unlock()
	d, p := g.d, g.p
	g.d, g.p = nil, nil
	return d, p
}

// Stop stops the replica gracefully: it resigns, so a standby takes over
// at once. Idempotent.
func (g *GlobalReplica) Stop() {
	if d, p := g.take(); d != nil {
		d.Stop()
		p.end()
	}
}

// Kill ends the replica as a crash would: its etcd connection goes first,
// so it cannot resign, and its leadership lapses only when its session
// expires; then its server stops.
func (g *GlobalReplica) Kill() {
	if d, p := g.take(); d != nil {
		p.end()
		d.Stop()
	}
}

// Restart starts a stopped or killed replica again at its address. It is
// an error while the replica runs.
func (g *GlobalReplica) Restart(ctx context.Context) error {
	if g.Daemon() != nil {
		return fmt.Errorf("devcluster: global replica %s is running", g.addr)
	}
	return g.start(ctx)
}

// GlobalAddrs are the gRPC addresses of every replica of global-tier
// shard 0 (the whole global tier unless it is sharded), running or not.
func (c *Cluster) GlobalAddrs() []string { return c.GlobalShardAddrs(0) }

// GlobalShardAddrs are the gRPC addresses of every replica of shard,
// running or not.
func (c *Cluster) GlobalShardAddrs(shard int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, g := range c.Global {
		if g.shard == shard {
			out = append(out, g.addr)
		}
	}
	return out
}

// RegionalReplica is one regional process at a fixed address: its daemon,
// its config watcher, its own etcd client and its client of the global
// tier.
type RegionalReplica struct {
	c        *Cluster
	id       int // the cluster's count of replicas added when it was
	region   string
	redis    string
	addr     string
	httpAddr string // free port at each start unless Options.Listen fixes it

	mu   sync.Mutex // guards d, p, gc and loop
	d    *regional.Daemon
	p    *process
	gc   *allocator.Client
	loop *envoyrls.Loopback // nil without Options.Envoy
}

// AddRegional starts one more regional replica of region.
func (c *Cluster) AddRegional(ctx context.Context, region string) (*RegionalReplica, error) {
	c.mu.Lock()
	reg := c.Regions[region]
	c.mu.Unlock()
	if reg == nil {
		return nil, fmt.Errorf("devcluster: no region %q", region)
	}
	c.mu.Lock()
	c.replicas++
	r := &RegionalReplica{c: c, id: c.replicas, region: region, redis: reg.Redis.Addr(), addr: "127.0.0.1:0", httpAddr: "127.0.0.1:0"}
	first := len(reg.Replicas) == 0
	c.mu.Unlock()
	if l, ok := c.opts.Listen[region]; ok && first {
		if l.GRPC != "" {
			r.addr = l.GRPC
		}
		if l.HTTP != "" {
			r.httpAddr = l.HTTP
		}
	}
	if err := r.start(ctx); err != nil {
		return nil, err
	}
	r.addr = r.d.GRPCAddr()
	c.onStop(r.Stop)
	c.mu.Lock()
	reg.Replicas = append(reg.Replicas, r)
	c.mu.Unlock()
	return r, nil
}

func (r *RegionalReplica) start(ctx context.Context) error {
	c := r.c
	p, err := c.startProcess()
	if err != nil {
		return err
	}
	var source regional.ConfigSource = regional.StaticConfig{C: c.opts.Config}
	if p.watcher != nil {
		source = p.watcher
	}
	var lo *regional.LeaderOptions
	var gc *allocator.Client
	if addrs := c.GlobalAddrs(); len(addrs) > 0 {
		dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if c.opts.DialGlobal != nil {
			dial = append(dial, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return c.opts.DialGlobal(ctx, r.region, addr)
			}))
		}
		if gc, err = allocator.NewClient(addrs, dial...); err != nil {
			p.end()
			return err
		}
		var tier regional.GlobalTier = gc
		if c.opts.WrapGlobal != nil {
			tier = c.opts.WrapGlobal(r.region, gc)
		}
		lo = &regional.LeaderOptions{Etcd: p.etcd, ElectionPrefix: configstore.NewStore(p.etcd, c.opts.Prefix).ElectionPrefix(),
			Global: tier, Shards: c.shardTiers(p, r.region, tier, dial), SessionTTL: c.opts.SessionTTL}
		if on := c.opts.OnApplied; on != nil {
			lo.OnApplied = func(k quota.Key, rate, burst float64, expiryUS int64) { on(r.region, k, rate, burst, expiryUS) }
		}
		if on := c.opts.OnHeld; on != nil {
			lo.OnHeld = func(k quota.Key, rate, burst float64, expiryUS int64) { on(r.region, k, rate, burst, expiryUS) }
		}
		if on := c.opts.OnStaticLease; on != nil {
			lo.OnStaticLease = func(shard int, untilUS int64) { on(r.region, shard, untilUS) }
		}
	}
	cold := regional.ColdStartFull
	if c.opts.ConservativeColdStart {
		cold = regional.ColdStartConservative
	}
	var envoy *envoyrls.Service
	var extra []func(*grpc.Server)
	if c.opts.Envoy {
		if envoy, err = envoyrls.New(envoyrls.Options{Config: source, Registerer: p.registry, Logger: c.opts.Logger}); err != nil {
			if gc != nil {
				gc.Close()
			}
			p.end()
			return err
		}
		extra = []func(*grpc.Server){
			func(g *grpc.Server) { reflection.Register(g) },
		}
	}
	var onChain func(regionsync.Chain)
	if on := c.opts.OnChain; on != nil {
		onChain = func(ch regionsync.Chain) { on(r.region, r.id, ch) }
	}
	// The embedded Redis never evicts and has no INFO memory to say so.
	c.mu.Lock()
	embedded := c.Regions[r.region].Redis.Embedded()
	c.mu.Unlock()
	d, err := regional.StartDaemon(ctx, regional.DaemonOptions{
		Region: r.region, GRPCAddr: r.addr, HTTPAddr: r.httpAddr, RedisAddr: r.redis,
		Config: source, ColdStart: cold, Leader: lo, Registry: p.registry, Logger: c.opts.Logger,
		Envoy: envoy, Extra: extra, AllowEviction: embedded, OnChain: onChain,
	})
	if err != nil {
		if gc != nil {
			gc.Close()
		}
		p.end()
		return fmt.Errorf("devcluster: region %s replica %s: %w", r.region, r.addr, err)
	}
	var loop *envoyrls.Loopback
	if envoy != nil {
		// Unique per incarnation: a restarted replica must not take over
		// its former life's leases.
		target, dial := d.Loopback()
		loop, err = envoyrls.DialLoopback(target, nil, lease.Options{
			InstanceID: lease.UniqueID("envoy-" + r.region), Logger: c.opts.Logger, Registerer: p.registry,
			Tier: envoyrls.LiveTier(source), Policies: envoyrls.LivePolicies(source),
			StaticShare: envoyrls.LiveStaticShare(source, r.region),
		}, dial...)
		if err != nil {
			d.Stop()
			if gc != nil {
				gc.Close()
			}
			p.end()
			return err
		}
		envoy.SetLimiter(loop)
	}
	r.mu.Lock()
	r.d, r.p, r.gc, r.loop = d, p, gc, loop
	r.mu.Unlock()
	return nil
}

// Addr is the replica's gRPC address, the same across restarts.
func (r *RegionalReplica) Addr() string { return r.addr }

// Daemon is the running daemon, nil while the replica is down.
func (r *RegionalReplica) Daemon() *regional.Daemon {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.d
}

// Watcher is the running replica's config watcher; nil while it is down
// or with Options.StaticConfig.
func (r *RegionalReplica) Watcher() *configstore.Watcher {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p == nil {
		return nil
	}
	return r.p.watcher
}

// IsLeading reports whether the replica runs and leads its region.
func (r *RegionalReplica) IsLeading() bool {
	d := r.Daemon()
	return d != nil && d.Leader != nil && d.Leader.IsLeading()
}

func (r *RegionalReplica) take() (*regional.Daemon, *process, *allocator.Client, *envoyrls.Loopback) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, p, gc, loop := r.d, r.p, r.gc, r.loop
	r.d, r.p, r.gc, r.loop = nil, nil, nil, nil
	return d, p, gc, loop
}

// closeLoop releases the Envoy endpoint's unspent tokens to the region
// (bounded: a killed replica's release may fail).
func closeLoop(loop *envoyrls.Loopback) {
	if loop == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	loop.Close(ctx)
	cancel()
}

// Stop stops the replica gracefully, in the order of cmd/regional: health
// NOT_SERVING and in-flight calls finish (Daemon.Drain), the Envoy
// endpoint's lease client releases its tokens, then the daemon stops and
// its region leader resigns. Idempotent.
func (r *RegionalReplica) Stop() {
	if d, p, gc, loop := r.take(); d != nil {
		d.Drain()
		closeLoop(loop)
		d.Stop()
		p.end()
		if gc != nil {
			gc.Close()
		}
	}
}

// Kill ends the replica as a crash would: its etcd client closes first,
// so its session is neither kept alive nor resigned and another replica is
// elected only once the session's TTL lapses; then its server stops.
func (r *RegionalReplica) Kill() {
	if d, p, gc, loop := r.take(); d != nil {
		closeLoop(loop)
		p.end()
		d.Stop()
		if gc != nil {
			gc.Close()
		}
	}
}

// Restart starts a stopped or killed replica again at its address (a new
// pod behind the same Service). It is an error while the replica runs.
func (r *RegionalReplica) Restart(ctx context.Context) error {
	if r.Daemon() != nil {
		return fmt.Errorf("devcluster: region %s replica %s is running", r.region, r.addr)
	}
	return r.start(ctx)
}

// RegionalAddrs are the gRPC addresses of region's replicas, running or
// not.
func (c *Cluster) RegionalAddrs(region string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.Regions[region].Replicas {
		out = append(out, r.addr)
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

// shardTiers is a region leader's way to each global-tier shard: shard0
// for shard 0, and for the others an allocator.Client over the shard's
// replicas made at first use (wrapped as shard 0's is), closed when p
// ends.
func (c *Cluster) shardTiers(p *process, region string, shard0 regional.GlobalTier, dial []grpc.DialOption) func(int) (regional.GlobalTier, error) {
	var mu sync.Mutex
	tiers := map[int]regional.GlobalTier{0: shard0}
	var clients []*allocator.Client
	p.closers = append(p.closers, func() {
		mu.Lock()
		defer mu.Unlock()
		for _, gc := range clients {
			gc.Close()
		}
		clients = nil
	})
	return func(shard int) (regional.GlobalTier, error) {
		mu.Lock()
		defer mu.Unlock()
		if t, ok := tiers[shard]; ok {
			return t, nil
		}
		addrs := c.GlobalShardAddrs(shard)
		if len(addrs) == 0 {
			return nil, fmt.Errorf("devcluster: no global replica serves shard %d", shard)
		}
		gc, err := allocator.NewClient(addrs, dial...)
		if err != nil {
			return nil, err
		}
		clients = append(clients, gc)
		var t regional.GlobalTier = gc
		if c.opts.WrapGlobal != nil {
			t = c.opts.WrapGlobal(region, gc)
		}
		tiers[shard] = t
		return t, nil
	}
}
