package regional

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/endpoint"
	"github.com/sluicehq/sluice/internal/memlisten"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/regional/reply"
	"github.com/sluicehq/sluice/pkg/regionsync"
	"github.com/sluicehq/sluice/pkg/rpcguard"
)

// DaemonOptions configure a whole regional process: listeners, Redis and
// the LeaseService. cmd/regional fills them from flags; tests and dev mode
// fill them directly.
type DaemonOptions struct {
	// Region is this region's name. Required.
	Region string
	// GRPCAddr is the LeaseService listen address. Optional, default
	// "127.0.0.1:7400"; ":0" picks a free port (see Daemon.GRPCAddr).
	GRPCAddr string
	// HTTPAddr serves /metrics and /healthz. Optional, default
	// "127.0.0.1:7401"; "" after defaults is never used; "off" disables.
	HTTPAddr string
	// RedisAddr is the region's Redis host:port. Required. Several
	// comma-separated addresses, or RedisCluster, mean a Redis Cluster
	// (every quota key's Redis keys share a hash tag, so each script runs
	// on one node).
	RedisAddr string
	// RedisCluster treats a single RedisAddr as a cluster's configuration
	// endpoint. Optional.
	RedisCluster bool
	// RedisUsername is the Redis ACL user to authenticate as. Optional,
	// default the default user (AUTH with RedisPassword alone). The user
	// needs the commands and keys of docs/operations.md's ACL recipe.
	RedisUsername string
	// RedisPassword. Optional. Never logged.
	RedisPassword string
	// RedisTLS enables TLS to Redis. Optional.
	RedisTLS *tls.Config
	// RedisTimeout bounds every Redis call. Optional, default 500ms.
	RedisTimeout time.Duration
	// AllowEviction starts on a Redis that may evict keys (maxmemory set
	// with a maxmemory-policy other than noeviction). Optional, default
	// false: StartDaemon refuses such a Redis with an *EvictionError, and
	// a Redis it cannot read INFO from. It gives up invariant 1: an
	// evicted token bucket comes back full, so each eviction of a key's
	// bucket may admit up to one more burst, with no bound over time
	// (docs/architecture.md, failure table). The daemon logs and exports
	// the eviction settings either way.
	AllowEviction bool
	// Config is the live config. Required.
	Config ConfigSource
	// ColdStart says how an empty Redis is treated at start. Optional,
	// default ColdStartConservative.
	ColdStart ColdStart
	// ServerTLS, when set, serves gRPC over TLS (mutual TLS when it
	// requires client certificates). Optional.
	ServerTLS *tls.Config
	// DrainTimeout bounds graceful shutdown. Optional, default 10s.
	DrainTimeout time.Duration
	// Registry receives the daemon's metrics. Optional, default a new
	// registry; the Go and process collectors are added to it either way.
	Registry *prometheus.Registry
	// Logger. Optional, default slog.Default().
	Logger *slog.Logger
	// Envoy, when set, is served as Envoy's rate limit service on the
	// daemon's server, behind the same authorization and bounds as every
	// call, answering in wire form (envoyrls.RegisterEncoded: the server
	// gets envoyrls.ServerOptions, which leave every other message to
	// gRPC's proto codec). Optional.
	Envoy *envoyrls.Service
	// Extra registers more gRPC services on the daemon's server
	// (reflection). Optional.
	Extra []func(*grpc.Server)
	// Leader, when set, makes this replica a candidate for its region's
	// leadership: the leader reports demand to the global tier every epoch
	// and installs the grants. Identity defaults to the bound gRPC address.
	// Optional: without it no replica of this process reports, and unless
	// Unleased the region runs on the static lease another process's
	// leader stores in Redis, else on its floor.
	Leader *LeaderOptions
	// Unleased runs the static shares unconditionally (Options.Unleased):
	// only for a region with no global tier. Refused together with Leader.
	Unleased bool
	// Background runs alongside the daemon until it stops. Optional.
	Background []func(ctx context.Context, d *Daemon) error
	// PerConnection and PerIdentity cap the units of work (keys named)
	// in flight per connection and per authenticated identity; calls
	// beyond wait their turn (rpcguard). Optional, rpcguard's defaults.
	PerConnection, PerIdentity int
	// OnChain is Options.OnChain. Optional.
	OnChain func(regionsync.Chain)
}

