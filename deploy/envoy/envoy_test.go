package envoy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/quota"
)

// validator is what protoc-gen-validate generates on every message.
type validator interface{ ValidateAll() error }

// load parses envoy.yaml into a Bootstrap as Envoy reads it (YAML is JSON's
// superset; unknown fields and unregistered Any types are errors) and
// validates it and every typed_config it holds.
func load(t *testing.T) (*bootstrapv3.Bootstrap, *hcmv3.HttpConnectionManager, *ratelimitfilterv3.RateLimit) {
	t.Helper()
	data, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("envoy.yaml is not a Bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("Bootstrap: %v", err)
	}
	listeners := b.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("%d listeners, want 1", len(listeners))
	}
	var hcm hcmv3.HttpConnectionManager
	filters := listeners[0].GetFilterChains()[0].GetFilters()
	if len(filters) != 1 || filters[0].GetTypedConfig().UnmarshalTo(&hcm) != nil {
		t.Fatalf("the listener's filter is not one http_connection_manager: %v", filters)
	}
	validate(t, "http_connection_manager", &hcm)
	var rl *ratelimitfilterv3.RateLimit
	for _, f := range hcm.GetHttpFilters() {
		switch f.GetName() {
		case "envoy.filters.http.ratelimit":
			rl = &ratelimitfilterv3.RateLimit{}
			if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
				t.Fatal(err)
			}
			validate(t, f.GetName(), rl)
		case "envoy.filters.http.router":
			var r routerv3.Router
			if err := f.GetTypedConfig().UnmarshalTo(&r); err != nil {
				t.Fatal(err)
			}
			validate(t, f.GetName(), &r)
		default:
			t.Errorf("unexpected HTTP filter %s", f.GetName())
		}
	}
	if rl == nil {
		t.Fatal("no envoy.filters.http.ratelimit filter")
	}
	if last := hcm.GetHttpFilters()[len(hcm.GetHttpFilters())-1].GetName(); last != "envoy.filters.http.router" {
		t.Errorf("the last HTTP filter is %s; Envoy needs the router last", last)
	}
	return &b, &hcm, rl
}

func validate(t *testing.T, what string, m validator) {
	t.Helper()
	if err := m.ValidateAll(); err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// TestEnvoyConfigIsValid: the Bootstrap and its typed configs validate, and
// the rate-limit service is the sluice_regional cluster, spoken to over
// HTTP/2 (gRPC) at regional -dev's default -listen address.
func TestEnvoyConfigIsValid(t *testing.T) {
	b, _, rl := load(t)
	svc := rl.GetRateLimitService()
	if svc.GetTransportApiVersion().String() != "V3" {
		t.Errorf("transport_api_version %v, want V3", svc.GetTransportApiVersion())
	}
	name := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	var cluster *clusterv3.Cluster
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			cluster = c
		}
	}
	if cluster == nil {
		t.Fatalf("rate_limit_service names cluster %q, which is not defined", name)
	}
	opts, ok := cluster.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	var po upstreamhttpv3.HttpProtocolOptions
	if !ok || opts.UnmarshalTo(&po) != nil || po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Fatalf("cluster %s does not speak HTTP/2: %v", name, cluster.GetTypedExtensionProtocolOptions())
	}
	validate(t, "HttpProtocolOptions", &po)
	addr := cluster.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if got := fmt.Sprintf("%s:%d", addr.GetAddress(), addr.GetPortValue()); got != "127.0.0.1:7400" {
		t.Errorf("cluster %s points at %s, want regional -dev's 127.0.0.1:7400", name, got)
	}
	if rl.GetFailureModeDeny() {
		t.Error("failure_mode_deny: true refuses every request while Sluice is unreachable; the file documents false")
	}
}

// request is one HTTP request a client sends through the Envoy.
type request struct {
	method, path string
	headers      map[string]string
}

func (r request) header(name string) (string, bool) {
	switch name {
	case ":method":
		return r.method, true
	case ":path":
		return r.path, true
	}
	v, ok := r.headers[name]
	return v, ok
}

