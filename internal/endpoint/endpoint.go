// Package endpoint is the serving shell every Sluice daemon shares: a gRPC
// server carrying the standard health service, an HTTP operations server
// (/metrics from the daemon's own registry, /healthz following gRPC health,
// /livez answering while the process serves), a group of background tasks,
// and a drain bounded in time.
package endpoint

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
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// MinPingInterval is how often, at most, a client may send HTTP/2 pings
// on a connection, with or without calls in flight: half the lease
// client's keepalive (lease.KeepaliveTime), as clients' timers drift.
const MinPingInterval = 5 * time.Second

// Options configure an Endpoint.
type Options struct {
	// Name is the daemon's name in log lines. Required.
	Name string
	// GRPCAddr is the gRPC listen address; ":0" picks a free port.
	// Required.
	GRPCAddr string
	// HTTPAddr is the operations listen address; "off" disables it.
	// Required.
	HTTPAddr string
	// ServerTLS, when set, serves gRPC over TLS. Optional.
	ServerTLS *tls.Config
	// GRPCOptions are more gRPC server options. Optional.
	GRPCOptions []grpc.ServerOption
	// Registry backs /metrics; the Go and process collectors are added.
	// Optional, default a new registry.
	Registry *prometheus.Registry
	// HealthzNote, when set, adds a word to /healthz's "ok" (a role).
	// Optional.
	HealthzNote func() string
	// DrainTimeout bounds Drain. Optional, default 10s.
	DrainTimeout time.Duration
	// Logger. Optional, default slog.Default().
	Logger *slog.Logger
}

// Endpoint is a daemon's listeners and tasks. Safe for concurrent use.
type Endpoint struct {
	GRPC     *grpc.Server
	Health   *health.Server
	Registry *prometheus.Registry

	opts    Options
	grpcLis net.Listener
	httpLis net.Listener
	http    *http.Server
	wg      sync.WaitGroup
}

// Listen opens the listeners and builds the servers; register services on
// GRPC, then call Serve.
func Listen(o Options) (*Endpoint, error) {
	if o.DrainTimeout == 0 {
		o.DrainTimeout = 10 * time.Second
	}
	if o.DrainTimeout < 0 {
		return nil, fmt.Errorf("%s: DrainTimeout %v is negative", o.Name, o.DrainTimeout)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	e := &Endpoint{Health: health.NewServer(), Registry: reg, opts: o}
	var err error
	if e.grpcLis, err = net.Listen("tcp", o.GRPCAddr); err != nil {
		return nil, fmt.Errorf("%s: listen %s: %w", o.Name, o.GRPCAddr, err)
	}
	if o.HTTPAddr != "off" {
		if e.httpLis, err = net.Listen("tcp", o.HTTPAddr); err != nil {
			e.grpcLis.Close()
			return nil, fmt.Errorf("%s: listen %s: %w", o.Name, o.HTTPAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.HandleFunc("/healthz", e.healthz)
		// /livez answers while the process serves HTTP: liveness must not
		// follow Redis or etcd (restarting replicas cannot fix either).
		mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		e.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}
	// Clients may ping an idle connection every MinPingInterval (lease
	// clients: every 10 s, to find a replica that froze); gRPC's default
	// policy closes the connection of a client that pings more often than
	// every 5 minutes.
	gopts := append([]grpc.ServerOption{grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
		MinTime: MinPingInterval, PermitWithoutStream: true})}, o.GRPCOptions...)
	if o.ServerTLS != nil {
		creds := observedCreds{credentials.NewTLS(o.ServerTLS), newRefusals(o.Logger, reg)}
		gopts = append(gopts, grpc.Creds(creds))
	}
	e.GRPC = grpc.NewServer(gopts...)
	healthpb.RegisterHealthServer(e.GRPC, e.Health)
	return e, nil
}

// Close releases the listeners of an Endpoint that never served (a start
// that failed half-way).
func (e *Endpoint) Close() {
	e.grpcLis.Close()
	if e.httpLis != nil {
		e.httpLis.Close()
	}
}

// Serve starts serving gRPC and HTTP in the task group.
func (e *Endpoint) Serve() {
	e.Go(func() error { return e.GRPC.Serve(e.grpcLis) })
	if e.http != nil {
		e.Go(func() error {
			if err := e.http.Serve(e.httpLis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
}

// Go runs f in the task group; an error it returns is logged.
func (e *Endpoint) Go(f func() error) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if err := f(); err != nil {
			e.opts.Logger.Error(e.opts.Name+" background task failed", "error", err)
		}
	}()
}

func (e *Endpoint) healthz(w http.ResponseWriter, r *http.Request) {
	resp, err := e.Health.Check(r.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		http.Error(w, "not serving", http.StatusServiceUnavailable)
		return
	}
	if e.opts.HealthzNote != nil {
		fmt.Fprintln(w, "ok", e.opts.HealthzNote())
		return
	}
	fmt.Fprintln(w, "ok")
}

// GRPCAddr is the bound gRPC address.
func (e *Endpoint) GRPCAddr() string { return e.grpcLis.Addr().String() }

// HTTPAddr is the bound operations address ("" when disabled).
func (e *Endpoint) HTTPAddr() string {
	if e.httpLis == nil {
		return ""
	}
	return e.httpLis.Addr().String()
}

// Drain turns health NOT_SERVING so balancers move away, lets in-flight
// RPCs finish (bounded by DrainTimeout, then closes them) and shuts the
// HTTP server down. Background tasks are the caller's to end; Wait waits
// for them.
func (e *Endpoint) Drain() {
	e.Health.Shutdown()
	done := make(chan struct{})
	go func() { e.GRPC.GracefulStop(); close(done) }()
	timer := time.NewTimer(e.opts.DrainTimeout)
	select {
	case <-done:
		timer.Stop()
	case <-timer.C:
		e.opts.Logger.Warn(e.opts.Name+": drain timed out; closing open RPCs", "timeout", e.opts.DrainTimeout)
		e.GRPC.Stop()
	}
	if e.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), e.opts.DrainTimeout)
		e.http.Shutdown(ctx)
		cancel()
	}
}

// DrainTimeout is the bound on Drain (Options.DrainTimeout after its
// default).
func (e *Endpoint) DrainTimeout() time.Duration { return e.opts.DrainTimeout }

// Wait waits for every task started with Go (and the servers).
func (e *Endpoint) Wait() { e.wg.Wait() }