// Daemon is a running regional process. Safe for concurrent use.
type Daemon struct {
	opts     DaemonOptions
	Server   *Server
	Redis    redis.UniversalClient
	Registry *prometheus.Registry
	Health   *health.Server
	Leader   *Leader // nil unless DaemonOptions.Leader was set

	ep        *endpoint.Endpoint
	evictions *evictionWatch
	cancel    context.CancelFunc
	stopOnce  sync.Once
	drainOnce sync.Once
	// inner serves the LeaseService to lease clients of this process
	// (the Envoy endpoint's, see Loopback) over an in-memory listener
	// (internal/memlisten) only this process can dial, so they keep
	// reaching it while the public server drains.
	inner    *grpc.Server
	innerLis *memlisten.Listener
}

// StartDaemon opens the listeners and starts serving. Stop it with Stop.
func StartDaemon(ctx context.Context, o DaemonOptions) (*Daemon, error) {
	if o.GRPCAddr == "" {
		o.GRPCAddr = "127.0.0.1:7400"
	}
	if o.HTTPAddr == "" {
		o.HTTPAddr = "127.0.0.1:7401"
	}
	if o.RedisTimeout == 0 {
		o.RedisTimeout = reply.DefaultRedisTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.RedisAddr == "" {
		return nil, errors.New("regional: RedisAddr is required")
	}
	if err := ValidateRedisAddr(o.RedisAddr); err != nil {
		return nil, fmt.Errorf("regional: RedisAddr: %w", err)
	}
	if o.Config == nil {
		return nil, errors.New("regional: Config is required")
	}
	if o.Unleased && o.Leader != nil {
		return nil, errors.New("regional: Unleased is for a region with no global tier; it cannot have a Leader")
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	// Every call is authorized (with mutual TLS) and bounded before its
	// handler, so before any Redis call.
	edge, err := rpcguard.ServerOptions(rpcguard.EdgeOptions{
		Name: "regional", Config: o.Config, ServerTLS: o.ServerTLS, Policy: Policy(), Rules: GuardRules(),
		PerConnection: o.PerConnection, PerIdentity: o.PerIdentity,
		MaxMessageBytes: MaxMessageBytes, MaxStreams: MaxStreamsPerConnection,
		Registerer: o.Registry, Logger: o.Logger,
	})
	if err != nil {
		return nil, err
	}
	if o.Envoy != nil {
		edge = append(edge, envoyrls.ServerOptions()...)
	}
	ep, err := endpoint.Listen(endpoint.Options{
		Name: "regional", GRPCAddr: o.GRPCAddr, HTTPAddr: o.HTTPAddr, ServerTLS: o.ServerTLS,
		GRPCOptions: edge, Registry: o.Registry, DrainTimeout: o.DrainTimeout, Logger: o.Logger,
	})
	if err != nil {
		return nil, err
	}
	guard := NewRestartGuard("sl:", o.ColdStart, o.Logger)
	addrs := strings.Split(o.RedisAddr, ",")
	cluster := o.RedisCluster || len(addrs) > 1
	ropts := &redis.UniversalOptions{
		Addrs: addrs, IsClusterMode: cluster,
		Username: o.RedisUsername, Password: o.RedisPassword, TLSConfig: o.RedisTLS,
		DialTimeout: o.RedisTimeout, ReadTimeout: o.RedisTimeout, WriteTimeout: o.RedisTimeout,
		MaxRetries: 1,
		// No CLIENT SETINFO on connect: one command less for the ACL
		// user to be granted, whatever the Redis version.
		DisableIdentity: true,
	}
	rdb := redis.NewUniversalClient(ropts)
	srv, err := New(Options{
		Region: o.Region, Redis: rdb, Config: o.Config, Guard: guard,
		Logger: o.Logger, Registerer: ep.Registry, Unleased: o.Unleased, OnChain: o.OnChain,
		// The server's bound on a batch is the daemon's bound on Redis:
		// with the server's longer default, callers with shorter deadlines
		// gave up first on a hung Redis and nothing was counted.
		RedisTimeout: o.RedisTimeout,
	})
	if err != nil {
		ep.Close()
		rdb.Close()
		return nil, err
	}
	d := &Daemon{opts: o, Server: srv, Redis: rdb, Registry: ep.Registry, Health: ep.Health, ep: ep}
	srv.Register(ep.GRPC)
	if o.Envoy != nil {
		envoyrls.RegisterEncoded(ep.GRPC, o.Envoy)
	}
	for _, f := range o.Extra {
		f(ep.GRPC)
	}

	// Readiness: serving once Redis answered (the scripts are cached then).
	d.Health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	evictions := newEvictionWatch(o.Logger, srv.metrics)
	fail := func(err error) (*Daemon, error) {
		srv.Close()
		ep.Close()
		rdb.Close()
		return nil, err
	}
	// Redis refusing the credentials, or a command the scripts need,
	// fails the start: every caller would degrade while the replica
	// looked healthy. Redis not answering does not: it may come later.
	if err := ExplainRedisErr(srv.Scripts().Load(ctx, rdb)); errors.Is(err, ErrRedisRefused) {
		return fail(fmt.Errorf("regional: %w", err))
	} else if err != nil {
		o.Logger.Warn("redis not reachable at start; serving degraded until it is", "redis", o.RedisAddr, "err", err)
	} else {
		if err := ProbeAccess(ctx, rdb, ""); errors.Is(err, ErrRedisRefused) {
			return fail(fmt.Errorf("regional: %w", err))
		} else if err != nil {
			o.Logger.Warn("redis access probe failed at start", "redis", o.RedisAddr, "err", err)
		}
		if err := checkEviction(ctx, rdb, o, evictions); err != nil {
			return fail(err)
		}
		if err := guard.Check(ctx, rdb); err != nil {
			o.Logger.Warn("restart sentinel check failed", "redis", o.RedisAddr, "err", ExplainRedisErr(err))
		}
	}

	// The chain starts from the region's history before anything is
	// served or reported (bounded: a Redis read, and an etcd read only
	// when the process starts on a config not yet confirmed; on failure
	// the process starts as one with no history, and says so). When
	// Redis or etcd did not answer, it is read again in the background
	// (Server.resumeLate; applying it late only lowers static shares).
	resumeErr := srv.ResumeChain(ctx)

	runCtx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	ep.Serve()
	d.inner = grpc.NewServer(grpc.MaxRecvMsgSize(MaxMessageBytes))
	srv.Register(d.inner)
	d.innerLis = memlisten.New()
	ep.Go(func() error { return d.inner.Serve(d.innerLis) })
	epoch := time.Duration(o.Config.Current().Epoch)
	ep.Go(func() error { return srv.Run(runCtx, epoch) })
	if ResumeChainRetryable(resumeErr) {
		ep.Go(func() error { srv.resumeLate(runCtx); return nil })
	}
	ep.Go(func() error { d.watchReadiness(runCtx); return nil })
	d.evictions = evictions
	ep.Go(func() error { d.watchEviction(runCtx, epoch, evictions); return nil })
	if o.Leader != nil {
		lo := *o.Leader
		if lo.Identity == "" {
			lo.Identity = d.GRPCAddr()
		}
		if d.Leader, err = NewLeader(srv, lo); err != nil {
			d.Stop()
			return nil, err
		}
		ep.Go(func() error { return d.Leader.Run(runCtx) })
	}
	for _, bg := range o.Background {
		ep.Go(func() error { return bg(runCtx, d) })
	}
	o.Logger.Info("regional service started", "region", o.Region, "grpc", d.GRPCAddr(), "http", d.HTTPAddr(), "redis", o.RedisAddr)
	return d, nil
}

// listsRegion says whether cfg configures region.
func listsRegion(cfg *config.Config, region string) bool {
	_, ok := cfg.Regions[region]
	return ok
}

// ReadinessInterval is how often a regional daemon pings its Redis for
// its readiness and counts a failed ping (script "ping").
const ReadinessInterval = time.Second

// ping is the readiness ping of the daemon's Redis. On a Redis Cluster it
// pings every master that has held a call's key (clusterNodes), side by
// side: err is nil while one answers (the replica serves the keys of the
// masters that answer), and nodesErr names the masters that did not. A
// cluster's PING went to one node at random, so one master hung of three
// made the replica not ready a third of the time, and every replica of
// the region with it. (Not go-redis's ForEachMaster: it reloads the slot
// map first, from a node picked at random, and a hung one used up the
// ping's whole bound.)
func (d *Daemon) ping(ctx context.Context) (err, nodesErr error) {
	var nodes []*clusterNode
	if d.Server.nodes != nil {
		nodes = d.Server.nodes.known()
	}
	if len(nodes) == 0 {
		return ExplainRedisErr(d.Redis.Ping(ctx).Err()), nil
	}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, nd := range nodes {
		wg.Go(func() {
			if perr := nd.client.Ping(ctx).Err(); perr != nil {
				errs[i] = fmt.Errorf("%s: %w", nd.addr, ExplainRedisErr(perr))
			}
		})
	}
	wg.Wait()
	failed := 0
	for _, e := range errs {
		if e != nil {
			failed++
		}
	}
	if failed == len(nodes) {
		return errors.Join(errs...), nil
	}
	return nil, errors.Join(errs...)
}

// watchReadiness keeps the gRPC health status in line with Redis: a
// replica whose Redis is down, or refuses it access, is not ready
// (clients fail over to others); so is one whose region the live config
// no longer lists (errRegionRemoved), which can serve nothing. Each check is a PING and the access
// probe (ProbeAccess): a user that lost a command the scripts need, or
// credentials Redis no longer takes, fails every caller although PING
// may still answer. A probe that fails for any other reason (a Redis out
// of memory refuses its writes) leaves readiness to the PING. Every
// failed check is a Redis error of script "ping", so a Redis that is down
// or hung shows within seconds whether or not callers wait for it (a
// caller that gives up first is not counted); the outage is logged once
// when it starts and once when Redis answers again.
func (d *Daemon) watchReadiness(ctx context.Context) {
	t := time.NewTicker(ReadinessInterval)
	defer t.Stop()
	down, removed, nodesDown := false, false, false
	for {
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, d.opts.RedisTimeout)
		err, nodesErr := d.ping(pctx)
		if err == nil {
			if perr := ProbeAccess(pctx, d.Redis, ""); errors.Is(perr, ErrRedisRefused) {
				err = perr
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		d.Server.observeOwn(ctx, "ping", start, errors.Join(err, nodesErr))
		switch {
		case err == nil && nodesErr != nil && !nodesDown:
			d.opts.Logger.Warn("redis cluster masters do not answer their readiness ping; their keys are decided by on_failure policies, the others served; replica ready",
				"redis", d.opts.RedisAddr, "err", nodesErr)
			nodesDown = true
		case nodesErr == nil && nodesDown:
			d.opts.Logger.Info("every redis cluster master answers its readiness ping again", "redis", d.opts.RedisAddr)
			nodesDown = false
		}
		st := healthpb.HealthCheckResponse_SERVING
		switch {
		case err != nil:
			st = healthpb.HealthCheckResponse_NOT_SERVING
			if !down {
				msg := "redis does not answer its readiness ping; replica not ready"
				if errors.Is(err, ErrRedisRefused) {
					msg = "redis refuses this replica access; replica not ready"
				}
				d.opts.Logger.Warn(msg, "redis", d.opts.RedisAddr, "err", err)
			}
			down = true
		case down:
			d.opts.Logger.Info("redis answers its readiness ping again; replica ready", "redis", d.opts.RedisAddr)
			down = false
		}
		// A region the live config no longer lists (removed while its
		// replicas ran) refuses every request FailedPrecondition: the
		// replica cannot serve, so it is not ready, whatever Redis says.
		if cfg := d.Server.opts.Config.Current(); cfg != nil && !listsRegion(cfg, d.opts.Region) {
			st = healthpb.HealthCheckResponse_NOT_SERVING
			if !removed {
				d.opts.Logger.Warn("region not in the live config; replica not ready (it refuses every request until a config lists the region again; stop its replicas)", "region", d.opts.Region)
			}
			removed = true
		} else if removed {
			d.opts.Logger.Info("region in the live config again; replica ready once Redis answers", "region", d.opts.Region)
			removed = false
		}
		d.Health.SetServingStatus("", st)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkEviction refuses, at start, a Redis that evicts keys or whose
// eviction settings cannot be read, unless AllowEviction; with it, the
// watch logs what it found.
func checkEviction(ctx context.Context, rdb redis.UniversalClient, o DaemonOptions, w *evictionWatch) error {
	mem, err := ReadRedisMemory(ctx, rdb)
	switch {
	case err != nil && o.AllowEviction:
		w.failed(err)
		return nil
	case err != nil:
		return fmt.Errorf("regional: cannot read redis's eviction settings (the Redis user needs +info): %w; -redis-allow-eviction (DaemonOptions.AllowEviction) starts without them", ExplainRedisErr(err))
	}
	if bad := evicting(mem); len(bad) > 0 && !o.AllowEviction {
		return &EvictionError{Nodes: bad}
	}
	w.observe(mem)
	return nil
}

// watchEviction reads every Redis node's eviction settings and count
// once an interval (the epoch), so a policy changed at run time (CONFIG
// SET, a failover to a node configured otherwise) or keys evicted anyway
// are logged and exported (sluice_regional_redis_evicting,
// sluice_regional_redis_evicted_keys_total).
func (d *Daemon) watchEviction(ctx context.Context, interval time.Duration, w *evictionWatch) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, d.opts.RedisTimeout)
		mem, err := ReadRedisMemory(rctx, d.Redis)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			w.failed(err)
		default:
			w.observe(mem)
		}
	}
}

// GRPCAddr is the bound gRPC address.
func (d *Daemon) GRPCAddr() string { return d.ep.GRPCAddr() }

// HTTPAddr is the bound metrics address ("" when disabled).
func (d *Daemon) HTTPAddr() string { return d.ep.HTTPAddr() }

// Loopback is how a lease client of this process reaches the daemon's
// LeaseService (the Envoy endpoint's, envoyrls.DialLoopback): a target and
// the dial options connecting it in memory, to a server of its own that
// keeps serving while Drain stops the public one. Its calls are neither
// authenticated nor bounded by rpcguard: only this process can dial it,
// and every Envoy call feeding it was bounded on the public server.
func (d *Daemon) Loopback() (target string, dial []grpc.DialOption) {
	return "passthrough:///regional-loopback", []grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return d.innerLis.Dial(ctx)
		}),
	}
}

// Drain is the first phase of Stop: health turns NOT_SERVING (gRPC health
// and /healthz) so load balancers move away, the public server stops
// accepting and its in-flight RPCs finish (bounded by DrainTimeout), and
// the HTTP server shuts down. The in-process LeaseService (Loopback) keeps
// serving, so a lease client of this process can release its leases after
// the calls it decides for have finished. Idempotent.
func (d *Daemon) Drain() {
	d.drainOnce.Do(d.ep.Drain)
}

// Stop drains (Drain, if not done yet), stops the in-process LeaseService
// (close its lease clients first: their leases are released through it),
// stops the background loops (the region leader resigns), then closes
// Redis. Idempotent.
func (d *Daemon) Stop() {
	d.stopOnce.Do(func() {
		d.Drain()
		done := make(chan struct{})
		go func() { d.inner.GracefulStop(); close(done) }()
		timer := time.NewTimer(d.ep.DrainTimeout())
		select {
		case <-done:
			timer.Stop()
		case <-timer.C:
			d.inner.Stop()
		}
		d.cancel()
		d.ep.Wait()
		d.Server.Close()
		d.Redis.Close()
		d.opts.Logger.Info("regional service stopped", "region", d.opts.Region)
	})
}
