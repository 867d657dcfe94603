package allocator

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/endpoint"
	"github.com/sluicehq/sluice/internal/reportcodec"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/rpcauth"
	"github.com/sluicehq/sluice/pkg/rpcguard"
	"github.com/sluicehq/sluice/pkg/shard"
)

const (
	// DefaultGRPCAddr is where the AllocatorService listens by default.
	DefaultGRPCAddr = "127.0.0.1:7500"
	// DefaultHTTPAddr is where /metrics and /healthz listen by default.
	DefaultHTTPAddr = "127.0.0.1:7501"
	// DefaultSessionTTL is the etcd session TTL. A leader stops granting
	// half a TTL after its last confirmed lease refresh, and a standby
	// takes over at most about one TTL (plus etcd's lease expiry check)
	// after the leader vanished without resigning. 5s rides out an etcd
	// leader election (about 1-2s with default etcd settings) without
	// dropping leadership, and keeps the takeover close to the default
	// grant validity (5 epochs of 1s), during which regions keep running
	// on the grants they hold.
	DefaultSessionTTL = 5 * time.Second
	// DefaultDrainTimeout bounds graceful shutdown.
	DefaultDrainTimeout = 10 * time.Second
	// maxMessageBytes bounds one message: a RegionReport page of
	// DefaultMaxKeysPerPage keys at MaxReportBytesPerKey is 28 MB.
	maxMessageBytes = 64 << 20
)

// DaemonOptions configure a whole global-tier replica. cmd/global fills
// them from flags; tests fill them directly.
type DaemonOptions struct {
	// GRPCAddr is the AllocatorService listen address. Optional, default
	// DefaultGRPCAddr; ":0" picks a free port (see Daemon.GRPCAddr).
	GRPCAddr string
	// HTTPAddr serves /metrics and /healthz. Optional, default
	// DefaultHTTPAddr; "off" disables it.
	HTTPAddr string
	// Advertise is the host:port other replicas send regions to when this
	// replica leads (the value of its election key). Optional, default the
	// bound gRPC address, which is only reachable by others when GRPCAddr
	// names a routable host.
	Advertise string
	// Etcd is the client for leader election. Required; the caller owns
	// and closes it (after Stop).
	Etcd *clientv3.Client
	// Prefix is the etcd key prefix. Optional, default config.DefaultPrefix
	// ("/sluice"); the election key is <prefix>/election/global, the
	// durable lapsed set <prefix>/global/lapsed.
	Prefix string
	// SessionTTL is the etcd lease TTL behind the leadership. Optional,
	// default DefaultSessionTTL; whole seconds, at least 1s. etcd may
	// raise it to its minimum lease TTL.
	SessionTTL time.Duration
	// Shard is the allocator shard this replica serves (pkg/shard), in
	// 0..shard.MaxShards-1. Optional, default 0: with global_shards 1
	// (the default) shard 0 is the whole global tier. Shard 0 campaigns
	// under <prefix>/election/global and keeps <prefix>/global/lapsed;
	// shard I > 0 under <prefix>/election/global-shard-I and
	// <prefix>/global/lapsed-shard-I.
	Shard int
	// Config is the live config. Required. The replica campaigns at once,
	// so give it a source that already serves the config etcd holds
	// (cmd/global waits for its configstore.Watcher to load it first).
	Config ConfigSource
	// ServerTLS, when set, serves gRPC over TLS (mutual TLS when it
	// requires client certificates). Optional.
	ServerTLS *tls.Config
	// Registry receives the daemon's metrics. Optional, default a new
	// registry; the Go and process collectors are added to it either way.
	Registry *prometheus.Registry
	// Logger. Optional, default slog.Default().
	Logger *slog.Logger
	// DrainTimeout bounds graceful shutdown. Optional, default
	// DefaultDrainTimeout.
	DrainTimeout time.Duration
	// MaxKeysPerPage bounds the keys of one RegionReport message (a whole
	// report, or one page of a paged one) and the grants of one answer
	// page. Optional, default DefaultMaxKeysPerPage.
	MaxKeysPerPage int
	// MaxKeysPerReport is MaxKeysPerPage, read when that is 0.
	//
	// Deprecated: the bound is per message (page); use MaxKeysPerPage.
	MaxKeysPerReport int
	// MaxReportBytes bounds the wire bytes of the pages held for one
	// region's paged report in progress; a report beyond it is refused.
	// Optional, default DefaultMaxReportBytes.
	MaxReportBytes int
	// PerConnection and PerIdentity cap the units of work (keys named)
	// in flight per connection and per authenticated identity; calls
	// beyond wait their turn (rpcguard). Optional, default rpcguard's, and
	// at least MaxKeysPerPage.
	PerConnection, PerIdentity int
}

