package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/rpcguard"
)

// tenantsRequest is an Envoy request with one descriptor per tenant
// bound-0, bound-1, ..., the first of them with entries entries (the
// tenant, the class, and others the mapping ignores).
func tenantsRequest(descriptors, entries int) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "sluice"}
	for i := range descriptors {
		req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: "tenant", Value: fmt.Sprintf("bound-%d", i)}, {Key: "class", Value: "read"},
		}})
	}
	for i := 2; i < entries; i++ {
		d := req.Descriptors[0]
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: fmt.Sprintf("extra-%d", i), Value: "x"})
	}
	return req
}

// TestOversizedEnvoyRequestsAreRefusedBeforeAnyLease: the agent's Envoy
// endpoint applies the regional service's request bounds with its
// refusals: a request naming more than envoyrls.MaxDescriptors keys, or
// with a descriptor of more than envoyrls.MaxEntries entries, is refused
// with InvalidArgument naming the bound, counted in
// sluice_rpc_refused_total{bound} of the agent's registry, and leases
// nothing: no key in the agent, no RPC to the region. The bounds are
// exported in sluice_rpc_bound, and at the bounds a request is served.
func TestOversizedEnvoyRequestsAreRefusedBeforeAnyLease(t *testing.T) {
	cfg := regiontest.MustConfig(t, quietConfig)
	r, regMetrics := region(t, cfg)
	a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg})
	client := rls(t, a)
	ctx := context.Background()

	for _, c := range []struct {
		name  string
		req   *rlsv3.RateLimitRequest
		bound string
		says  string
	}{
		{"5000 descriptors", tenantsRequest(5000, 2), "descriptors_per_request",
			envoyrls.Method + ": the request names 5000 keys, more than the bound descriptors_per_request=64; split it"},
		{"one descriptor too many", tenantsRequest(envoyrls.MaxDescriptors+1, 2), "descriptors_per_request",
			envoyrls.Method + ": the request names 65 keys, more than the bound descriptors_per_request=64; split it"},
		{"42 entries", tenantsRequest(1, 42), "entries_per_descriptor",
			envoyrls.Method + ": descriptors[0] has 42 entries, more than 32 (bound entries_per_descriptor)"},
		{"one entry too many", tenantsRequest(3, envoyrls.MaxEntries+1), "entries_per_descriptor",
			envoyrls.Method + ": descriptors[0] has 33 entries, more than 32 (bound entries_per_descriptor)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := metrictest.Series(t, a.Registry(), "sluice_rpc_refused_total", map[string]string{"bound": c.bound})
			_, err := client.ShouldRateLimit(ctx, c.req)
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != c.says {
				t.Errorf("got %v; want InvalidArgument %q", err, c.says)
			}
			if got := metrictest.Series(t, a.Registry(), "sluice_rpc_refused_total", map[string]string{"bound": c.bound}) - before; got != 1 {
				t.Errorf("sluice_rpc_refused_total{bound=%q} grew by %v; want 1", c.bound, got)
			}
		})
	}
	if n := a.Client().Table().Len(); n != 0 {
		t.Errorf("refused requests left %d keys in the agent; want 0", n)
	}
	if n := counterSum(t, regMetrics, "sluice_regional_requests_total"); n != 0 {
		t.Errorf("refused requests caused %v regional RPCs; want 0", n)
	}
	for bound, want := range map[string]float64{
		"descriptors_per_request": envoyrls.MaxDescriptors,
		"entries_per_descriptor":  envoyrls.MaxEntries,
		"inflight_per_connection": rpcguard.DefaultPerConnection,
		"message_bytes":           agent.MaxMessageBytes,
		"streams_per_connection":  agent.MaxStreamsPerConnection,
	} {
		if got := metrictest.Series(t, a.Registry(), "sluice_rpc_bound", map[string]string{"bound": bound}); got != want {
			t.Errorf("sluice_rpc_bound{bound=%q} = %v; want %v", bound, got, want)
		}
	}

	// A message over the regional service's size bound is refused by
	// gRPC before it is decoded.
	huge := envoyRequest("sluice", 0, "tenant", strings.Repeat("a", agent.MaxMessageBytes), "class", "read")
	if _, err := client.ShouldRateLimit(ctx, huge); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a message over %d bytes: %v; want ResourceExhausted", agent.MaxMessageBytes, err)
	}
	if n := a.Client().Table().Len(); n != 0 {
		t.Errorf("refused requests left %d keys in the agent; want 0", n)
	}

	// At the bounds the request is served.
	resp, err := client.ShouldRateLimit(ctx, tenantsRequest(envoyrls.MaxDescriptors, envoyrls.MaxEntries))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("%d descriptors, %d entries: %v, %v; want OK", envoyrls.MaxDescriptors, envoyrls.MaxEntries, resp, err)
	}
}

// TestBoundsAreTheRegionalServices: the agent's bounds on a message and
// on the calls of one connection are the regional service's.
func TestBoundsAreTheRegionalServices(t *testing.T) {
	if agent.MaxMessageBytes != regional.MaxMessageBytes || agent.MaxStreamsPerConnection != regional.MaxStreamsPerConnection {
		t.Errorf("agent bounds %d bytes, %d streams; the regional service's %d, %d",
			agent.MaxMessageBytes, agent.MaxStreamsPerConnection, regional.MaxMessageBytes, regional.MaxStreamsPerConnection)
	}
}
