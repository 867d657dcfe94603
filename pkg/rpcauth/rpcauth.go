// Package rpcauth authorizes gRPC calls by the caller's mutual TLS
// certificate: the certificate's SAN URIs and DNS names are its
// identities, the live config's auth.identities give them roles
// (instance, envoy, operator, region:NAME), and a Policy says which role
// each method needs. A call its roles do not allow is refused with
// PermissionDenied before its handler runs, counted in
// sluice_rpc_denied_total and logged at most once per identity per
// minute.
//
// Authorization needs authentication: it is only installed when the server
// requires client certificates. Without mutual TLS no caller has an
// identity, and every call is served (see docs/operations.md).
package rpcauth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/pkg/config"
)

// ConfigSource hands out the live config (configstore.Watcher,
// regional.StaticConfig): its auth.identities apply to the next call.
type ConfigSource interface {
	Current() *config.Config
}

// Rule is what one method needs of its caller.
type Rule struct {
	// Role is the role the caller must hold ("" with Scope or Any).
	Role string
	// Scope, when set, derives the role from the request: a region's
	// report needs region:<its region>. It must not fail on any request
	// (a wrong type returns "", which no caller holds).
	Scope func(req any) string
	// Any lets every authenticated caller in (health checks).
	Any bool
}

// Policy maps full method names ("/sluice.v1.LeaseService/Acquire") to
// rules. A service's name followed by "/*" ("/sluice.v1.LeaseService/*")
// covers its every method. A method no rule covers is refused.
type Policy map[string]Rule

func (p Policy) rule(method string) (Rule, bool) {
	if r, ok := p[method]; ok {
		return r, true
	}
	if i := strings.LastIndexByte(method, '/'); i > 0 {
		r, ok := p[method[:i]+"/*"]
		return r, ok
	}
	return Rule{}, false
}

// Options configure an Authorizer.
type Options struct {
	// Config supplies auth.identities. Required.
	Config ConfigSource
	// Policy says what each method needs. Required.
	Policy Policy
	// Registerer receives sluice_rpc_denied_total. Optional.
	Registerer prometheus.Registerer
	// Logger receives refusals, once per identity per LogEvery. Optional,
	// default slog.Default().
	Logger *slog.Logger
	// LogEvery is the least time between two log lines about one
	// identity. Optional, default one minute.
	LogEvery time.Duration
	// Now is the clock of the log limiter. Optional, default time.Now.
	Now func() time.Time
}

// Authorizer checks every call against its Policy. Safe for concurrent
// use.
type Authorizer struct {
	o      Options
	denied *prometheus.CounterVec

	mu     sync.Mutex
	logged map[string]time.Time // identity → when it was last logged
}

// New returns an Authorizer.
func New(o Options) (*Authorizer, error) {
	if o.Config == nil || o.Policy == nil {
		return nil, fmt.Errorf("rpcauth: Options.Config and Options.Policy are required")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.LogEvery == 0 {
		o.LogEvery = time.Minute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	a := &Authorizer{o: o, logged: map[string]time.Time{}}
	a.denied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rpc_denied_total",
		Help: "Calls refused with PermissionDenied because the caller's certificate holds no role the method needs (auth.identities), by method and the role it needed.",
	}, []string{"method", "needs"})
	if o.Registerer != nil {
		if err := o.Registerer.Register(a.denied); err != nil {
			return nil, fmt.Errorf("rpcauth: %w", err)
		}
	}
	return a, nil
}

// Caller is an authenticated caller.
type Caller struct {
	// Name is the caller's identity in logs: its first SAN URI, else its
	// first DNS name, else its subject.
	Name string
	// SANs are the certificate's SAN URIs and DNS names.
	SANs []string
	// Roles are the roles auth.identities gives them.
	Roles []string
}

type callerKey struct{}

// CallerOf returns the caller an Authorizer admitted, if any.
func CallerOf(ctx context.Context) (*Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(*Caller)
	return c, ok
}

// Identity is the caller's name, or "" when the call was not
// authenticated (no mutual TLS).
func Identity(ctx context.Context) string {
	if c, ok := CallerOf(ctx); ok {
		return c.Name
	}
	return ""
}

// Has reports whether the caller holds role.
func (c *Caller) Has(role string) bool {
	for _, r := range c.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// Leaf returns the verified client certificate of the call, if any.
func Leaf(ctx context.Context) (*x509.Certificate, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, false
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil, false
	}
	return ti.State.VerifiedChains[0][0], true
}

// SANs are a certificate's identities: its SAN URIs, then its DNS names.
func SANs(cert *x509.Certificate) []string {
	out := make([]string, 0, len(cert.URIs)+len(cert.DNSNames))
	for _, u := range cert.URIs {
		out = append(out, u.String())
	}
	return append(out, cert.DNSNames...)
}

func callerFrom(cert *x509.Certificate, auth config.Auth) *Caller {
	sans := SANs(cert)
	name := cert.Subject.String()
	if len(sans) > 0 {
		name = sans[0]
	}
	return &Caller{Name: name, SANs: sans, Roles: auth.RolesOf(sans)}
}

