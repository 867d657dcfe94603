package rpcauth

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// liveConfig is a ConfigSource whose config a test replaces between calls.
type liveConfig struct{ p atomic.Pointer[config.Config] }

func (l *liveConfig) Current() *config.Config { return l.p.Load() }

func authConfig(ids ...config.Identity) *config.Config {
	return &config.Config{Auth: config.Auth{Identities: ids}}
}

// who is what a handler knows of its caller: "name roles SANs", or
// "anonymous".
func who(ctx context.Context) string {
	c, ok := CallerOf(ctx)
	if !ok {
		if Identity(ctx) != "" {
			return "identity without a caller"
		}
		return "anonymous"
	}
	if Identity(ctx) != c.Name {
		return "identity " + Identity(ctx) + " differs from caller " + c.Name
	}
	return c.Name + " roles=" + strings.Join(c.Roles, ",") + " sans=" + strings.Join(c.SANs, ",")
}

// probeService is a gRPC service whose handlers answer with who called
// them. Watch receives one message then answers; Push tries to answer
// before it received anything, then receives and answers with what it saw
// before and after (FailedPrecondition when the stream ended first);
// Greet and Hello answer first, then receive.
var probeService = grpc.ServiceDesc{
	ServiceName: "probe.S",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Get", Handler: probeUnary("Get")},
		{MethodName: "Scoped", Handler: probeUnary("Scoped")},
		{MethodName: "Open", Handler: probeUnary("Open")},
		{MethodName: "Unlisted", Handler: probeUnary("Unlisted")},
	},
	Streams: []grpc.StreamDesc{
		{StreamName: "Watch", Handler: probeWatch, ServerStreams: true},
		{StreamName: "Sub", Handler: probeWatch, ServerStreams: true},
		{StreamName: "Push", Handler: probePush, ServerStreams: true, ClientStreams: true},
		{StreamName: "Greet", Handler: probeGreet, ServerStreams: true, ClientStreams: true},
		{StreamName: "Hello", Handler: probeGreet, ServerStreams: true, ClientStreams: true},
	},
}

// otherService is covered by a "/*" rule.
var otherService = grpc.ServiceDesc{
	ServiceName: "probe.T",
	HandlerType: (*any)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Any", Handler: probeUnaryOf("probe.T", "Any")}},
}

func probeUnary(name string) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	return probeUnaryOf("probe.S", name)
}

func probeUnaryOf(service, name string) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	return func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, _ any) (any, error) { return wrapperspb.String(who(ctx)), nil }
		if ic == nil {
			return h(ctx, in)
		}
		return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/" + service + "/" + name}, h)
	}
}

func probeWatch(_ any, ss grpc.ServerStream) error {
	in := new(wrapperspb.StringValue)
	if err := ss.RecvMsg(in); err != nil {
		return err
	}
	return ss.SendMsg(wrapperspb.String(who(ss.Context())))
}

func probePush(_ any, ss grpc.ServerStream) error {
	if err := ss.SendMsg(wrapperspb.String("sent before the request")); status.Code(err) != codes.PermissionDenied {
		return status.Errorf(codes.Internal, "a scoped stream sent before its request was authorized: %v", err)
	}
	before := who(ss.Context())
	in := new(wrapperspb.StringValue)
	if err := ss.RecvMsg(in); errors.Is(err, io.EOF) {
		return status.Error(codes.FailedPrecondition, "the stream ended before its request")
	} else if err != nil {
		return err
	}
	return ss.SendMsg(wrapperspb.String("before: " + before + "; after: " + who(ss.Context())))
}

// probeGreet answers before it receives anything.
func probeGreet(_ any, ss grpc.ServerStream) error {
	if err := ss.SendMsg(wrapperspb.String("hello " + who(ss.Context()))); err != nil {
		return err
	}
	return ss.RecvMsg(new(wrapperspb.StringValue))
}

