package rpcguard

import (
	"crypto/tls"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/rpcauth"
)

// Names in sluice_rpc_bound of the transport's bounds.
const (
	BoundMessageBytes = "message_bytes"          // a received message's bytes
	BoundStreams      = "streams_per_connection" // open calls of one connection
)

// EdgeOptions configure the checks every call passes before its handler.
type EdgeOptions struct {
	// Config supplies auth.identities. Required.
	Config interface{ Current() *config.Config }
	// ServerTLS: with mutual TLS, callers are authorized by role.
	ServerTLS *tls.Config
	// Policy and Rules say what each method needs and may weigh.
	Policy rpcauth.Policy
	Rules  map[string]Rule
	// PerConnection and PerIdentity cap the units of work in flight
	// (Options). Optional, this package's defaults.
	PerConnection, PerIdentity int
	// MaxMessageBytes bounds a received message. Required.
	MaxMessageBytes int
	// MaxStreams bounds the open calls of one connection. Optional.
	MaxStreams uint32
	// Exported are more bounds the daemon applies, exported in
	// sluice_rpc_bound (Options.Exported). Optional.
	Exported   map[string]int
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Name is the daemon's name in the start-up warning.
	Name string
}

// EdgeServerOptions returns the gRPC server options that authorize (with
// mutual TLS) and bound every call, registering their metrics.
func ServerOptions(o EdgeOptions) ([]grpc.ServerOption, error) {
	var unary []grpc.UnaryServerInterceptor
	var stream []grpc.StreamServerInterceptor
	identity := rpcauth.Identity
	if rpcauth.RequiresClientCerts(o.ServerTLS) {
		a, err := rpcauth.New(rpcauth.Options{Config: o.Config, Policy: o.Policy, Registerer: o.Registerer, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		unary, stream = append(unary, a.Unary()), append(stream, a.Stream())
		if len(o.Config.Current().Auth.Identities) == 0 {
			o.Logger.Warn(o.Name + ": mutual TLS is on but the config lists no auth.identities: every call but health checks is refused until it does (docs/operations.md, Authentication and roles)")
		}
	} else {
		identity = nil
		o.Logger.Warn(o.Name + ": no mutual TLS (-tls-client-ca): callers are not authenticated, any client reaching the port may call every RPC; calls are bounded per connection only")
	}
	exported := map[string]int{BoundMessageBytes: o.MaxMessageBytes}
	if o.MaxStreams > 0 {
		exported[BoundStreams] = int(o.MaxStreams)
	}
	for name, v := range o.Exported {
		exported[name] = v
	}
	g, err := New(Options{
		Rules: o.Rules, PerConnection: o.PerConnection, PerIdentity: o.PerIdentity,
		Identity: identity, Registerer: o.Registerer, Exported: exported,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.Name, err)
	}
	unary, stream = append(unary, g.Unary()), append(stream, g.Stream())
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(o.MaxMessageBytes),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
	}
	if o.MaxStreams > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(o.MaxStreams))
	}
	return opts, nil
}