// Policy is who may call what on the global tier under mutual TLS: a
// region's leader (role region:NAME) that region's reports and nudges and
// no other region's, operators Status and reflection, everyone authenticated health
// checks.
func Policy() rpcauth.Policy {
	return rpcauth.Policy{
		methodSync:     {Scope: reportScope},
		methodSyncPage: {Scope: reportScope},
		// A region's leader watches for its own region's nudges only.
		methodWatch: {Scope: func(req any) string {
			r, ok := req.(*sluicev1.WatchRequest)
			if !ok {
				return ""
			}
			return config.RoleRegionPrefix + r.GetRegion()
		}},
		methodStatus:              {Role: config.RoleOperator},
		rpcauth.HealthService:     {Any: true},
		rpcauth.ReflectionV1:      {Role: config.RoleOperator},
		rpcauth.ReflectionV1Alpha: {Role: config.RoleOperator},
	}
}

// reportScope is the role a RegionReport (whole, a page, or a request for
// an answer page) needs: its own region's.
func reportScope(req any) string {
	r, ok := req.(*sluicev1.RegionReport)
	if !ok {
		return ""
	}
	return config.RoleRegionPrefix + r.GetRegion()
}

const (
	methodSync     = "/sluice.v1.AllocatorService/Sync"
	methodSyncPage = "/sluice.v1.AllocatorService/SyncPage"
	methodWatch    = "/sluice.v1.AllocatorService/Watch"
	methodStatus   = "/sluice.v1.AllocatorService/Status"
)

// Daemon is a running global-tier replica. Safe for concurrent use.
type Daemon struct {
	opts     DaemonOptions
	Service  *Service
	Registry *prometheus.Registry
	Health   *health.Server

	ep       *endpoint.Endpoint
	elector  *elector
	cancel   context.CancelFunc // ends the allocation loop and the observer
	stopElec context.CancelFunc // ends the campaign: stop granting, resign
	elecDone chan struct{}
	stopOnce sync.Once
}

