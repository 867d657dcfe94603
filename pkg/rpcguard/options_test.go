package rpcguard

import (
	"context"
	"net"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// TestNewChecksItsBounds: New fills the defaults of bounds left at zero
// and refuses caps below 1, an identity cap below the connection cap, a
// rule's Max outside 0..PerConnection and a Max without a Bound name,
// accepting each bound exactly at its limit.
func TestNewChecksItsBounds(t *testing.T) {
	rule := func(max int, bound string) map[string]Rule { return map[string]Rule{"/s/m": {Max: max, Bound: bound}} }
	for _, tc := range []struct {
		name string
		o    Options
		ok   bool
		// the caps and queues of an accepted Options
		conn, id, connQueue, idQueue int
	}{
		{"defaults", Options{}, true, DefaultPerConnection, DefaultPerIdentity,
			DefaultQueueFactor * DefaultPerConnection, DefaultQueueFactor * DefaultPerIdentity},
		{"identity default at least the connection cap", Options{PerConnection: DefaultPerIdentity + 1}, true,
			DefaultPerIdentity + 1, DefaultPerIdentity + 1, DefaultQueueFactor * (DefaultPerIdentity + 1), DefaultQueueFactor * (DefaultPerIdentity + 1)},
		{"identity default above a small connection cap", Options{PerConnection: 1, QueueFactor: 1}, true, 1, DefaultPerIdentity, 1, DefaultPerIdentity},
		{"everything at 1", Options{PerConnection: 1, PerIdentity: 1, QueueFactor: 1}, true, 1, 1, 1, 1},
		{"queue factor multiplies", Options{PerConnection: 3, PerIdentity: 5, QueueFactor: 2}, true, 3, 5, 6, 10},
		{"negative connection cap", Options{PerConnection: -1, PerIdentity: 1}, false, 0, 0, 0, 0},
		{"negative queue factor", Options{PerConnection: 1, PerIdentity: 1, QueueFactor: -1}, false, 0, 0, 0, 0},
		{"identity cap below the connection cap", Options{PerConnection: 2, PerIdentity: 1}, false, 0, 0, 0, 0},
		{"max at the connection cap", Options{PerConnection: 4, Rules: rule(4, "b")}, true, 4, DefaultPerIdentity, 4 * DefaultQueueFactor, DefaultPerIdentity * DefaultQueueFactor},
		{"max above the connection cap", Options{PerConnection: 4, Rules: rule(5, "b")}, false, 0, 0, 0, 0},
		{"negative max", Options{PerConnection: 4, Rules: rule(-1, "b")}, false, 0, 0, 0, 0},
		{"max of 1 without a bound name", Options{PerConnection: 4, Rules: rule(1, "")}, false, 0, 0, 0, 0},
		{"no max without a bound name", Options{PerConnection: 4, Rules: rule(0, "")}, true, 4, DefaultPerIdentity, 4 * DefaultQueueFactor, DefaultPerIdentity * DefaultQueueFactor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := New(tc.o)
			if (err == nil) != tc.ok {
				t.Fatalf("New(%+v): %v, want ok %v", tc.o, err, tc.ok)
			}
			if err != nil {
				return
			}
			if g.o.PerConnection != tc.conn || g.conns.cap != tc.conn || g.o.PerIdentity != tc.id || g.ids.cap != tc.id ||
				g.conns.queue != tc.connQueue || g.ids.queue != tc.idQueue {
				t.Errorf("caps %d/%d (%d/%d), queues %d/%d; want caps %d/%d, queues %d/%d",
					g.o.PerConnection, g.o.PerIdentity, g.conns.cap, g.ids.cap, g.conns.queue, g.ids.queue, tc.conn, tc.id, tc.connQueue, tc.idQueue)
			}
		})
	}
}

// TestBoundsAreExported: sluice_rpc_bound holds the in-flight and queue
// bounds, every rule's Max under its Bound name and its CheckBounds, and
// the Exported ones; a rule without a Max exports nothing; a second Guard
// on the same registry is refused.
func TestBoundsAreExported(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, err := New(Options{PerConnection: 4, PerIdentity: 8, QueueFactor: 3, Registerer: reg, Rules: map[string]Rule{
		"/s/a": {Max: 2, Bound: "a_per_call"},
		"/s/c": {Max: 1, Bound: "c_per_call"},
		"/s/b": {Bound: "unbounded"},
		"/s/d": {Check: func(any) (string, string) { return "", "" }, CheckBounds: map[string]int{"d_shape": 5}},
	}, Exported: map[string]int{"x_bytes": 9}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_rpc_bound" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"inflight_per_connection": 4, "inflight_per_identity": 8,
		"queued_per_connection": 12, "queued_per_identity": 24, "a_per_call": 2, "c_per_call": 1,
		"d_shape": 5, "x_bytes": 9,
	}
	if len(got) != len(want) {
		t.Errorf("bounds %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("sluice_rpc_bound{bound=%q} = %v, want %v", k, got[k], v)
		}
	}
	if _, err := New(Options{Registerer: reg}); err == nil {
		t.Error("a second Guard registered its metrics again")
	}
}

// on is a context of a call on connection conn (its address's text).
func on(conn string) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: dummyAddr(conn)})
}

