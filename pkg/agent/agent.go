package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/sluicehq/sluice/internal/endpoint"
	"github.com/sluicehq/sluice/internal/flagenv"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/rpcguard"
)

// Default listen addresses: loopback only, as the agent serves the
// processes beside it.
const (
	DefaultGRPCAddr    = "127.0.0.1:8081"
	DefaultHTTPAddr    = "127.0.0.1:8080"
	DefaultMetricsAddr = "127.0.0.1:8082"
)

// Bounds on the Envoy listener's calls, the regional service's
// (regional.MaxMessageBytes, regional.MaxStreamsPerConnection): the agent
// answers as its region's own endpoint does (docs/operations.md, "Request
// bounds").
const (
	// MaxMessageBytes bounds one received gRPC message.
	MaxMessageBytes = 1 << 20
	// MaxStreamsPerConnection bounds the calls one connection may have
	// open, served or waiting.
	MaxStreamsPerConnection = 1024
)

// ConfigSource hands out the live config; nil while none is loaded yet
// (the agent then answers 503 / codes.Unavailable and is not ready).
type ConfigSource interface {
	Current() *config.Config
}

// Options configure an Agent. cmd/agent fills them from flags; tests fill
// them directly.
type Options struct {
	// RegionAddr is the gRPC target of the region's LeaseService:
	// host:port, a comma-separated list of host:port (the region's
	// replicas), or any gRPC target; a list, or a dns:/// target naming
	// every replica (a headless Service), spreads the lease RPCs over
	// the replicas round-robin, so one replica down or restarting leaves
	// the others answering. Required.
	RegionAddr string
	// Region names the region RegionAddr serves, as the config names it
	// (optional): a key the region never answered this agent for runs its
	// local on_failure policy, while the region is out of reach, within
	// that region's static share of the key's limit. "", or a region the
	// config does not name, takes the largest static share of any region
	// (exact for a config of one region). See envoyrls.LiveStaticShare.
	Region string
	// RegionCreds are the transport credentials towards the region.
	// Optional, default plaintext.
	RegionCreds credentials.TransportCredentials
	// DialOptions are more options for the connection to the region.
	// Optional.
	DialOptions []grpc.DialOption
	// GRPCAddr serves the Envoy rate limit service, gRPC health and
	// reflection. Optional, default DefaultGRPCAddr; ":0" picks a free
	// port.
	GRPCAddr string
	// HTTPAddr serves POST /v1/allow. Optional, default DefaultHTTPAddr;
	// "off" disables it.
	HTTPAddr string
	// MetricsAddr serves /metrics, /healthz and /livez. Optional, default
	// DefaultMetricsAddr; "off" disables it.
	MetricsAddr string
	// Config supplies the limits and the Envoy descriptor mappings; read
	// on every request, so a reloaded config applies to the next one.
	// Required.
	Config ConfigSource
	// Lease configures the lease client. Its Registerer and Logger are
	// the agent's; InstanceID defaults to lease.UniqueID("agent");
	// Refresh and Classes default to the config's when it is loaded at
	// Start (the region's lease TTL must exceed 2 × Refresh), Tier to the
	// live config's tier of the key, Policies to the live config's
	// classes (a reloaded on_failure applies to the next degraded
	// decision), StaticShare to the live config's static share of the key
	// in Region. Set
	// BreakerTimeout below Envoy's filter timeout (20ms by default) so
	// that Envoy gets the class's on_failure decision while the region is
	// slow, rather than timing out.
	Lease lease.Options
	// EnvoyHeaders adds the x-ratelimit-*, ratelimit, ratelimit-policy and
	// retry-after headers to Envoy answers. Optional, default true (nil).
	EnvoyHeaders *bool
	// PerConnection caps the units of work (descriptors named) of the
	// Envoy calls served at once on one connection; calls beyond wait
	// their turn (rpcguard). Optional, rpcguard.DefaultPerConnection; at
	// least envoyrls.MaxDescriptors.
	PerConnection int
	// Registry receives every metric of the agent (sluice_agent_*,
	// sluice_envoy_*, sluice_client_*, sluice_rpc_*, Go and process).
	// Optional, default a new registry.
	Registry *prometheus.Registry
	// Logger. Optional, default slog.Default().
	Logger *slog.Logger
	// DrainTimeout bounds how long Stop waits for requests in flight.
	// Optional, default 5s.
	DrainTimeout time.Duration
	// ReleaseTimeout bounds the release of unspent tokens at Stop.
	// Optional, default 5s.
	ReleaseTimeout time.Duration
	// RequestReadTimeout bounds how long a caller of the HTTP API may take
	// to send one request, headers and body: a caller that stops sending
	// part-way has its connection closed then, instead of holding it and
	// a goroutine for good. Optional, default 10s.
	RequestReadTimeout time.Duration
}