// StartDaemon opens the listeners, starts serving and campaigns for the
// leadership. Stop it with Stop. ctx only bounds the start.
func StartDaemon(ctx context.Context, o DaemonOptions) (*Daemon, error) {
	if o.GRPCAddr == "" {
		o.GRPCAddr = DefaultGRPCAddr
	}
	if o.HTTPAddr == "" {
		o.HTTPAddr = DefaultHTTPAddr
	}
	if o.SessionTTL == 0 {
		o.SessionTTL = DefaultSessionTTL
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Etcd == nil {
		return nil, errors.New("allocator: DaemonOptions.Etcd is required")
	}
	if o.Config == nil || o.Config.Current() == nil {
		return nil, errors.New("allocator: DaemonOptions.Config is required")
	}
	if o.SessionTTL < time.Second || o.SessionTTL%time.Second != 0 {
		return nil, fmt.Errorf("allocator: SessionTTL %v must be whole seconds, at least 1s", o.SessionTTL)
	}
	if o.Shard < 0 || o.Shard >= shard.MaxShards {
		return nil, fmt.Errorf("allocator: Shard %d must be in 0..%d", o.Shard, shard.MaxShards-1)
	}
	if o.DrainTimeout < 0 {
		return nil, fmt.Errorf("allocator: DrainTimeout %v is negative", o.DrainTimeout)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d := &Daemon{opts: o, elecDone: make(chan struct{})}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if o.MaxKeysPerPage == 0 {
		o.MaxKeysPerPage = o.MaxKeysPerReport
	}
	maxKeys := o.MaxKeysPerPage
	if maxKeys == 0 {
		maxKeys = DefaultMaxKeysPerPage
	}
	// Every call is authorized (with mutual TLS: a report only from its
	// own region) and bounded before its handler; each page of a paged
	// report is one call, bounded as a whole report is.
	reportKeys := rpcguard.Rule{Units: func(req any) int {
		r, _ := req.(*sluicev1.RegionReport)
		return len(r.GetKeys())
	}, Max: maxKeys, Bound: "keys_per_report"}
	edge, err := rpcguard.ServerOptions(rpcguard.EdgeOptions{
		Name: "global allocator", Config: o.Config, ServerTLS: o.ServerTLS, Policy: Policy(),
		Rules:         map[string]rpcguard.Rule{methodSync: reportKeys, methodSyncPage: reportKeys},
		PerConnection: max(o.PerConnection, maxKeys), PerIdentity: max(o.PerIdentity, maxKeys, rpcguard.DefaultPerIdentity),
		MaxMessageBytes: maxMessageBytes, Registerer: o.Registry, Logger: o.Logger,
		Exported: map[string]int{"report_bytes": cmp.Or(o.MaxReportBytes, DefaultMaxReportBytes)},
	})
	if err != nil {
		return nil, err
	}
	ep, err := endpoint.Listen(endpoint.Options{
		Name: "global allocator", GRPCAddr: o.GRPCAddr, HTTPAddr: o.HTTPAddr, ServerTLS: o.ServerTLS,
		// Reports decoded into slabs (internal/reportcodec): proto's
		// decoder made four heap objects of every reported key, which
		// cost a shard more than the allocator's own work on the key.
		GRPCOptions: append(edge, grpc.MaxSendMsgSize(maxMessageBytes), grpc.ForceServerCodecV2(reportcodec.New())),
		Registry:    o.Registry, DrainTimeout: o.DrainTimeout, Logger: o.Logger, HealthzNote: d.role,
	})
	if err != nil {
		return nil, err
	}
	d.ep, d.Registry, d.Health = ep, ep.Registry, ep.Health
	advertise := o.Advertise
	if advertise == "" {
		advertise = ep.GRPCAddr()
	}
	svc, err := newService(serviceOptions{
		config: o.Config, advertise: advertise, maxKeys: o.MaxKeysPerPage, maxBytes: o.MaxReportBytes, logger: o.Logger,
		sessionTTL: o.SessionTTL,
	}, time.Now())
	if err != nil {
		ep.Close()
		return nil, err
	}
	svc.sh.index = o.Shard
	// Configs of revisions regions report and this replica never held are
	// read back from etcd, each request bounded (history.go).
	hist := configstore.NewStore(o.Etcd, o.Prefix)
	hist.SetRequestTimeout(historyRequestTimeout)
	svc.hist.src, svc.hist.wake = hist, make(chan struct{}, 1)
	newMetrics(ep.Registry, svc)
	d.Service = svc

	sluicev1.RegisterAllocatorServiceServer(ep.GRPC, svc)
	// Every replica that is up serves: leadership is not health, a
	// standby must stay in the pool to redirect and to take over.
	d.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	d.Health.SetServingStatus(sluicev1.AllocatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)

	store := configstore.NewStore(o.Etcd, o.Prefix)
	d.elector = &elector{
		cli: o.Etcd, pfx: store.ElectionPrefix() + shard.ElectionName(o.Shard), lapsedKey: LapsedKeyOf(store.Prefix(), o.Shard),
		addr: advertise, ttl: o.SessionTTL, svc: svc, log: o.Logger,
	}
	runCtx, cancel := context.WithCancel(context.Background())
	elecCtx, stopElec := context.WithCancel(runCtx)
	d.cancel, d.stopElec = cancel, stopElec
	ep.Serve()
	ep.Go(func() error { svc.run(runCtx); return nil })
	ep.Go(func() error { svc.runHistory(runCtx); return nil })
	ep.Go(func() error { d.elector.observe(runCtx); return nil })
	// Not in wg: an etcd that cannot be reached can hold the campaign's
	// own clean-up until the caller closes the client, and Stop must not
	// wait for that (see Stop).
	go func() {
		defer close(d.elecDone)
		d.elector.run(elecCtx)
	}()
	o.Logger.Info("global allocator started", "grpc", d.GRPCAddr(), "http", d.HTTPAddr(),
		"advertise", advertise, "shard", o.Shard, "election", d.elector.pfx, "session_ttl", o.SessionTTL)
	return d, nil
}

// role is this replica's part, for /healthz.
func (d *Daemon) role() string {
	if d.Service != nil && d.IsLeader() {
		return "leader"
	}
	return "standby"
}

// GRPCAddr is the bound gRPC address.
func (d *Daemon) GRPCAddr() string { return d.ep.GRPCAddr() }

// HTTPAddr is the bound metrics address ("" when disabled).
func (d *Daemon) HTTPAddr() string { return d.ep.HTTPAddr() }

// Advertise is the address this replica campaigns with.
func (d *Daemon) Advertise() string { return d.elector.addr }

// IsLeader reports whether this replica currently answers Sync as leader.
func (d *Daemon) IsLeader() bool { return d.Service.IsLeader() }

// Stop drains: health turns NOT_SERVING, the replica stops granting and
// resigns so a standby takes over at once, in-flight RPCs finish (bounded
// by DrainTimeout), then the background loops end. Idempotent. The etcd
// client stays open; close it after Stop.
func (d *Daemon) Stop() {
	d.stopOnce.Do(func() {
		d.Health.Shutdown()
		d.stopElec()
		// Resign and revoke are bounded (releaseTimeoutMax each); only a
		// campaign cut off from etcd can take longer, and it ends when the
		// caller closes the etcd client.
		select {
		case <-d.elecDone:
		case <-time.After(2*releaseTimeoutMax + time.Second):
			d.opts.Logger.Warn("election did not wind down; continuing shutdown (it ends when the etcd client is closed)")
		}
		d.ep.Drain()
		d.cancel()
		d.ep.Wait()
		d.opts.Logger.Info("global allocator stopped")
	})
}