// scopeOf derives region:<value> from a request, "" from anything else.
func scopeOf(req any) string {
	if r, ok := req.(*wrapperspb.StringValue); ok {
		return config.RoleRegionPrefix + r.GetValue()
	}
	return ""
}

var probePolicy = Policy{
	"/probe.S/Get":    {Role: config.RoleOperator},
	"/probe.S/Scoped": {Scope: scopeOf},
	"/probe.S/Open":   {Any: true},
	"/probe.S/Watch":  {Scope: scopeOf},
	"/probe.S/Sub":    {Role: config.RoleInstance},
	"/probe.S/Push":   {Scope: scopeOf},
	"/probe.S/Greet":  {Any: true, Scope: scopeOf},
	"/probe.S/Hello":  {Role: config.RoleInstance},
	"/probe.T/*":      {Role: config.RoleEnvoy},
}

// pki is a CA with a server certificate for 127.0.0.1 and client
// certificates issued on demand.
type pki struct {
	ca     *tlsconfig.CA
	pool   *x509.CertPool
	server tls.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	now := time.Now()
	ca, err := tlsconfig.NewCA("probe CA", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := ca.Pool()
	p := &pki{ca: ca, pool: pool}
	p.server = p.issue(t, tlsconfig.Leaf{Name: "server", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	return p
}

func (p *pki) issue(t *testing.T, l tlsconfig.Leaf) tls.Certificate {
	t.Helper()
	pair, err := p.ca.IssueCertificate(l, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// serve runs the probe services behind an Authorizer on a server with
// serverTLS (nil: plaintext).
func serve(t *testing.T, a *Authorizer, serverTLS *tls.Config) string {
	t.Helper()
	opts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(a.Unary()), grpc.ChainStreamInterceptor(a.Stream())}
	if serverTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(serverTLS)))
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&probeService, struct{}{})
	srv.RegisterService(&otherService, struct{}{})
	return grpctest.Serve(t, srv)
}

func (p *pki) mutualTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.server}, ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert}
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (p *pki) client(t *testing.T, addr string, l tlsconfig.Leaf) *grpc.ClientConn {
	t.Helper()
	l.Client = true
	cert := p.issue(t, l)
	return dial(t, addr, credentials.NewTLS(&tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}}))
}

// call makes one call of method (a unary method, or a stream sending one
// message) and returns the answer.
func call(ctx context.Context, conn *grpc.ClientConn, method, arg string) (string, error) {
	out := new(wrapperspb.StringValue)
	switch method {
	case "/probe.S/Watch", "/probe.S/Sub", "/probe.S/Push", "/probe.S/Greet", "/probe.S/Hello":
		cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
		if err != nil {
			return "", err
		}
		if err := cs.SendMsg(wrapperspb.String(arg)); err != nil && err.Error() != "EOF" {
			return "", err
		}
		if err := cs.CloseSend(); err != nil {
			return "", err
		}
		if err := cs.RecvMsg(out); err != nil {
			return "", err
		}
		return out.GetValue(), nil
	}
	if err := conn.Invoke(ctx, method, wrapperspb.String(arg), out); err != nil {
		return "", err
	}
	return out.GetValue(), nil
}

