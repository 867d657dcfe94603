// Package rpcguard bounds the work a gRPC call can cause before its
// handler runs, so one slow or abusive caller cannot starve the others.
//
// Every call weighs its units of work: the keys it names (reports of a
// Sync, descriptors of an Envoy request), at least one. Two bounds apply:
//
//   - per request: a method's Rule caps its units; a larger request is
//     refused with InvalidArgument naming the bound, before any Redis
//     call;
//   - in flight: the units of the calls being served on one connection,
//     and for an authenticated caller those of its identity over all its
//     connections, are capped. A call that does not fit waits its turn in
//     a first-come queue of its own connection or identity; when that
//     queue also holds its cap of units the call is refused with
//     ResourceExhausted naming the bound.
//
// A flood thus occupies at most its own connection's (identity's) share
// of the server, and other callers' calls are served beside it. Refusals
// are counted in sluice_rpc_refused_total{method,bound}; the bounds are
// exported as sluice_rpc_bound{bound}, the work waiting for a turn as
// sluice_rpc_waits_total{scope}.
package rpcguard

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Rule bounds one method's requests.
type Rule struct {
	// Units counts the units of work a request names; nil counts 1. A
	// request counts at least 1.
	Units func(req any) int
	// Max is the most units one request may name; 0 means no bound
	// beyond the in-flight ones.
	Max int
	// Bound names Max in refusals and metrics ("reports_per_sync").
	Bound string
	// Check, when set, applies further bounds on a request's shape; it
	// returns the name of the bound a request exceeds and why, or "".
	Check func(req any) (bound, why string)
	// CheckBounds are the bounds Check applies, by name, exported with
	// the others in sluice_rpc_bound. Optional.
	CheckBounds map[string]int
}

// Defaults of Options.
const (
	DefaultPerConnection = 2048
	DefaultPerIdentity   = 16384
	// DefaultQueueFactor: a connection or identity may have this many
	// times its in-flight cap waiting for a turn.
	DefaultQueueFactor = 16
)

// Options configure a Guard.
type Options struct {
	// Rules maps full method names to their bounds; a service's name
	// followed by "/*" covers its every method. Methods without a rule
	// weigh 1 and have no per-request bound.
	Rules map[string]Rule
	// PerConnection caps the units in flight on one connection. Optional,
	// default DefaultPerConnection; at least the largest Rule.Max.
	PerConnection int
	// PerIdentity caps the units in flight of one authenticated identity
	// over all its connections. Optional, default DefaultPerIdentity; at
	// least PerConnection.
	PerIdentity int
	// QueueFactor: up to QueueFactor × the cap may wait. Optional,
	// default DefaultQueueFactor.
	QueueFactor int
	// Identity names the caller of an authenticated call ("" when it is
	// not: no mutual TLS). Optional: without it only connections are
	// bounded.
	Identity func(ctx context.Context) string
	// Registerer receives the metrics. Optional.
	Registerer prometheus.Registerer
	// Exported are bounds applied elsewhere (the transport's message size
	// and streams per connection, a report's bytes), by name, exported
	// with the Guard's own in sluice_rpc_bound. Optional.
	Exported map[string]int
}

// Guard enforces Options. Safe for concurrent use.
type Guard struct {
	o       Options
	conns   pool[any]    // by connKey
	ids     pool[string] // by identity
	refused *prometheus.CounterVec
	waits   *prometheus.CounterVec
	bounds  *prometheus.GaugeVec
	// The waits counters, resolved once: a call that waits counts
	// without a label lookup.
	onConnWait, onIDWait func()
}

// New validates o and returns a Guard.
func New(o Options) (*Guard, error) {
	if o.PerConnection == 0 {
		o.PerConnection = DefaultPerConnection
	}
	if o.PerIdentity == 0 {
		o.PerIdentity = max(DefaultPerIdentity, o.PerConnection)
	}
	if o.QueueFactor == 0 {
		o.QueueFactor = DefaultQueueFactor
	}
	if o.PerConnection < 1 || o.QueueFactor < 1 {
		return nil, fmt.Errorf("rpcguard: PerConnection %d and QueueFactor %d must be at least 1", o.PerConnection, o.QueueFactor)
	}
	if o.PerIdentity < o.PerConnection {
		return nil, fmt.Errorf("rpcguard: PerIdentity %d must be at least PerConnection %d", o.PerIdentity, o.PerConnection)
	}
	for m, r := range o.Rules {
		if r.Max < 0 || r.Max > o.PerConnection {
			return nil, fmt.Errorf("rpcguard: %s: Max %d must be in 0..PerConnection (%d), or the request could never be served", m, r.Max, o.PerConnection)
		}
		if r.Max > 0 && r.Bound == "" {
			return nil, fmt.Errorf("rpcguard: %s: a Max needs a Bound name", m)
		}
	}
	g := &Guard{o: o}
	g.conns = pool[any]{cap: o.PerConnection, queue: o.QueueFactor * o.PerConnection, m: map[any]*sem{}}
	g.ids = pool[string]{cap: o.PerIdentity, queue: o.QueueFactor * o.PerIdentity, m: map[string]*sem{}}
	g.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rpc_refused_total",
		Help: "Calls refused before their handler ran because they exceed a bound on the work of one request (InvalidArgument) or on the work queued for one connection or identity (ResourceExhausted), by method and bound.",
	}, []string{"method", "bound"})
	g.waits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rpc_waits_total",
		Help: "Calls that waited for a turn because their connection or identity had its cap of work in flight, by scope (connection, identity).",
	}, []string{"scope"})
	g.onConnWait = g.waits.WithLabelValues("connection").Inc
	g.onIDWait = g.waits.WithLabelValues("identity").Inc
	g.bounds = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sluice_rpc_bound",
		Help: "The bounds on the work of calls: units (keys named) per request of a method, in flight per connection and per identity, queued per connection and per identity.",
	}, []string{"bound"})
	g.bounds.WithLabelValues("inflight_per_connection").Set(float64(o.PerConnection))
	g.bounds.WithLabelValues("inflight_per_identity").Set(float64(o.PerIdentity))
	g.bounds.WithLabelValues("queued_per_connection").Set(float64(g.conns.queue))
	g.bounds.WithLabelValues("queued_per_identity").Set(float64(g.ids.queue))
	for _, r := range o.Rules {
		if r.Max > 0 {
			g.bounds.WithLabelValues(r.Bound).Set(float64(r.Max))
		}
		for name, v := range r.CheckBounds {
			g.bounds.WithLabelValues(name).Set(float64(v))
		}
	}
	for name, v := range o.Exported {
		g.bounds.WithLabelValues(name).Set(float64(v))
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{g.refused, g.waits, g.bounds} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("rpcguard: %w", err)
			}
		}
	}
	return g, nil
}

