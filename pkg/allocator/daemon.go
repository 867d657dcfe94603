package allocator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
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
	// maxMessageBytes lets one RegionReport carry DefaultMaxKeysPerReport
	// keys with long tenant ids.
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
	// ("/sluice"); the election key is <prefix>/election/global.
	Prefix string
	// SessionTTL is the etcd lease TTL behind the leadership. Optional,
	// default DefaultSessionTTL; whole seconds, at least 1s. etcd may
	// raise it to its minimum lease TTL.
	SessionTTL time.Duration
	// Config is the live config. Required. The replica campaigns at once,
	// so give it a source that already serves the config etcd holds
	// (cmd/global waits for its config.Watcher to load it first).
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
	// MaxKeysPerReport bounds the keys of one RegionReport. Optional,
	// default DefaultMaxKeysPerReport.
	MaxKeysPerReport int
}

// Daemon is a running global-tier replica. Safe for concurrent use.
type Daemon struct {
	opts     DaemonOptions
	Service  *Service
	Registry *prometheus.Registry
	Health   *health.Server

	grpc     *grpc.Server
	grpcLis  net.Listener
	http     *http.Server
	httpLis  net.Listener
	elector  *elector
	cancel   context.CancelFunc // ends the allocation loop and the observer
	stopElec context.CancelFunc // ends the campaign: stop granting, resign
	elecDone chan struct{}
	wg       sync.WaitGroup
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
	if o.DrainTimeout < 0 {
		return nil, fmt.Errorf("allocator: DrainTimeout %v is negative", o.DrainTimeout)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	d := &Daemon{opts: o, Registry: reg, Health: health.NewServer(), elecDone: make(chan struct{})}
	var err error
	if d.grpcLis, err = net.Listen("tcp", o.GRPCAddr); err != nil {
		return nil, fmt.Errorf("allocator: listen %s: %w", o.GRPCAddr, err)
	}
	if o.HTTPAddr != "off" {
		if d.httpLis, err = net.Listen("tcp", o.HTTPAddr); err != nil {
			d.grpcLis.Close()
			return nil, fmt.Errorf("allocator: listen %s: %w", o.HTTPAddr, err)
		}
	}
	advertise := o.Advertise
	if advertise == "" {
		advertise = d.grpcLis.Addr().String()
	}
	svc, err := newService(serviceOptions{
		config: o.Config, advertise: advertise, maxKeys: o.MaxKeysPerReport, logger: o.Logger,
	}, time.Now())
	if err != nil {
		d.closeListeners()
		return nil, err
	}
	newMetrics(reg, svc)
	d.Service = svc

	gopts := []grpc.ServerOption{grpc.MaxRecvMsgSize(maxMessageBytes), grpc.MaxSendMsgSize(maxMessageBytes)}
	if o.ServerTLS != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(o.ServerTLS)))
	}
	d.grpc = grpc.NewServer(gopts...)
	sluicev1.RegisterAllocatorServiceServer(d.grpc, svc)
	healthpb.RegisterHealthServer(d.grpc, d.Health)
	if d.httpLis != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.HandleFunc("/healthz", d.healthz)
		// /livez answers while the process serves HTTP: liveness must not
		// follow etcd (restarting replicas cannot fix etcd).
		mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		d.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}
	// Every replica that is up serves: leadership is not health, a
	// standby must stay in the pool to redirect and to take over.
	d.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	d.Health.SetServingStatus(sluicev1.AllocatorService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)

	d.elector = &elector{
		cli: o.Etcd, pfx: config.NewStore(o.Etcd, o.Prefix).ElectionPrefix() + "global",
		addr: advertise, ttl: o.SessionTTL, svc: svc, log: o.Logger,
	}
	runCtx, cancel := context.WithCancel(context.Background())
	elecCtx, stopElec := context.WithCancel(runCtx)
	d.cancel, d.stopElec = cancel, stopElec
	d.spawn(func() error { return d.grpc.Serve(d.grpcLis) })
	if d.http != nil {
		d.spawn(func() error {
			if err := d.http.Serve(d.httpLis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	d.spawn(func() error { svc.run(runCtx); return nil })
	d.spawn(func() error { d.elector.observe(runCtx); return nil })
	// Not in wg: an etcd that cannot be reached can hold the campaign's
	// own clean-up until the caller closes the client, and Stop must not
	// wait for that (see Stop).
	go func() {
		defer close(d.elecDone)
		d.elector.run(elecCtx)
	}()
	o.Logger.Info("global allocator started", "grpc", d.GRPCAddr(), "http", d.HTTPAddr(),
		"advertise", advertise, "election", d.elector.pfx, "session_ttl", o.SessionTTL)
	return d, nil
}

func (d *Daemon) closeListeners() {
	d.grpcLis.Close()
	if d.httpLis != nil {
		d.httpLis.Close()
	}
}

func (d *Daemon) spawn(f func() error) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := f(); err != nil {
			d.opts.Logger.Error("global allocator background task failed", "error", err)
		}
	}()
}

func (d *Daemon) healthz(w http.ResponseWriter, r *http.Request) {
	resp, err := d.Health.Check(r.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		http.Error(w, "not serving", http.StatusServiceUnavailable)
		return
	}
	role := "standby"
	if d.IsLeader() {
		role = "leader"
	}
	fmt.Fprintln(w, "ok", role)
}

// GRPCAddr is the bound gRPC address.
func (d *Daemon) GRPCAddr() string { return d.grpcLis.Addr().String() }

// HTTPAddr is the bound metrics address ("" when disabled).
func (d *Daemon) HTTPAddr() string {
	if d.httpLis == nil {
		return ""
	}
	return d.httpLis.Addr().String()
}

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
		done := make(chan struct{})
		go func() { d.grpc.GracefulStop(); close(done) }()
		timer := time.NewTimer(d.opts.DrainTimeout)
		select {
		case <-done:
			timer.Stop()
		case <-timer.C:
			d.opts.Logger.Warn("drain timed out; closing open RPCs", "timeout", d.opts.DrainTimeout)
			d.grpc.Stop()
		}
		if d.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), d.opts.DrainTimeout)
			d.http.Shutdown(ctx)
			cancel()
		}
		d.cancel()
		d.wg.Wait()
		d.opts.Logger.Info("global allocator stopped")
	})
}
