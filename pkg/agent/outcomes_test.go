package agent_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
)

// outcomeCounts reads sluice_agent_http_requests_total by outcome.
func outcomeCounts(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_agent_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// TestRequestsAreCountedByOutcome: each POST /v1/allow is counted once
// under its outcome in the agent's registry: ok, over_limit, a shadow
// key's shadow_denied, invalid for a refused request, and unavailable
// once the lease client is closed (a 503).
func TestRequestsAreCountedByOutcome(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease}, audit: {mode: lease, shadow: true}}
tiers: {std: {read: {rate: 1/m, burst: 2}, audit: {rate: 1/m, burst: 2}}}
default_tier: std
`)
	r, _ := region(t, cfg)
	a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg})
	web := httpClient(t)

	if code, data := post(t, web, a, `{"tenant":"acme"}`); code != http.StatusBadRequest {
		t.Fatalf("request without a class: %d %s; want 400", code, data)
	}
	if out := allow(t, web, a, `{"tenant":"acme","class":"read","cost":2}`); !out.Allowed {
		t.Fatalf("first read of the whole burst: %+v; want allowed", out)
	}
	if out := allow(t, web, a, `{"tenant":"acme","class":"read"}`); out.Allowed {
		t.Fatalf("read past the burst: %+v; want denied", out)
	}
	if out := allow(t, web, a, `{"tenant":"acme","class":"audit","cost":2}`); !out.Allowed || out.WouldDeny {
		t.Fatalf("first audit of the whole burst: %+v; want allowed", out)
	}
	if out := allow(t, web, a, `{"tenant":"acme","class":"audit"}`); !out.Allowed || !out.WouldDeny {
		t.Fatalf("audit past the burst: %+v; want allowed with would_deny", out)
	}
	if err := a.Client().Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	code, data := post(t, web, a, `{"tenant":"acme","class":"read"}`)
	var e agent.ErrorResponse
	if err := json.Unmarshal(data, &e); err != nil || code != http.StatusServiceUnavailable || !strings.Contains(e.Error, "deciding") {
		t.Fatalf("read with the lease client closed: %d %s (%v); want 503 saying the decision failed", code, data, err)
	}

	want := map[string]float64{"ok": 2, "over_limit": 1, "shadow_denied": 1, "invalid": 1, "unavailable": 1, "abandoned": 0}
	if got := outcomeCounts(t, a.Registry()); len(got) != len(want) || func() bool {
		for k, v := range want {
			if got[k] != v {
				return true
			}
		}
		return false
	}() {
		t.Errorf("requests by outcome %v; want %v", got, want)
	}
}

// TestLimiterRefusalIs400 runs an agent whose config allows a larger
// burst than the region's: a cost the agent's config accepts but the
// region's limit refuses is answered 400 naming the key, not 503.
func TestLimiterRefusalIs400(t *testing.T) {
	regionCfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {std: {read: {rate: 1/m, burst: 5}}}
default_tier: std
`)
	agentCfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {std: {read: {rate: 1/m, burst: 20}}}
default_tier: std
`)
	r, _ := region(t, regionCfg)
	a := startAgent(t, r.Addr, agent.StaticConfig{C: agentCfg})
	web := httpClient(t)
	if out := allow(t, web, a, `{"tenant":"acme","class":"read"}`); !out.Allowed {
		t.Fatalf("first read: %+v; want allowed", out)
	}
	code, data := post(t, web, a, `{"tenant":"acme","class":"read","cost":6}`)
	var e agent.ErrorResponse
	if err := json.Unmarshal(data, &e); err != nil || code != http.StatusBadRequest || !strings.Contains(e.Error, `tenant "acme", class "read"`) {
		t.Errorf("cost 6 on the region's burst of 5: %d %s (%v); want 400 naming the key", code, data, err)
	}
}

// TestStartRefusesARegistryHoldingItsMetrics: a registry that already
// holds a metric of the agent (its /v1/allow API's, the Envoy service's,
// its request bounds' or the lease client's) under the same name cannot
// take the agent's, and Start fails naming it rather than serving
// uncounted, leaving nothing running (TestMain checks for leaked goroutines).
func TestStartRefusesARegistryHoldingItsMetrics(t *testing.T) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	for _, name := range []string{
		"sluice_agent_http_requests_total", "sluice_agent_http_request_duration_seconds",
		"sluice_envoy_decisions_total", "sluice_client_rpc_duration_seconds", "sluice_rpc_refused_total",
	} {
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "taken"}))
			a, err := agent.Start(agent.Options{
				RegionAddr: "127.0.0.1:1", Config: agent.StaticConfig{C: cfg}, Registry: reg,
				GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
				Logger: slog.New(slog.DiscardHandler),
			})
			if err == nil {
				a.Stop()
				t.Fatalf("Start with %s taken: no error", name)
			}
			if !strings.Contains(err.Error(), name) {
				t.Errorf("Start with %s taken: %v; want a registration error", name, err)
			}
		})
	}
}

// TestClientThatHangsUpIsAbandonedNotUnavailable: a client that gives up
// while the agent waits on its region (one that never answers) is counted
// as abandoned: nothing was admitted and the region did not fail, so
// unavailable (what an operator alerts on) stays at 0.
func TestClientThatHangsUpIsAbandonedNotUnavailable(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {std: {read: {rate: 1/m, burst: 2}}}
default_tier: std
`)
	a := startAgent(t, grpctest.SilentAddr(t, nil), agent.StaticConfig{C: cfg})
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+a.HTTPAddr()+"/v1/allow", strings.NewReader(`{"tenant":"acme","class":"read"}`))
	if err != nil {
		t.Fatal(err)
	}
	web := httpClient(t)
	done := make(chan error, 1)
	go func() {
		resp, err := web.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	// The request is being decided once the lease client tracks its key;
	// the decision then waits on the silent region (a 10s breaker).
	deadline := time.Now().Add(30 * time.Second)
	for metrictest.Gauge(t, a.Registry(), "sluice_client_keys") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request never reached the region")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the request that hung up was answered")
	}
	deadline = time.Now().Add(30 * time.Second)
	for outcomeCounts(t, a.Registry())["abandoned"] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("requests by outcome %v; want abandoned 1", outcomeCounts(t, a.Registry()))
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	if got := outcomeCounts(t, a.Registry()); got["unavailable"] != 0 {
		t.Errorf("requests by outcome %v; want unavailable 0", got)
	}
}