// authorize returns the context the handler runs with, or the refusal.
func (a *Authorizer) authorize(ctx context.Context, method string, req any, stream bool) (context.Context, error) {
	leaf, ok := Leaf(ctx)
	if !ok {
		// The server requires verified client certificates, so only a
		// misconfigured server gets here: refuse rather than serve.
		a.denied.WithLabelValues(method, "certificate").Inc()
		return nil, status.Errorf(codes.Unauthenticated, "%s: no verified client certificate", method)
	}
	cfg := a.o.Config.Current()
	var auth config.Auth
	if cfg != nil {
		auth = cfg.Auth
	}
	c := callerFrom(leaf, auth)
	ctx = context.WithValue(ctx, callerKey{}, c)
	r, ok := a.o.Policy.rule(method)
	var needs string
	switch {
	case !ok:
		needs = "none"
	case r.Any:
		return ctx, nil
	case r.Scope != nil:
		if stream {
			needs = "none"
			break
		}
		needs = r.Scope(req)
	default:
		needs = r.Role
	}
	if needs != "" && needs != "none" && c.Has(needs) {
		return ctx, nil
	}
	label := needs
	if r.Scope != nil {
		label = "scoped" // region:NAME: the name is the caller's to choose
	}
	a.denied.WithLabelValues(method, label).Inc()
	roles := strings.Join(c.Roles, ",")
	if roles == "" {
		roles = "none"
	}
	a.logOnce(c, method, needs, roles)
	if needs == "none" {
		return nil, status.Errorf(codes.PermissionDenied, "%s: no role may call this method (caller %s)", method, c.Name)
	}
	return nil, status.Errorf(codes.PermissionDenied, "%s needs role %q; caller %s holds %s (auth.identities)", method, needs, c.Name, roles)
}

func (a *Authorizer) logOnce(c *Caller, method, needs, roles string) {
	now := a.o.Now()
	a.mu.Lock()
	last, seen := a.logged[c.Name]
	log := !seen || now.Sub(last) >= a.o.LogEvery
	if log {
		a.logged[c.Name] = now
		if len(a.logged) > 4096 { // forget identities not seen within LogEvery
			for id, t := range a.logged {
				if now.Sub(t) >= a.o.LogEvery {
					delete(a.logged, id)
				}
			}
		}
	}
	a.mu.Unlock()
	if log {
		a.o.Logger.Warn("call refused: the caller's certificate holds no role for it (further refusals of this identity are counted in sluice_rpc_denied_total, logged again after a minute)",
			"identity", c.Name, "method", method, "needs", needs, "roles", roles)
	}
}

// Unary is the unary server interceptor.
func (a *Authorizer) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, err := a.authorize(ctx, info.FullMethod, req, false)
		if err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

// Stream is the stream server interceptor. A scoped rule needs the
// request: the stream's first message is authorized as it is received,
// before the handler sees it (a server-streaming call's only message, such
// as a Watch naming its region), and nothing is sent before that.
func (a *Authorizer) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if r, ok := a.o.Policy.rule(info.FullMethod); ok && r.Scope != nil && !r.Any {
			return h(srv, &scopedStream{ServerStream: ss, authorize: func(req any) (context.Context, error) {
				return a.authorize(ss.Context(), info.FullMethod, req, false)
			}})
		}
		ctx, err := a.authorize(ss.Context(), info.FullMethod, nil, true)
		if err != nil {
			return err
		}
		return h(srv, &wrapped{ServerStream: ss, ctx: ctx})
	}
}

// scopedStream authorizes its first received message with a scoped rule.
// Used by one handler goroutine, as grpc-go's streams are.
type scopedStream struct {
	grpc.ServerStream
	authorize func(req any) (context.Context, error)
	ctx       context.Context // set once the first message passed
}

func (s *scopedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.ctx == nil {
		ctx, err := s.authorize(m)
		if err != nil {
			return err
		}
		s.ctx = ctx
	}
	return nil
}

func (s *scopedStream) SendMsg(m any) error {
	if s.ctx == nil {
		return status.Error(codes.PermissionDenied, "nothing is sent on a scoped stream before its request is authorized")
	}
	return s.ServerStream.SendMsg(m)
}

func (s *scopedStream) Context() context.Context {
	if s.ctx != nil {
		return s.ctx
	}
	return s.ServerStream.Context()
}

type wrapped struct {
	grpc.ServerStream
	ctx context.Context
}

func (w *wrapped) Context() context.Context { return w.ctx }

// Standard method names of the services every daemon serves.
const (
	HealthService     = "/grpc.health.v1.Health/*"
	ReflectionV1      = "/grpc.reflection.v1.ServerReflection/*"
	ReflectionV1Alpha = "/grpc.reflection.v1alpha.ServerReflection/*"
)

// RequiresClientCerts reports whether a server TLS config authenticates
// every caller (mutual TLS), the condition for installing an Authorizer.
func RequiresClientCerts(c *tls.Config) bool {
	return c != nil && c.ClientAuth == tls.RequireAndVerifyClientCert
}