// TestCallersOnlyCallWhatTheirRolesAllow serves the probe services over
// mutual TLS: each caller's identities are its certificate's SAN URIs then
// DNS names (its name the first of them, else its subject), its roles those
// auth.identities gives any of them, and each method is served only to a
// caller holding the role its rule needs (a scoped rule's derived from the
// request, on unary calls and on a stream's first message); a method no
// rule covers is refused to everyone, and a refusal names the role needed
// and the roles held.
func TestCallersOnlyCallWhatTheirRolesAllow(t *testing.T) {
	p := newPKI(t)
	live := &liveConfig{}
	live.p.Store(authConfig(
		config.Identity{Match: "spiffe://probe/operator", Roles: config.RoleOperator},
		config.Identity{Match: "spiffe://probe/region/us*", Roles: "region:us, instance"},
		config.Identity{Match: "envoy.probe", Roles: config.RoleEnvoy},
		config.Identity{Match: "spiffe://probe/odd", Roles: "none"},
	))
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	a, err := New(Options{Config: live, Policy: probePolicy, Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, a, p.mutualTLS())
	ctx := t.Context()

	operator := p.client(t, addr, tlsconfig.Leaf{Name: "op", URIs: []string{"spiffe://probe/operator"}, DNSNames: []string{"op.probe"}})
	region := p.client(t, addr, tlsconfig.Leaf{Name: "us", URIs: []string{"spiffe://probe/region/us-1"}})
	envoyByDNS := p.client(t, addr, tlsconfig.Leaf{Name: "envoy", DNSNames: []string{"envoy.probe"}})
	// Its first SAN, an URI, has no role; its DNS name has envoy's.
	unlistedURI := p.client(t, addr, tlsconfig.Leaf{Name: "mixed", URIs: []string{"spiffe://probe/nobody"}, DNSNames: []string{"envoy.probe"}})
	bare := p.client(t, addr, tlsconfig.Leaf{Name: "bare"})
	odd := p.client(t, addr, tlsconfig.Leaf{Name: "odd", URIs: []string{"spiffe://probe/odd"}})

	for _, tc := range []struct {
		name   string
		conn   *grpc.ClientConn
		method string
		arg    string
		want   string     // the answer when served
		code   codes.Code // the refusal otherwise
		msg    string     // in the refusal
	}{
		{"operator gets", operator, "/probe.S/Get", "", "spiffe://probe/operator roles=operator sans=spiffe://probe/operator,op.probe", codes.OK, ""},
		{"region may not get", region, "/probe.S/Get", "", "", codes.PermissionDenied,
			`/probe.S/Get needs role "operator"; caller spiffe://probe/region/us-1 holds instance,region:us`},
		{"a caller without roles holds none", bare, "/probe.S/Get", "", "", codes.PermissionDenied,
			`needs role "operator"; caller CN=bare holds none`},
		{"region reports for itself", region, "/probe.S/Scoped", "us", "spiffe://probe/region/us-1 roles=instance,region:us sans=spiffe://probe/region/us-1", codes.OK, ""},
		{"region may not report for another", region, "/probe.S/Scoped", "eu", "", codes.PermissionDenied,
			`/probe.S/Scoped needs role "region:eu"; caller spiffe://probe/region/us-1 holds instance,region:us`},
		{"operator may not report", operator, "/probe.S/Scoped", "us", "", codes.PermissionDenied, `needs role "region:us"`},
		{"anyone authenticated is served by an Any rule", bare, "/probe.S/Open", "", "CN=bare roles= sans=", codes.OK, ""},
		{"an unlisted method is refused to every role", operator, "/probe.S/Unlisted", "", "", codes.PermissionDenied,
			"/probe.S/Unlisted: no role may call this method (caller spiffe://probe/operator)"},
		{"a role named none does not open an unlisted method", odd, "/probe.S/Unlisted", "", "", codes.PermissionDenied, "no role may call this method"},
		{"a service rule covers its methods", envoyByDNS, "/probe.T/Any", "", "envoy.probe roles=envoy sans=envoy.probe", codes.OK, ""},
		{"a service rule needs its role", operator, "/probe.T/Any", "", "", codes.PermissionDenied, `needs role "envoy"`},
		{"a later SAN's roles count", unlistedURI, "/probe.T/Any", "", "spiffe://probe/nobody roles=envoy sans=spiffe://probe/nobody,envoy.probe", codes.OK, ""},
		{"a scoped stream's first message is authorized", region, "/probe.S/Watch", "us", "spiffe://probe/region/us-1 roles=instance,region:us sans=spiffe://probe/region/us-1", codes.OK, ""},
		{"a scoped stream for another region is refused", region, "/probe.S/Watch", "eu", "", codes.PermissionDenied, `needs role "region:eu"`},
		{"a stream with a role is authorized before its handler", region, "/probe.S/Sub", "", "spiffe://probe/region/us-1 roles=instance,region:us sans=spiffe://probe/region/us-1", codes.OK, ""},
		{"a stream without the role is refused", operator, "/probe.S/Sub", "", "", codes.PermissionDenied, `needs role "instance"`},
		{"a stream any caller may call is not held as a scoped one", bare, "/probe.S/Greet", "", "hello CN=bare roles= sans=", codes.OK, ""},
		{"a stream with a role may answer before it receives", region, "/probe.S/Hello", "",
			"hello spiffe://probe/region/us-1 roles=instance,region:us sans=spiffe://probe/region/us-1", codes.OK, ""},
		{"a scoped stream sends nothing before its request passed", region, "/probe.S/Push", "us",
			"before: anonymous; after: spiffe://probe/region/us-1 roles=instance,region:us sans=spiffe://probe/region/us-1", codes.OK, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := call(ctx, tc.conn, tc.method, tc.arg)
			if status.Code(err) != tc.code {
				t.Fatalf("%s(%q): %q, %v; want code %v", tc.method, tc.arg, got, err, tc.code)
			}
			if err != nil {
				if !strings.Contains(status.Convert(err).Message(), tc.msg) {
					t.Errorf("refusal %q does not say %q", status.Convert(err).Message(), tc.msg)
				}
				return
			}
			if got != tc.want {
				t.Errorf("served as %q, want %q", got, tc.want)
			}
		})
	}
	// A scoped stream that ends before its request is not authorized on
	// nothing: its handler sees the end.
	cs, err := region.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/probe.S/Push")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(wrapperspb.StringValue)); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a scoped stream without a request: %v, want the handler's FailedPrecondition", err)
	}
	for _, m := range []struct {
		method, needs string
		want          float64
	}{
		{"/probe.S/Get", "operator", 2},
		{"/probe.S/Scoped", "scoped", 2},
		{"/probe.S/Unlisted", "none", 2},
		{"/probe.T/Any", "envoy", 1},
		{"/probe.S/Watch", "scoped", 1},
		{"/probe.S/Sub", "instance", 1},
	} {
		if got := count(t, a, m.method, m.needs); got != m.want {
			t.Errorf("sluice_rpc_denied_total{method=%q,needs=%q} = %v, want %v", m.method, m.needs, got, m.want)
		}
	}
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 1 || len(mfs[0].GetMetric()) != 6 {
		t.Errorf("registered: %v, %v; want the 6 series of sluice_rpc_denied_total", mfs, err)
	}
	for _, line := range []string{
		`identity=spiffe://probe/region/us-1 method=/probe.S/Get needs=operator roles=instance,region:us`,
		`identity="CN=bare" method=/probe.S/Get needs=operator roles=none`,
		`identity=spiffe://probe/operator method=/probe.S/Scoped needs=region:us roles=operator`,
		`identity=spiffe://probe/odd method=/probe.S/Unlisted needs=none roles=none`,
	} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("no log line with %q in\n%s", line, logs.String())
		}
	}

	// The roles are read from the live config on every call, open
	// connections too.
	live.p.Store(authConfig(config.Identity{Match: "spiffe://probe/region/us-1", Roles: config.RoleOperator}))
	if got, err := call(ctx, region, "/probe.S/Get", ""); err != nil || got != "spiffe://probe/region/us-1 roles=operator sans=spiffe://probe/region/us-1" {
		t.Errorf("after the config gave the region operator: %q, %v", got, err)
	}
	if _, err := call(ctx, operator, "/probe.S/Get", ""); status.Code(err) != codes.PermissionDenied {
		t.Errorf("after the config dropped the operator: %v, want PermissionDenied", err)
	}
	// Without a config no caller holds a role: only Any rules serve.
	live.p.Store(nil)
	if _, err := call(ctx, region, "/probe.S/Get", ""); status.Code(err) != codes.PermissionDenied {
		t.Errorf("without a config: %v, want PermissionDenied", err)
	}
	if got, err := call(ctx, region, "/probe.S/Open", ""); err != nil || got != "spiffe://probe/region/us-1 roles= sans=spiffe://probe/region/us-1" {
		t.Errorf("an Any rule without a config: %q, %v", got, err)
	}
}