func (g *Guard) rule(method string) Rule {
	if r, ok := g.o.Rules[method]; ok {
		return r
	}
	for i := len(method) - 1; i > 0; i-- {
		if method[i] == '/' {
			return g.o.Rules[method[:i]+"/*"]
		}
	}
	return Rule{}
}

// Admit weighs a request, waits for its turn and returns the function
// that ends it (once, however often it is called), or the refusal (a gRPC
// status error).
func (g *Guard) Admit(ctx context.Context, method string, req any) (done func(), err error) {
	t, err := g.admit(ctx, method, req)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(t.end) }, nil
}

// turn is an admitted call's hold on its connection's and, when it has
// one, its identity's semaphores.
type turn struct {
	conn hold[any]
	id   hold[string] // id.p is nil without an identity
}

// end ends the turn. Call it exactly once.
func (t turn) end() {
	if t.id.p != nil {
		t.id.release()
	}
	t.conn.release()
}

// admit is Admit without allocating: the interceptors end the turn they
// were given exactly once.
func (g *Guard) admit(ctx context.Context, method string, req any) (turn, error) {
	r := g.rule(method)
	n := 1
	if r.Units != nil && req != nil {
		n = max(1, r.Units(req))
	}
	if r.Max > 0 && n > r.Max {
		g.refused.WithLabelValues(method, r.Bound).Inc()
		return turn{}, status.Errorf(codes.InvalidArgument, "%s: the request names %d keys, more than the bound %s=%d; split it",
			method, n, r.Bound, r.Max)
	}
	if r.Check != nil && req != nil {
		if bound, why := r.Check(req); bound != "" {
			g.refused.WithLabelValues(method, bound).Inc()
			return turn{}, status.Errorf(codes.InvalidArgument, "%s: %s (bound %s)", method, why, bound)
		}
	}
	id := ""
	if g.o.Identity != nil {
		id = g.o.Identity(ctx)
	}
	var t turn
	var err error
	conn := connKey(ctx)
	if t.conn, err = g.conns.acquire(ctx, conn, n, g.onConnWait); err != nil {
		return turn{}, g.refuse(method, "connection", g.o.PerConnection, g.conns.queue, err)
	}
	if id == "" {
		return t, nil
	}
	// An identity's turns are shared out between its connections (sem).
	if t.id, err = g.ids.acquireFor(ctx, id, conn, n, g.onIDWait); err != nil {
		t.conn.release()
		return turn{}, g.refuse(method, "identity", g.o.PerIdentity, g.ids.queue, err)
	}
	return t, nil
}

// connKey names the call's connection among the pool's keys: its remote
// address. gRPC's transport reads a connection's address once, so a TCP
// or Unix address is one value per connection and serves as the key
// itself, without formatting it per call; any other address is keyed by
// its text, as is a call without one ("").
func connKey(ctx context.Context) any {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	switch a := p.Addr.(type) {
	case *net.TCPAddr:
		if a != nil {
			return a
		}
	case *net.UnixAddr:
		if a != nil {
			return a
		}
	}
	return p.Addr.String()
}

func (g *Guard) refuse(method, scope string, capUnits, queue int, err error) error {
	if err != errQueueFull {
		return status.FromContextError(err).Err()
	}
	g.refused.WithLabelValues(method, "queued_per_"+scope).Inc()
	return status.Errorf(codes.ResourceExhausted,
		"%s: this %s has %s units of work in flight and %s waiting, the bounds inflight_per_%s and queued_per_%s; retry later or spread the calls",
		method, scope, strconv.Itoa(capUnits), strconv.Itoa(queue), scope, scope)
}

// Unary is the unary server interceptor.
func (g *Guard) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		t, err := g.admit(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		defer t.end()
		return h(ctx, req)
	}
}

// Stream is the stream server interceptor: a stream weighs one unit for
// its whole life.
func (g *Guard) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		t, err := g.admit(ss.Context(), info.FullMethod, nil)
		if err != nil {
			return err
		}
		defer t.end()
		return h(srv, ss)
	}
}