// Agent is a running agent. Safe for concurrent use.
type Agent struct {
	opts   Options
	ep     *endpoint.Endpoint
	conn   *grpc.ClientConn
	client *lease.Client
	rls    *envoyrls.Service
	api    *api

	apiLis  net.Listener
	apiSrv  *http.Server
	cancel  context.CancelFunc
	stopped sync.Once
}

// Start opens the listeners, connects the lease client to the region and
// starts serving. The agent is ready (gRPC health SERVING, /healthz ok)
// once a config is loaded. Stop it with Stop.
func Start(o Options) (*Agent, error) {
	if o.RegionAddr == "" {
		return nil, fmt.Errorf("%w: agent: the region's address is required", quota.ErrInvalid)
	}
	if err := checkTarget(o.RegionAddr); err != nil {
		return nil, fmt.Errorf("%w: agent: region address %q: %v", quota.ErrInvalid, o.RegionAddr, err)
	}
	if o.Config == nil {
		return nil, fmt.Errorf("%w: agent: Options.Config is required", quota.ErrInvalid)
	}
	if o.GRPCAddr == "" {
		o.GRPCAddr = DefaultGRPCAddr
	}
	if o.HTTPAddr == "" {
		o.HTTPAddr = DefaultHTTPAddr
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = DefaultMetricsAddr
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = 5 * time.Second
	}
	if o.ReleaseTimeout == 0 {
		o.ReleaseTimeout = 5 * time.Second
	}
	if o.RequestReadTimeout == 0 {
		o.RequestReadTimeout = 10 * time.Second
	}
	if o.DrainTimeout < 0 || o.ReleaseTimeout < 0 || o.RequestReadTimeout < 0 {
		return nil, fmt.Errorf("%w: agent: DrainTimeout %v, ReleaseTimeout %v and RequestReadTimeout %v must not be negative",
			quota.ErrInvalid, o.DrainTimeout, o.ReleaseTimeout, o.RequestReadTimeout)
	}
	if o.PerConnection != 0 && o.PerConnection < envoyrls.MaxDescriptors {
		return nil, fmt.Errorf("%w: agent: PerConnection %d must be at least the descriptors one request may name, %d, or such a request could never be served",
			quota.ErrInvalid, o.PerConnection, envoyrls.MaxDescriptors)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.RegionCreds == nil {
		o.RegionCreds = insecure.NewCredentials()
	}
	lo := o.Lease
	lo.Logger = o.Logger
	if lo.InstanceID == "" {
		lo.InstanceID = lease.UniqueID("agent")
	}
	if lo.Tier == nil {
		lo.Tier = envoyrls.LiveTier(o.Config)
	}
	if lo.Policies == nil {
		lo.Policies = envoyrls.LivePolicies(o.Config)
	}
	if lo.StaticShare == nil {
		lo.StaticShare = envoyrls.LiveStaticShare(o.Config, o.Region)
	}
	if cfg := o.Config.Current(); cfg != nil {
		if lo.Refresh == 0 {
			lo.Refresh = time.Duration(cfg.Refresh)
		}
		if lo.Classes == nil {
			lo.Classes = classPolicies(cfg)
		}
		if _, ok := cfg.Regions[o.Region]; o.Region != "" && !ok {
			o.Logger.Warn("agent: the config names no such region; a key the region never answered runs its local on_failure policy within the largest static share of any region", "region", o.Region)
		}
	}

	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	// Every Envoy call is bounded before its handler, so before any lease
	// or Redis work, as on the regional service. The listener serves the
	// processes beside the agent, without TLS: calls are bounded per
	// connection.
	guard, err := rpcguard.New(rpcguard.Options{
		Rules:         map[string]rpcguard.Rule{envoyrls.Method: envoyrls.GuardRule()},
		PerConnection: o.PerConnection, Registerer: o.Registry,
		Exported: map[string]int{rpcguard.BoundMessageBytes: MaxMessageBytes, rpcguard.BoundStreams: MaxStreamsPerConnection},
	})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	ep, err := endpoint.Listen(endpoint.Options{
		Name: "agent", GRPCAddr: o.GRPCAddr, HTTPAddr: o.MetricsAddr,
		Registry: o.Registry, DrainTimeout: o.DrainTimeout, Logger: o.Logger,
		GRPCOptions: append([]grpc.ServerOption{
			grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxConcurrentStreams(MaxStreamsPerConnection),
			grpc.ChainUnaryInterceptor(guard.Unary()), grpc.ChainStreamInterceptor(guard.Stream()),
		}, envoyrls.ServerOptions()...),
	})
	if err != nil {
		return nil, err
	}
	lo.Registerer = ep.Registry
	a := &Agent{opts: o, ep: ep}
	fail := func(err error) (*Agent, error) {
		if a.client != nil {
			a.client.Close(context.Background())
		}
		if a.conn != nil {
			a.conn.Close()
		}
		if a.apiLis != nil {
			a.apiLis.Close()
		}
		ep.Close()
		return nil, err
	}
	if o.HTTPAddr != "off" {
		if a.apiLis, err = net.Listen("tcp", o.HTTPAddr); err != nil {
			return fail(fmt.Errorf("agent: listen %s: %w", o.HTTPAddr, err))
		}
	}
	if a.rls, err = envoyrls.New(envoyrls.Options{
		Config: o.Config, Registerer: ep.Registry, Logger: o.Logger, Headers: o.EnvoyHeaders,
	}); err != nil {
		return fail(err)
	}
	if a.api, err = newAPI(o.Config, ep.Registry); err != nil {
		return fail(err)
	}
	// Keepalive (lease.KeepaliveParams) takes a replica that froze out of
	// the rotation within seconds.
	// round_robin spreads the lease RPCs over every replica a dns:///
	// target resolves to (the replicas share all state through Redis), and
	// a lease RPC cut by its replica's stop is sent to another
	// (lease.ServiceConfig). The reconnect backoff is capped near the
	// breaker's cooldown (lease.ConnectParams): with gRPC's default,
	// growing to 120 s, the agent stayed degraded for up to tens of
	// seconds after a long regional outage ended.
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(o.RegionCreds),
		grpc.WithDefaultServiceConfig(lease.ServiceConfig),
		grpc.WithConnectParams(lease.ConnectParams()),
		grpc.WithKeepaliveParams(lease.KeepaliveParams()),
	}, o.DialOptions...)
	target := o.RegionAddr
	if replicas := strings.Split(o.RegionAddr, ","); len(replicas) > 1 {
		target, dial = staticReplicas(replicas, dial)
	}
	if a.conn, err = grpc.NewClient(target, dial...); err != nil {
		return fail(fmt.Errorf("agent: region address %s: %w", o.RegionAddr, err))
	}
	if a.client, err = lease.NewClient(a.conn, lo); err != nil {
		return fail(fmt.Errorf("agent: lease client: %w", err))
	}
	// Connect now rather than on the first request, which would otherwise
	// wait for the connection too.
	a.conn.Connect()
	a.rls.SetLimiter(a.client)
	a.api.limiter = a.client
	// The endpoint's server has envoyrls.ServerOptions: answers go out as
	// the handler encoded them.
	envoyrls.RegisterEncoded(ep.GRPC, a.rls)
	reflection.Register(ep.GRPC)

	ep.Health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	ep.Serve()
	if a.apiLis != nil {
		mux := http.NewServeMux()
		mux.Handle("/v1/allow", a.api)
		a.apiSrv = &http.Server{Handler: mux, ReadHeaderTimeout: min(5*time.Second, o.RequestReadTimeout),
			ReadTimeout: o.RequestReadTimeout, IdleTimeout: 2 * time.Minute}
		ep.Go(func() error {
			if err := a.apiSrv.Serve(a.apiLis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	ep.Go(func() error { a.watchReadiness(ctx); return nil })
	o.Logger.Info("agent started", "region", o.Region, "region_addr", o.RegionAddr, "instance", a.client.InstanceID(),
		"grpc", a.GRPCAddr(), "http", a.HTTPAddr(), "metrics", a.MetricsAddr())
	return a, nil
}

// readinessPoll is how often a not yet ready agent looks for its config.
const readinessPoll = 100 * time.Millisecond

// watchReadiness turns health SERVING once a config is loaded. A config,
// once loaded, is never unloaded (a watcher keeps the last good one).
func (a *Agent) watchReadiness(ctx context.Context) {
	t := time.NewTicker(readinessPoll)
	defer t.Stop()
	for a.opts.Config.Current() == nil {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	if ctx.Err() == nil {
		a.ep.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	}
}

// classPolicies are the lease client's class settings from cfg, for keys
// the region has not described yet.
func classPolicies(cfg *config.Config) map[string]lease.ClassPolicy {
	out := make(map[string]lease.ClassPolicy, len(cfg.Classes))
	for name, cl := range cfg.Classes {
		m, err := lease.ParseMode(string(cl.Mode))
		if err != nil {
			continue
		}
		p, err := lease.ParsePolicy(string(cl.OnFailure))
		if err != nil {
			continue
		}
		out[name] = lease.ClassPolicy{Mode: m, OnFailure: p, Shadow: cl.Shadow}
	}
	return out
}

// GRPCAddr is the bound Envoy rate limit service address.
func (a *Agent) GRPCAddr() string { return a.ep.GRPCAddr() }

// HTTPAddr is the bound /v1/allow address ("" when disabled).
func (a *Agent) HTTPAddr() string {
	if a.apiLis == nil {
		return ""
	}
	return a.apiLis.Addr().String()
}

// MetricsAddr is the bound /metrics address ("" when disabled).
func (a *Agent) MetricsAddr() string { return a.ep.HTTPAddr() }

// Registry holds the agent's metrics.
func (a *Agent) Registry() *prometheus.Registry { return a.ep.Registry }

// Client is the embedded lease client (read-only use: its Table's state).
func (a *Agent) Client() *lease.Client { return a.client }

// Stop stops answering (health NOT_SERVING, requests in flight finish,
// bounded by DrainTimeout), then releases the unspent tokens to the region
// (bounded by ReleaseTimeout) and closes the connection. Idempotent.
func (a *Agent) Stop() {
	a.stopped.Do(func() {
		a.cancel()
		if a.apiSrv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), a.opts.DrainTimeout)
			if err := a.apiSrv.Shutdown(ctx); err != nil {
				a.apiSrv.Close()
			}
			cancel()
		}
		a.ep.Drain()
		a.ep.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), a.opts.ReleaseTimeout)
		if err := a.client.Close(ctx); err != nil {
			a.opts.Logger.Warn("agent: releasing leased tokens failed; they return to the region when their leases expire", "err", err)
		}
		cancel()
		a.conn.Close()
		a.opts.Logger.Info("agent stopped")
	})
}