// count is sluice_rpc_denied_total{method, needs}.
func count(t *testing.T, a *Authorizer, method, needs string) float64 {
	t.Helper()
	var m dto.Metric
	if err := a.denied.WithLabelValues(method, needs).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestCallsWithoutAVerifiedCertificateAreUnauthenticated: an Authorizer on
// a server that does not verify client certificates (plaintext, or TLS
// without client certificates) refuses every call, Any rules included,
// with Unauthenticated, counted as needing a certificate.
func TestCallsWithoutAVerifiedCertificateAreUnauthenticated(t *testing.T) {
	p := newPKI(t)
	live := &liveConfig{}
	live.p.Store(authConfig(config.Identity{Match: "spiffe://probe/operator", Roles: config.RoleOperator}))
	a, err := New(Options{Config: live, Policy: probePolicy, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	plain := dial(t, serve(t, a, nil), insecure.NewCredentials())
	serverOnly := dial(t, serve(t, a, &tls.Config{Certificates: []tls.Certificate{p.server}}), credentials.NewTLS(&tls.Config{RootCAs: p.pool}))
	for name, conn := range map[string]*grpc.ClientConn{"plaintext": plain, "server-only TLS": serverOnly} {
		for _, method := range []string{"/probe.S/Open", "/probe.S/Get", "/probe.S/Sub", "/probe.S/Watch"} {
			if got, err := call(t.Context(), conn, method, "us"); status.Code(err) != codes.Unauthenticated {
				t.Errorf("%s %s: %q, %v; want Unauthenticated", name, method, got, err)
			}
		}
	}
	if got := count(t, a, "/probe.S/Open", "certificate"); got != 2 {
		t.Errorf("refusals counted as needing a certificate: %v, want 2", got)
	}
}

// TestNewNeedsConfigAndPolicy: New refuses Options without a Config or
// without a Policy, and a Registerer that already holds the metric.
func TestNewNeedsConfigAndPolicy(t *testing.T) {
	live := &liveConfig{}
	if _, err := New(Options{Policy: probePolicy}); err == nil {
		t.Error("New without a Config succeeded")
	}
	if _, err := New(Options{Config: live}); err == nil {
		t.Error("New without a Policy succeeded")
	}
	reg := prometheus.NewRegistry()
	if _, err := New(Options{Config: live, Policy: probePolicy, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Config: live, Policy: probePolicy, Registerer: reg}); err == nil {
		t.Error("a second Authorizer registered sluice_rpc_denied_total again")
	}
}

// TestNewLogsOncePerMinuteByDefault: without LogEvery, an identity's
// refusals are logged once a minute of the Options' clock; without a
// clock or a logger, refusals still work.
func TestNewLogsOncePerMinuteByDefault(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	a, err := New(Options{Config: &liveConfig{}, Policy: probePolicy, Logger: slog.New(slog.NewTextHandler(&buf, nil)),
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	x := &Caller{Name: "spiffe://t/x"}
	a.logOnce(x, "/m", "instance", "none")
	now = now.Add(time.Minute - time.Nanosecond)
	a.logOnce(x, "/m", "instance", "none")
	if got := strings.Count(buf.String(), "call refused"); got != 1 {
		t.Fatalf("%d lines within a minute, want 1", got)
	}
	now = now.Add(time.Nanosecond)
	a.logOnce(x, "/m", "instance", "none")
	if got := strings.Count(buf.String(), "call refused"); got != 2 {
		t.Fatalf("%d lines after a minute, want 2", got)
	}

	d, err := New(Options{Config: &liveConfig{}, Policy: probePolicy})
	if err != nil {
		t.Fatal(err)
	}
	if d.o.Logger == nil || d.o.Now == nil || d.o.LogEvery != time.Minute {
		t.Errorf("defaults: logger %v, clock set %v, every %v", d.o.Logger, d.o.Now != nil, d.o.LogEvery)
	}
}

// TestLoggedIdentitiesAreForgottenPastTheirMinute: the log limiter keeps
// at most 4096 identities before it forgets those last logged a LogEvery
// or more ago.
func TestLoggedIdentitiesAreForgottenPastTheirMinute(t *testing.T) {
	now := time.Unix(1000, 0)
	a := &Authorizer{o: Options{Logger: slog.New(slog.DiscardHandler), LogEvery: time.Minute,
		Now: func() time.Time { return now }}, logged: map[string]time.Time{}}
	log := func(name string) { a.logOnce(&Caller{Name: name}, "/m", "instance", "none") }
	for i := range 4095 {
		log("old-" + strconv.Itoa(i))
	}
	now = now.Add(time.Minute)
	log("new-1")
	if len(a.logged) != 4096 {
		t.Fatalf("%d identities kept at 4096, want all", len(a.logged))
	}
	log("new-2")
	if len(a.logged) != 2 {
		t.Fatalf("%d identities kept past 4096, want the 2 logged within the minute", len(a.logged))
	}
}

// TestRequiresClientCerts: only a server config that requires and
// verifies client certificates authenticates every caller.
func TestRequiresClientCerts(t *testing.T) {
	for _, tc := range []struct {
		c    *tls.Config
		want bool
	}{
		{nil, false},
		{&tls.Config{}, false},
		{&tls.Config{ClientAuth: tls.VerifyClientCertIfGiven}, false},
		{&tls.Config{ClientAuth: tls.RequireAnyClientCert}, false},
		{&tls.Config{ClientAuth: tls.RequireAndVerifyClientCert}, true},
	} {
		if got := RequiresClientCerts(tc.c); got != tc.want {
			t.Errorf("RequiresClientCerts(%+v) = %v, want %v", tc.c, got, tc.want)
		}
	}
}

// TestPolicyRuleOfAMethodWithoutService: a method name whose only slash
// leads it names no service, so no service rule covers it; a service rule
// is found by the method's last slash after the first byte, wherever it is.
func TestPolicyRuleOfAMethodWithoutService(t *testing.T) {
	p := Policy{"/*": {Role: "operator"}, "//*": {Role: "envoy"}}
	for _, tc := range []struct {
		method, role string
		ok           bool
	}{
		{"/Get", "", false},
		{"/s/Get", "", false},
		{"//Get", "envoy", true},
	} {
		if r, ok := p.rule(tc.method); ok != tc.ok || r.Role != tc.role {
			t.Errorf("%s: rule %+v %v, want role %q %v", tc.method, r, ok, tc.role, tc.ok)
		}
	}
}

// TestContextWithoutACall: a context that is no call's, or a call's
// whose TLS state holds no verified chain with a certificate, has no
// verified certificate; one that is no call's has no caller and no
// identity.
func TestContextWithoutACall(t *testing.T) {
	if leaf, ok := Leaf(context.Background()); ok || leaf != nil {
		t.Errorf("Leaf = %v, %v; want none", leaf, ok)
	}
	for _, chains := range [][][]*x509.Certificate{nil, {}, {{}}} {
		ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: chains}}})
		if leaf, ok := Leaf(ctx); ok || leaf != nil {
			t.Errorf("Leaf of verified chains %v = %v, %v; want none", chains, leaf, ok)
		}
	}
	if c, ok := CallerOf(context.Background()); ok || c != nil {
		t.Errorf("CallerOf = %v, %v; want none", c, ok)
	}
	if id := Identity(context.Background()); id != "" {
		t.Errorf("Identity = %q, want \"\"", id)
	}
}
