package agent_test

import (
	"errors"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestStartRefusesBadOptions: a missing region address or config, a
// negative drain or release timeout, or an in-flight bound per connection
// below what one Envoy request may name (each alone), is refused by Start
// with quota.ErrInvalid.
func TestStartRefusesBadOptions(t *testing.T) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	valid := func() agent.Options {
		return agent.Options{
			RegionAddr: "127.0.0.1:1", Config: agent.StaticConfig{C: cfg},
			GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
			Logger: slog.New(slog.DiscardHandler),
		}
	}
	for _, c := range []struct {
		name string
		edit func(*agent.Options)
		says string
	}{
		{"no region address", func(o *agent.Options) { o.RegionAddr = "" }, "region's address"},
		{"no config", func(o *agent.Options) { o.Config = nil }, "Options.Config"},
		{"negative drain timeout", func(o *agent.Options) { o.DrainTimeout = -time.Nanosecond }, "must not be negative"},
		{"negative release timeout", func(o *agent.Options) { o.ReleaseTimeout = -time.Nanosecond }, "must not be negative"},
		{"negative request read timeout", func(o *agent.Options) { o.RequestReadTimeout = -time.Nanosecond }, "must not be negative"},
		// gRPC has no ipv4: scheme: it resolved the whole text as a host
		// name, logged a warning, and the agent decided every request by
		// its on_failure policy while it reported itself healthy.
		{"a target of an unknown scheme", func(o *agent.Options) { o.RegionAddr = "ipv4:///127.0.0.1:1" },
			`region address "ipv4:///127.0.0.1:1": too many colons in address; want host:port, or a gRPC target such as dns:///host:port`},
		{"a list naming a target of an unknown scheme", func(o *agent.Options) { o.RegionAddr = "ipv4:127.0.0.1:1,127.0.0.1:2" },
			`region address "ipv4:127.0.0.1:1,127.0.0.1:2": replica "ipv4:127.0.0.1:1": too many colons in address; a list names replicas as host:port, separated by commas`},
		{"a list with a host without a port", func(o *agent.Options) { o.RegionAddr = "127.0.0.1:1,sluice-regional" }, `replica "sluice-regional"`},
		{"a host without a port", func(o *agent.Options) { o.RegionAddr = "sluice-regional" }, "missing port in address"},
		// "host:" split as host:port with an empty port: gRPC dialed port
		// 443 and the agent, ready, decided every request by on_failure.
		{"a host with an empty port", func(o *agent.Options) { o.RegionAddr = "127.0.0.1:" },
			`region address "127.0.0.1:": missing port; want host:port`},
		{"a list with an empty port", func(o *agent.Options) { o.RegionAddr = "127.0.0.1:1,127.0.0.1:" }, `replica "127.0.0.1:": missing port`},
		{"negative in-flight bound", func(o *agent.Options) { o.PerConnection = -1 }, "PerConnection -1 must be at least"},
		{"in-flight bound below one request's", func(o *agent.Options) { o.PerConnection = envoyrls.MaxDescriptors - 1 }, "PerConnection 63 must be at least the descriptors one request may name, 64"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := valid()
			c.edit(&o)
			a, err := agent.Start(o)
			if err == nil {
				a.Stop()
			}
			if !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
				t.Errorf("Start: %v; want an error wrapping %v that says %q", err, quota.ErrInvalid, c.says)
			}
		})
	}
}

// TestStartWithListenersOff: "off" serves neither /v1/allow nor
// /metrics, and their addresses are empty; the Envoy listener still
// serves, the lease client is named after the agent, and an agent
// without a Logger starts and stops with the default one.
func TestStartWithListenersOff(t *testing.T) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	a, err := agent.Start(agent.Options{
		RegionAddr: "127.0.0.1:1", Config: agent.StaticConfig{C: cfg},
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", MetricsAddr: "off",
		// No Logger: slog.Default() is used.
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	if a.HTTPAddr() != "" || a.MetricsAddr() != "" || a.GRPCAddr() == "" {
		t.Errorf("addresses: http %q, metrics %q, grpc %q; want the first two empty", a.HTTPAddr(), a.MetricsAddr(), a.GRPCAddr())
	}
	if id := a.Client().InstanceID(); !strings.HasPrefix(id, "agent-") {
		t.Errorf("instance id %q; want one made for an agent", id)
	}
}

// TestClassPoliciesApplyBeforeTheRegionAnswers: with the region out of
// reach from the start, the first decision on a key already follows its
// class's on_failure from the config the agent started with: closed
// denies, open admits, both degraded.
func TestClassPoliciesApplyBeforeTheRegionAnswers(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease, on_failure: closed}, write: {mode: lease, on_failure: open}}
tiers: {std: {read: {rate: 1000/s, burst: 1000}, write: {rate: 1000/s, burst: 1000}}}
default_tier: std
`)
	a := startAgent(t, grpctest.RefusedAddr(t), agent.StaticConfig{C: cfg})
	web := httpClient(t)
	if out := allow(t, web, a, `{"tenant":"acme","class":"read"}`); out.Allowed || !out.Degraded {
		t.Errorf("read (on_failure: closed) with no region: %+v; want denied, degraded", out)
	}
	if out := allow(t, web, a, `{"tenant":"acme","class":"write","cost":50}`); !out.Allowed || !out.Degraded {
		t.Errorf("write (on_failure: open) with no region: %+v; want allowed, degraded", out)
	}
}

// TestOpenAdmissionSaysTheWholeCapIsLeft: an on_failure: open admission
// limits nothing, so its answer says the caller can spend its whole cap
// now, at once (remaining = cap, reset 0), on /v1/allow and in the Envoy
// answer's status and headers alike. It said 0 remaining beside a reset
// of 0: nothing left, and yet back to the cap already.
func TestOpenAdmissionSaysTheWholeCapIsLeft(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {write: {mode: lease, on_failure: open}}
tiers: {std: {write: {rate: 100/s, burst: 200}}}
default_tier: std
envoy: {descriptors: [{domain: sluice, tenant_key: tenant, class_key: class}]}
`)
	a := startAgent(t, grpctest.RefusedAddr(t), agent.StaticConfig{C: cfg})
	out := allow(t, httpClient(t), a, `{"tenant":"acme","class":"write","cost":5}`)
	if !out.Allowed || !out.Degraded || out.Cap != 200 || out.Remaining != out.Cap || out.ResetMS != 0 {
		t.Errorf("/v1/allow, open with no region: %+v; want allowed, degraded, remaining = cap = 200, reset_ms 0", out)
	}
	resp, err := rls(t, a).ShouldRateLimit(t.Context(), envoyRequest("sluice", 5, "tenant", "acme", "class", "write"))
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStatuses()[0]
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 200 || st.GetDurationUntilReset().AsDuration() != 0 {
		t.Errorf("Envoy, open with no region: %v; want OK, limit_remaining 200, duration_until_reset 0", resp)
	}
	headers := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		headers[h.GetKey()] = h.GetValue()
	}
	if headers["x-ratelimit-limit"] != "200, 200;w=2" || headers["x-ratelimit-remaining"] != "200" ||
		headers["ratelimit"] != `"write";r=200;t=0` || headers["x-ratelimit-reset"] != "0" {
		t.Errorf("Envoy headers, open with no region: %v; want the cap 200 remaining, reset 0", headers)
	}
}