// waiting waits until key's semaphore in p has n units waiting; a call
// that returns on done instead of waiting fails the test.
func waiting[K comparable](t *testing.T, p *pool[K], key K, n int, done <-chan error) {
	t.Helper()
	for {
		p.mu.Lock()
		s := p.m[key]
		got := s != nil && s.waiting == n
		p.mu.Unlock()
		if got {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("a call returned instead of waiting: %v", err)
		default:
		}
		runtime.Gosched() // the waiter enqueues itself promptly
	}
}

// TestRequestsAreWeighedAgainstTheirRule: a request weighs what its rule's
// Units says, at least 1 (nil Units, a nil request or a count below 1
// weigh 1); a request of exactly Max units is admitted and one more is
// refused with InvalidArgument naming the bound; a rule without a Max
// refuses nothing by size; a service's "/*" rule covers its methods; a
// Check's refusal names its bound; each refusal is counted by method and
// bound. A method name without a service has no rule; one ending in the
// service's slash is the service's.
func TestRequestsAreWeighedAgainstTheirRule(t *testing.T) {
	units := func(req any) int { return req.(int) }
	shape := func(req any) (string, string) {
		if req.(int) == 0 {
			return "zeros", "zero is refused"
		}
		return "", ""
	}
	g, err := New(Options{PerConnection: 10, QueueFactor: 1, Rules: map[string]Rule{
		"/s/bounded":   {Units: units, Max: 3, Bound: "per_call"},
		"/s/unbounded": {Units: units},
		"/s/plain":     {},
		"/w/*":         {Units: units, Max: 2, Bound: "per_w", Check: shape},
		"/*":           {Units: units, Max: 1, Bound: "no_service"},
		"//*":          {Units: units, Max: 1, Bound: "empty_service"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method string
		req    any
		weight int    // units held while admitted
		bound  string // of an InvalidArgument refusal
	}{
		{"/s/bounded", 3, 3, ""},
		{"/s/bounded", 4, 0, "per_call"},
		{"/s/bounded", 0, 1, ""},
		{"/s/bounded", -5, 1, ""},
		{"/s/bounded", nil, 1, ""},
		{"/s/unbounded", 9, 9, ""},
		{"/s/unbounded", 50, 10, ""}, // clamped to the connection's cap
		{"/s/plain", 5, 1, ""},
		{"/s/other", 5, 1, ""},
		{"/w/x", 2, 2, ""},
		{"/w/x", 3, 0, "per_w"},
		{"/w/x", 7, 0, "per_w"},
		{"/w/y", 1, 1, ""},
		{"/w/y", nil, 1, ""},   // no request (a stream): its Check does not apply
		{"/w/", 3, 0, "per_w"}, // an empty method name: the slash it ends with is its service's, as rpcauth reads it
		{"/top", 5, 1, ""},     // names no service: no rule
		{"//x", 2, 0, "empty_service"},
	} {
		ctx := on("c")
		done, err := g.Admit(ctx, tc.method, tc.req)
		if tc.bound != "" {
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.bound) {
				t.Errorf("%s(%v): %v, want InvalidArgument naming %s", tc.method, tc.req, err, tc.bound)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s(%v): %v", tc.method, tc.req, err)
			continue
		}
		if s := g.conns.m[connKey(ctx)]; s == nil || s.used != tc.weight {
			t.Errorf("%s(%v) holds %+v, want %d units", tc.method, tc.req, s, tc.weight)
		}
		done()
	}
	if _, err := g.Admit(on("c"), "/w/z", 0); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "/w/z: zero is refused (bound zeros)") {
		t.Errorf("a request its Check refuses: %v", err)
	}
	for _, c := range []struct {
		method, bound string
		want          float64
	}{{"/s/bounded", "per_call", 1}, {"/w/x", "per_w", 2}, {"/w/z", "zeros", 1}} {
		var m dto.Metric
		if err := g.refused.WithLabelValues(c.method, c.bound).Write(&m); err != nil {
			t.Fatal(err)
		}
		if m.GetCounter().GetValue() != c.want {
			t.Errorf("refused{%s,%s} = %v, want %v", c.method, c.bound, m.GetCounter().GetValue(), c.want)
		}
	}
	if len(g.conns.m) != 0 {
		t.Errorf("state left behind: %v", g.conns.m)
	}
}

// TestIdentitiesAreBoundedOverTheirConnections: an identity's calls on
// different connections share its cap and queue; a call refused by its
// identity's queue gives its connection's turn back and names the identity
// bounds; calls without an identity are bounded per connection only; a
// waiting call whose context ends gets the context's code.
func TestIdentitiesAreBoundedOverTheirConnections(t *testing.T) {
	id := "x"
	g, err := New(Options{PerConnection: 2, PerIdentity: 2, QueueFactor: 1,
		Identity: func(context.Context) string { return id }})
	if err != nil {
		t.Fatal(err)
	}
	hold := func(conn string) func() {
		t.Helper()
		done, err := g.Admit(on(conn), "/s/m", nil)
		if err != nil {
			t.Fatalf("call on connection %s: %v", conn, err)
		}
		return done
	}
	d1, d2 := hold("c1"), hold("c2") // the identity's cap, on two connections
	// Two more wait in the identity's queue until their context ends.
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error)
	for _, conn := range []string{"c3", "c3"} {
		go func() {
			_, err := g.Admit(peer.NewContext(ctx, &peer.Peer{Addr: dummyAddr(conn)}), "/s/m", nil)
			waited <- err
		}()
	}
	waiting(t, &g.ids, id, 2, waited)
	// The queue holds its cap: a fourth is refused, naming the identity.
	if _, err := g.Admit(on("c4"), "/s/m", nil); status.Code(err) != codes.ResourceExhausted ||
		!strings.Contains(err.Error(), "this identity has 2 units of work in flight and 2 waiting") {
		t.Errorf("past the identity's queue: %v", err)
	}
	if s := g.conns.m["c4"]; s != nil {
		t.Errorf("the refused call still holds its connection: %+v", s)
	}
	cancel()
	for range 2 {
		if err := <-waited; status.Code(err) != codes.Canceled {
			t.Errorf("a waiter whose context ended: %v, want Canceled", err)
		}
	}
	if s := g.conns.m["c3"]; s != nil {
		t.Errorf("the cancelled call still holds its connection: %+v", s)
	}
	// Without an identity, only connections are bounded.
	id = ""
	d5, d6 := hold("c5"), hold("c6")
	if len(g.ids.m) != 1 || g.ids.m["x"].used != 2 {
		t.Errorf("calls without an identity counted under one: %v", g.ids.m)
	}
	for _, d := range []func(){d1, d2, d5, d6} {
		d()
	}
	if len(g.conns.m) != 0 || len(g.ids.m) != 0 {
		t.Errorf("state left behind: %v %v", g.conns.m, g.ids.m)
	}
}

// TestConnectionQueueRefusalNamesTheConnection: a call past its
// connection's queue is refused ResourceExhausted naming the connection's
// bounds and counted as queued_per_connection.
func TestConnectionQueueRefusalNamesTheConnection(t *testing.T) {
	g, err := New(Options{PerConnection: 1, QueueFactor: 1})
	if err != nil {
		t.Fatal(err)
	}
	d, err := g.Admit(on("c"), "/s/m", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(on("c"))
	waited := make(chan error)
	go func() {
		_, err := g.Admit(ctx, "/s/m", nil)
		waited <- err
	}()
	waiting(t, &g.conns, any("c"), 1, waited)
	_, err = g.Admit(on("c"), "/s/m", nil)
	if status.Code(err) != codes.ResourceExhausted ||
		!strings.Contains(err.Error(), "/s/m: this connection has 1 units of work in flight and 1 waiting, the bounds inflight_per_connection and queued_per_connection") {
		t.Errorf("past the connection's queue: %v", err)
	}
	var m dto.Metric
	if err := g.refused.WithLabelValues("/s/m", "queued_per_connection").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Errorf("refusals counted: %v, %v", m.GetCounter().GetValue(), err)
	}
	cancel()
	if err := <-waited; status.Code(err) != codes.Canceled {
		t.Errorf("cancelled waiter: %v", err)
	}
	d()
}

// TestDefaultsAreTheDocumented: the defaults are the bounds docs/operations.md
// ("Request bounds") documents: 2048 units in flight per connection, 16,384
// per identity, 16 times that queued.
func TestDefaultsAreTheDocumented(t *testing.T) {
	if DefaultPerConnection != 2048 || DefaultPerIdentity != 16384 || DefaultQueueFactor != 16 {
		t.Errorf("defaults %d, %d, %d; documented 2048, 16384, 16", DefaultPerConnection, DefaultPerIdentity, DefaultQueueFactor)
	}
}

// TestConnectionKeyWithoutAnAddress: a call whose peer has no address is
// keyed as one without a peer.
func TestConnectionKeyWithoutAnAddress(t *testing.T) {
	if k := connKey(peer.NewContext(context.Background(), &peer.Peer{})); k != "" {
		t.Errorf("key %v of a peer without an address, want \"\"", k)
	}
}

// TestUnixConnectionsAreKeyedByAddressValue: like TCP connections, Unix
// socket connections are keyed by their address value, so two connections
// from equal address text are two.
func TestUnixConnectionsAreKeyedByAddressValue(t *testing.T) {
	a, b := &net.UnixAddr{Name: "@", Net: "unix"}, &net.UnixAddr{Name: "@", Net: "unix"}
	on := func(addr net.Addr) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{Addr: addr})
	}
	if connKey(on(a)) != connKey(on(a)) || connKey(on(a)) == connKey(on(b)) {
		t.Error("a Unix connection's key is not its address value")
	}
}