// TestDescriptorsResolveToConfiguredKeys computes, for sample requests,
// the descriptors the routes' rate_limits actions produce (as Envoy does:
// the first route that matches; per rate_limits entry, one descriptor,
// or none when an action produces nothing) and resolves them with the
// built-in sample config that the docs and regional -dev use.
func TestDescriptorsResolveToConfiguredKeys(t *testing.T) {
	_, hcm, rl := load(t)
	cfg := config.Default()
	cases := []struct {
		req  request
		want []quota.Key
	}{
		{request{"GET", "/api/orders", map[string]string{"x-tenant-id": "acme"}}, []quota.Key{{Tenant: "acme", Class: "read"}}},
		{request{"HEAD", "/api/orders/7", map[string]string{"x-tenant-id": "acme"}}, []quota.Key{{Tenant: "acme", Class: "read"}}},
		{request{"POST", "/api/orders", map[string]string{"x-tenant-id": "acme"}}, []quota.Key{{Tenant: "acme", Class: "write"}}},
		{request{"DELETE", "/api/orders/7", map[string]string{"x-tenant-id": "beta"}}, []quota.Key{{Tenant: "beta", Class: "write"}}},
		{request{"POST", "/api/export/orders", map[string]string{"x-tenant-id": "acme"}}, []quota.Key{{Tenant: "acme", Class: "export"}}},
		{request{"GET", "/api/orders", nil}, nil},                                   // no tenant: not limited
		{request{"GET", "/healthz", map[string]string{"x-tenant-id": "acme"}}, nil}, // outside /api/
	}
	for _, c := range cases {
		name := c.req.method + " " + c.req.path
		descs, err := descriptors(hcm.GetRouteConfig(), c.req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(descs) != len(c.want) {
			t.Errorf("%s: %d descriptors %v, want %d", name, len(descs), descs, len(c.want))
			continue
		}
		if len(descs) == 0 {
			continue
		}
		targets, err := envoyrls.Resolve(cfg, &rlsv3.RateLimitRequest{Domain: rl.GetDomain(), Descriptors: descs})
		if err != nil {
			t.Errorf("%s: the sample config refuses the descriptors %v: %v", name, descs, err)
			continue
		}
		for i, tg := range targets {
			if !tg.Matched || tg.Key != c.want[i] {
				t.Errorf("%s: descriptor %v resolves to %+v, want the configured key %v", name, descs[i], tg, c.want[i])
			}
		}
	}
}

// descriptors is what Envoy's rate-limit filter sends for r (stage 0).
func descriptors(rc *routev3.RouteConfiguration, r request) ([]*ratelimitv3.RateLimitDescriptor, error) {
	for _, vh := range rc.GetVirtualHosts() {
		for _, route := range vh.GetRoutes() {
			ok, err := routeMatches(route.GetMatch(), r)
			if err != nil || !ok {
				if err != nil {
					return nil, err
				}
				continue
			}
			var out []*ratelimitv3.RateLimitDescriptor
			for _, limit := range append(vh.GetRateLimits(), route.GetRoute().GetRateLimits()...) {
				d, err := descriptor(limit.GetActions(), r)
				if err != nil {
					return nil, err
				}
				if d != nil {
					out = append(out, d)
				}
			}
			return out, nil
		}
	}
	return nil, nil
}

func routeMatches(m *routev3.RouteMatch, r request) (bool, error) {
	if m.GetPathSpecifier() == nil {
		return false, fmt.Errorf("route match %v: only prefix matches are evaluated here", m)
	}
	if _, ok := m.GetPathSpecifier().(*routev3.RouteMatch_Prefix); !ok {
		return false, fmt.Errorf("route match %v: only prefix matches are evaluated here", m)
	}
	if !strings.HasPrefix(r.path, m.GetPrefix()) {
		return false, nil
	}
	return headersMatch(m.GetHeaders(), r)
}

// descriptor applies one rate_limits entry's actions: nil when one of them
// produces no entry (Envoy then sends no descriptor for the entry).
func descriptor(actions []*routev3.RateLimit_Action, r request) (*ratelimitv3.RateLimitDescriptor, error) {
	d := &ratelimitv3.RateLimitDescriptor{}
	add := func(k, v string) {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	for _, a := range actions {
		switch {
		case a.GetRequestHeaders() != nil:
			rh := a.GetRequestHeaders()
			v, ok := r.header(rh.GetHeaderName())
			if !ok {
				if rh.GetSkipIfAbsent() {
					continue
				}
				return nil, nil
			}
			add(rh.GetDescriptorKey(), v)
		case a.GetGenericKey() != nil:
			g := a.GetGenericKey()
			key := g.GetDescriptorKey()
			if key == "" {
				key = "generic_key"
			}
			add(key, g.GetDescriptorValue())
		case a.GetHeaderValueMatch() != nil:
			h := a.GetHeaderValueMatch()
			matched, err := headersMatch(h.GetHeaders(), r)
			if err != nil {
				return nil, err
			}
			expect := h.GetExpectMatch() == nil || h.GetExpectMatch().GetValue()
			if matched != expect {
				return nil, nil
			}
			key := h.GetDescriptorKey()
			if key == "" {
				key = "header_match"
			}
			add(key, h.GetDescriptorValue())
		default:
			return nil, fmt.Errorf("action %v is not evaluated by this test; extend it", a)
		}
	}
	return d, nil
}

// headersMatch: every matcher must match (Envoy's rule), for the matcher
// kinds envoy.yaml uses.
func headersMatch(ms []*routev3.HeaderMatcher, r request) (bool, error) {
	for _, m := range ms {
		v, present := r.header(m.GetName())
		var ok bool
		switch {
		case m.GetPresentMatch():
			ok = present
		case m.GetStringMatch() != nil:
			ok = present && stringMatches(m.GetStringMatch(), v)
			if m.GetStringMatch().GetMatchPattern() == nil {
				return false, fmt.Errorf("header matcher %v: no pattern", m)
			}
		default:
			return false, fmt.Errorf("header matcher %v is not evaluated by this test; extend it", m)
		}
		if m.GetInvertMatch() {
			ok = !ok
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

func stringMatches(sm *matcherv3.StringMatcher, v string) bool {
	switch p := sm.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return v == p.Exact
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(v, p.Prefix)
	case *matcherv3.StringMatcher_SafeRegex:
		// Envoy's safe_regex (RE2) matches the whole value.
		return regexp.MustCompile("^(?:" + p.SafeRegex.GetRegex() + ")$").MatchString(v)
	}
	panic(fmt.Sprintf("string matcher %v is not evaluated by this test; extend it", sm))
}