// staticReplicas is a gRPC target resolving to the given host:port
// addresses, each a replica of the region, with the dial options that make
// the connection use it: gRPC has no target naming a list of addresses.
func staticReplicas(replicas []string, dial []grpc.DialOption) (string, []grpc.DialOption) {
	r := manual.NewBuilderWithScheme("sluice-replicas")
	addrs := make([]resolver.Address, len(replicas))
	for i, addr := range replicas {
		addrs[i] = resolver.Address{Addr: strings.TrimSpace(addr)}
	}
	r.InitialState(resolver.State{Addresses: addrs})
	return r.Scheme() + ":///region", append(dial, grpc.WithResolvers(r))
}

// checkTarget refuses a region address gRPC would take and never connect
// with: neither host:port, a list of host:port, nor a target of a
// registered scheme (gRPC falls back to resolving the whole text as a host
// name, logs a warning, and every request is then decided by its
// on_failure policy).
func checkTarget(target string) error {
	if replicas := strings.Split(target, ","); len(replicas) > 1 {
		for _, addr := range replicas {
			if err := flagenv.HostPort(strings.TrimSpace(addr)); err != nil {
				return fmt.Errorf("replica %q: %v; a list names replicas as host:port, separated by commas", addr, err)
			}
		}
		return nil
	}
	if err := flagenv.GRPCTarget(target); err != nil {
		return fmt.Errorf("%v; want host:port, or a gRPC target such as dns:///host:port", err)
	}
	return nil
}