// TestDegradedDecisionsAreCountedUnderTheConfiguredTier: with the region
// out of reach from the start, the decisions the on_failure policy makes
// are counted in sluice_client_decisions_total under the tier the agent's
// config gives the tenant (its own, or the default tier), not "unknown".
func TestDegradedDecisionsAreCountedUnderTheConfiguredTier(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease, on_failure: open}}
tiers: {std: {read: {rate: 1000/s, burst: 1000}}, pro: {read: {rate: 2000/s, burst: 2000}}}
tenants: {acme: {tier: pro}}
default_tier: std
`)
	a := startAgent(t, grpctest.RefusedAddr(t), agent.StaticConfig{C: cfg})
	web := httpClient(t)
	for _, tenant := range []string{"acme", "acme", "other"} {
		if out := allow(t, web, a, `{"tenant":"`+tenant+`","class":"read"}`); !out.Allowed || !out.Degraded {
			t.Fatalf("%s (on_failure: open) with no region: %+v; want allowed, degraded", tenant, out)
		}
	}
	want := map[string]float64{"pro": 2, "std": 1}
	got := map[string]float64{}
	mfs, err := a.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_client_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["class"] != "read" || labels["result"] != "allowed" || labels["degraded"] != "true" {
				t.Errorf("decisions counted as %v; want read, allowed, degraded", labels)
			}
			got[labels["tier"]] += m.GetCounter().GetValue()
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("degraded decisions by tier %v; want %v", got, want)
	}
}

// TestLeaseOptionsComeFromTheConfigAtStart: the lease client's Sync period
// and class policies default to the config loaded at Start; options the
// caller set are kept; with no config loaded yet the lease package's
// defaults apply.
func TestLeaseOptionsComeFromTheConfigAtStart(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
refresh: 300ms
regions: {local: {weight: 1}}
classes: {read: {mode: lease, on_failure: closed}, write: {mode: strict, on_failure: open}, bulk: {mode: lease}}
tiers: {std: {read: {rate: 1/s, burst: 1}, write: {rate: 1/s, burst: 1}, bulk: {rate: 1/s, burst: 1}}}
default_tier: std
`)
	fromConfig := map[string]lease.ClassPolicy{
		"read":  {Mode: lease.ModeLease, OnFailure: lease.PolicyClosed},
		"write": {Mode: lease.ModeStrict, OnFailure: lease.PolicyOpen},
		"bulk":  {Mode: lease.ModeLease, OnFailure: lease.PolicyLocal},
	}
	given := map[string]lease.ClassPolicy{"other": {Mode: lease.ModeStrict, OnFailure: lease.PolicyClosed}}
	for _, c := range []struct {
		name    string
		src     agent.ConfigSource
		lease   lease.Options
		refresh time.Duration
		classes map[string]lease.ClassPolicy
	}{
		{"from the config", agent.StaticConfig{C: cfg}, lease.Options{}, 300 * time.Millisecond, fromConfig},
		{"set by the caller", agent.StaticConfig{C: cfg}, lease.Options{InstanceID: "edge-7", Refresh: 700 * time.Millisecond, Classes: given}, 700 * time.Millisecond, given},
		{"no config yet", agent.StaticConfig{}, lease.Options{}, lease.DefaultRefresh, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, err := agent.Start(agent.Options{
				RegionAddr: "127.0.0.1:1", Config: c.src, Lease: c.lease,
				GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", MetricsAddr: "off",
				Logger: slog.New(slog.DiscardHandler),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Stop()
			o := a.Client().Table().Options()
			if o.Refresh != c.refresh || !maps.Equal(o.Classes, c.classes) {
				t.Errorf("lease client Refresh %v, Classes %v; want %v, %v", o.Refresh, o.Classes, c.refresh, c.classes)
			}
			if id := a.Client().InstanceID(); c.lease.InstanceID != "" && id != c.lease.InstanceID {
				t.Errorf("instance id %q; want the one given, %q", id, c.lease.InstanceID)
			}
		})
	}
}
