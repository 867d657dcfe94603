package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// region runs a real regional service (real redis-server) whose metrics
// land in the returned registry.
func region(t testing.TB, cfg *config.Config) (*regiontest.Region, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r := regiontest.Start(t, cfg, "local", func(o *regional.Options) { o.Registerer = reg })
	return r, reg
}

// startAgent runs an agent of r on free loopback ports until the test
// ends; mod changes its options.
func startAgent(t testing.TB, regionAddr string, src agent.ConfigSource, mod ...func(*agent.Options)) *agent.Agent {
	t.Helper()
	o := agent.Options{
		RegionAddr: regionAddr, Config: src,
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		// A loaded machine (-race, 2 shared cores) can hold an Acquire
		// past the default 50ms: no decision here is meant to degrade.
		Lease:  lease.Options{BreakerTimeout: 10 * time.Second},
		Logger: slog.New(slog.DiscardHandler),
	}
	for _, f := range mod {
		f(&o)
	}
	a, err := agent.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	return a
}

// rls is a client of the agent's Envoy rate limit service.
func rls(t testing.TB, a *agent.Agent) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func envoyRequest(domain string, cost uint32, kv ...string) *rlsv3.RateLimitRequest {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: cost, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
}

// httpClient keeps its connections for the test and closes them after.
func httpClient(t testing.TB) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// post sends body to /v1/allow and returns the status and raw answer.
func post(t testing.TB, c *http.Client, a *agent.Agent, body string) (int, []byte) {
	t.Helper()
	resp, err := c.Post("http://"+a.HTTPAddr()+"/v1/allow", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

func allow(t testing.TB, c *http.Client, a *agent.Agent, body string) agent.AllowResponse {
	t.Helper()
	code, data := post(t, c, a, body)
	if code != http.StatusOK {
		t.Fatalf("POST /v1/allow %s: %d %s", body, code, data)
	}
	var out agent.AllowResponse
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("answer %s: %v", data, err)
	}
	return out
}

// counterSum is the sum of every series of the counter name in reg.
func counterSum(t testing.TB, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// A long refresh keeps the lease client's periodic Sync out of the test's
// few seconds; what the test counts is what the decisions cause.
const quietConfig = `
lease_ttl: 5m
refresh: 1m
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {std: {read: {rate: 1000000/s, burst: 1000000}}}
default_tier: std
envoy: {descriptors: [{domain: sluice, tenant_key: tenant, class_key: class}]}
`

// TestDecisionsAfterTheFirstLeaseMakeNoRegionalRPC: once the agent holds
// a lease with tokens above its refill mark, N decisions — half through
// Envoy's RLS, half through POST /v1/allow — are answered from memory: the
// regional service sees no RPC at all, and the pool lost exactly N tokens.
func TestDecisionsAfterTheFirstLeaseMakeNoRegionalRPC(t *testing.T) {
	cfg := regiontest.MustConfig(t, quietConfig)
	r, regMetrics := region(t, cfg)
	a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg})
	key := quota.Key{Tenant: "acme", Class: "read"}
	const n = 2000

	// Warm up until a grant sized to the demand leaves the pool well above
	// its low-water mark, and no report is out.
	ctx := context.Background()
	deadline := time.Now().Add(time.Duration(cfg.Refresh))
	for {
		for range 1000 {
			if d, err := a.Client().Allow(ctx, key, 1); err != nil || !d.Allowed {
				t.Fatalf("warm-up: %+v, %v", d, err)
			}
		}
		st, _ := a.Client().Table().State(key)
		if st.Tokens-st.LowWater > 2*n && !st.InFlight && st.Pending == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lease with %d tokens above the low-water mark within a refresh: %+v", 2*n, st)
		}
	}
	before, _ := a.Client().Table().State(key)
	rpcs := counterSum(t, regMetrics, "sluice_regional_requests_total")
	clientRPCs := counterSum(t, a.Registry(), "sluice_client_rpc_duration_seconds")
	if rpcs == 0 || clientRPCs == 0 {
		t.Fatalf("the warm-up's leases were not counted (region %v, client %v RPCs): the counts below would prove nothing", rpcs, clientRPCs)
	}

	client, web := rls(t, a), httpClient(t)
	req := envoyRequest("sluice", 0, "tenant", key.Tenant, "class", key.Class)
	var wg sync.WaitGroup
	var failures atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			for i := range n / 8 {
				if w%2 == 0 {
					resp, err := client.ShouldRateLimit(ctx, req)
					if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						t.Errorf("RLS decision %d: %v, %v", i, resp, err)
						failures.Add(1)
					}
					continue
				}
				if out := allow(t, web, a, `{"tenant":"acme","class":"read"}`); !out.Allowed || out.Degraded {
					t.Errorf("HTTP decision %d: %+v", i, out)
					failures.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if failures.Load() > 0 {
		t.FailNow()
	}

	if got := counterSum(t, regMetrics, "sluice_regional_requests_total") - rpcs; got != 0 {
		t.Errorf("the regional service served %v RPCs during %d decisions from a lease; want 0", got, n/2)
	}
	if got := counterSum(t, a.Registry(), "sluice_client_rpc_duration_seconds") - clientRPCs; got != 0 {
		t.Errorf("the agent's lease client sent %v RPCs during the decisions; want 0", got)
	}
	after, _ := a.Client().Table().State(key)
	if spent := after.Spent - before.Spent; spent != n/2 {
		t.Errorf("the decisions spent %d leased tokens; want %d (one each)", spent, n/2)
	}
	if after.Tokens != before.Tokens-n/2 {
		t.Errorf("pool went from %d to %d tokens; want %d", before.Tokens, after.Tokens, before.Tokens-n/2)
	}
}

const conformanceConfig = `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {std: {read: {rate: 50/s, burst: 20}}}
default_tier: std
envoy: {descriptors: [{domain: sluice, tenant_key: tenant, class_key: class}]}
`

// TestAdmissionsStayWithinTheBucketBound drives one key past its limit
// through both APIs at once for a few refreshes and counts what was
// admitted: never more than b + r·t over the window, and the denials carry
// a retry time.
func TestAdmissionsStayWithinTheBucketBound(t *testing.T) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	r, _ := region(t, cfg)
	a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg})
	client, web := rls(t, a), httpClient(t)
	ctx := context.Background()
	req := envoyRequest("sluice", 0, "tenant", "acme", "class", "read")
	window := 6 * time.Duration(cfg.Refresh)

	var admitted, denied atomic.Int64
	start := time.Now()
	stopAt := start.Add(window)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for time.Now().Before(stopAt) {
				if w%2 == 0 {
					resp, err := client.ShouldRateLimit(ctx, req)
					if err != nil {
						t.Errorf("RLS: %v", err)
						return
					}
					if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
						admitted.Add(1)
					} else {
						denied.Add(1)
					}
					continue
				}
				out := allow(t, web, a, `{"tenant":"acme","class":"read","cost":1}`)
				switch {
				case out.Allowed:
					admitted.Add(1)
				case out.RetryAfterMS < 1 && !out.RetryNever:
					t.Errorf("denial without a retry time: %+v", out)
					return
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	limit, err := cfg.Resolve(quota.Key{Tenant: "acme", Class: "read"})
	if err != nil {
		t.Fatal(err)
	}
	bound := float64(limit.Limit.Burst) + limit.Limit.Rate*elapsed.Seconds()
	t.Logf("admitted %d, denied %d over %v (bound b + r·t = %.1f)", admitted.Load(), denied.Load(), elapsed, bound)
	if float64(admitted.Load()) > bound {
		t.Errorf("admitted %d over %v; more than b + r·t = %.1f", admitted.Load(), elapsed, bound)
	}
	if admitted.Load() == 0 || denied.Load() == 0 {
		t.Errorf("admitted %d, denied %d: the load should both pass and exceed the limit", admitted.Load(), denied.Load())
	}
}

// TestBadInputIsRefusedAndChangesNothing: every malformed request is
// refused with a message naming the field at fault, and none of them
// creates a key in the agent or reaches the region.
func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	r, regMetrics := region(t, cfg)
	a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg})
	web := httpClient(t)

	cases := []struct {
		name, body string
		status     int
		field      string
		says       string
	}{
		{"empty body", ``, 400, "", "body is empty"},
		{"not JSON", `tenant=acme`, 400, "", "body is not valid JSON: unexpected byte 'e' at offset 1"},
		{"bad first byte", `}`, 400, "", "body is not valid JSON: unexpected byte '}' at offset 0"},
		{"truncated", `{"tenant":"acme"`, 400, "", "body is not valid JSON: it ends after 16 bytes, before its value does"},
		{"bad byte in the middle", `{"tenant":"acme",}`, 400, "", "body is not valid JSON: unexpected byte '}' at offset 17"},
		{"letter outside a string", `{"tenant":é}`, 400, "", "body is not valid JSON: unexpected byte 0xc3 at offset 10 (the first byte of 'é')"},
		{"invalid UTF-8 outside a string", "{\"tenant\":\xff}", 400, "", "body is not valid JSON: unexpected byte 0xff at offset 10"},
		{"invalid UTF-8 in a string", "{\"tenant\":\"ac\xffme\",\"class\":\"read\"}", 400, "", "body is not UTF-8 (as JSON must be): byte 0xff at offset 13, inside a string"},
		{"array", `[1,2]`, 400, "", "JSON object"},
		{"two values", `{"tenant":"acme","class":"read"} {}`, 400, "", "more than one JSON value"},
		{"unknown field", `{"tenant":"acme","class":"read","tokens":1}`, 400, "tokens", `unknown field "tokens"`},
		{"field in capitals", `{"TENANT":"acme","CLASS":"read","COST":2}`, 400, "TENANT", `unknown field "TENANT"`},
		{"field in another case after the field", `{"tenant":"acme","TENANT":"nobody","class":"read"}`, 400, "TENANT", `unknown field "TENANT"`},
		{"field spelled with a long s", `{"tenant":"acme","claſs":"read"}`, 400, "claſs", `unknown field "claſs"`},
		{"tenant twice", `{"tenant":"acme","tenant":"nobody","class":"read"}`, 400, "tenant", `field "tenant" appears more than once`},
		{"class twice", `{"tenant":"acme","class":"read","class":"read"}`, 400, "class", `field "class" appears more than once`},
		{"cost twice", `{"tenant":"acme","class":"read","cost":1,"cost":2}`, 400, "cost", `field "cost" appears more than once`},
		{"tenant twice, once escaped", `{"tenant":"acme","t\u0065nant":"nobody","class":"read"}`, 400, "tenant", `field "tenant" appears more than once`},
		{"null body", `null`, 400, "", "body must be a JSON object (got a JSON null)"},
		{"no tenant", `{"class":"read"}`, 400, "tenant", "tenant is empty"},
		{"tenant not a string", `{"tenant":7,"class":"read"}`, 400, "tenant", "tenant must be a JSON string"},
		{"bad tenant", `{"tenant":"a b","class":"read"}`, 400, "tenant", "tenant \"a b\" has byte ' '"},
		{"tenant with a letter outside ASCII", `{"tenant":"acéme","class":"read"}`, 400, "tenant", `tenant "acéme" has byte 0xc3 at offset 2 (the first byte of 'é')`},
		{"no class", `{"tenant":"acme"}`, 400, "class", "class is empty"},
		{"unknown class", `{"tenant":"acme","class":"nope"}`, 400, "class", `class "nope" is not configured`},
		{"zero cost", `{"tenant":"acme","class":"read","cost":0}`, 400, "cost", "cost 0 must be at least 1"},
		{"negative cost", `{"tenant":"acme","class":"read","cost":-3}`, 400, "cost", "cost -3 must be at least 1"},
		{"fractional cost", `{"tenant":"acme","class":"read","cost":1.5}`, 400, "cost", "whole number"},
		{"string cost", `{"tenant":"acme","class":"read","cost":"1"}`, 400, "cost", "whole number"},
		{"cost above burst", `{"tenant":"acme","class":"read","cost":21}`, 400, "cost", "exceeds the burst 20"},
		{"cost above max", `{"tenant":"acme","class":"read","cost":99999999}`, 400, "cost", "exceeds the maximum"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, data := post(t, web, a, tc.body)
			var e agent.ErrorResponse
			if err := json.Unmarshal(data, &e); err != nil {
				t.Fatalf("error answer %q is not JSON: %v", data, err)
			}
			if code != tc.status || e.Field != tc.field || !strings.Contains(e.Error, tc.says) {
				t.Errorf("got %d %+v; want %d, field %q, message containing %q", code, e, tc.status, tc.field, tc.says)
			}
			// The message speaks of the request, not of the parser.
			for _, internal := range []string{"json:", "invalid character", "literal", "Ã"} {
				if strings.Contains(e.Error, internal) {
					t.Errorf("message %q says %q", e.Error, internal)
				}
			}
		})
	}
	t.Run("GET", func(t *testing.T) {
		resp, err := web.Get("http://" + a.HTTPAddr() + "/v1/allow")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
			t.Errorf("GET: %d, Allow %q; want 405, Allow POST", resp.StatusCode, resp.Header.Get("Allow"))
		}
	})
	t.Run("huge body", func(t *testing.T) {
		body := `{"tenant":"` + strings.Repeat("a", agent.MaxBodyBytes) + `","class":"read"}`
		if code, data := post(t, web, a, body); code != http.StatusRequestEntityTooLarge {
			t.Errorf("got %d %s; want 413", code, data)
		}
	})

	client := rls(t, a)
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"no domain", envoyRequest("", 0, "tenant", "acme", "class", "read")},
	} {
		t.Run("RLS "+tc.name, func(t *testing.T) {
			_, err := client.ShouldRateLimit(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("got %v; want InvalidArgument", err)
			}
		})
	}
	// A cost above the burst is no error over the RLS (Envoy would let an
	// error through): OVER_LIMIT with no time to retry, asking nothing.
	resp, err := client.ShouldRateLimit(context.Background(), envoyRequest("sluice", 21, "tenant", "acme", "class", "read"))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[0].GetDurationUntilReset() != nil {
		t.Errorf("RLS cost above burst: %v, %v; want OVER_LIMIT without a reset", resp, err)
	}

	if n := a.Client().Table().Len(); n != 0 {
		t.Errorf("refused requests left %d keys in the agent; want 0", n)
	}
	if n := counterSum(t, regMetrics, "sluice_regional_requests_total"); n != 0 {
		t.Errorf("refused requests caused %v regional RPCs; want 0", n)
	}
	// A class value that names no class is no Sluice limit: OK, no key
	// (an error would let Envoy pass the request's other descriptors).
	resp, err = client.ShouldRateLimit(context.Background(), envoyRequest("sluice", 0, "tenant", "acme", "class", "nope"))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Errorf("RLS unknown class: %v, %v; want OK without a limit", resp, err)
	}
	if n := a.Client().Table().Len(); n != 0 {
		t.Errorf("an unknown class left %d keys in the agent; want 0", n)
	}
	// A tenant value no tenant id holds is decided, under its digest.
	resp, err = client.ShouldRateLimit(context.Background(), envoyRequest("sluice", 0, "tenant", "a b", "class", "read"))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("RLS tenant \"a b\": %v, %v; want OK", resp, err)
	}
}

// TestShadowKeyIsNeverRefused: a key in shadow mode answers allowed with
// would_deny once over its limit, and no retry time.
func TestShadowKeyIsNeverRefused(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease, shadow: true}}
tiers: {std: {read: {rate: 1/m, burst: 2}}}
default_tier: std
`)
	r, _ := region(t, cfg)
	a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg})
	web := httpClient(t)
	for i := range 5 {
		out := allow(t, web, a, `{"tenant":"acme","class":"read"}`)
		if !out.Allowed || out.RetryAfterMS != 0 {
			t.Fatalf("decision %d on a shadow key: %+v; want allowed, no retry time", i, out)
		}
		if i >= 2 && !out.WouldDeny {
			t.Errorf("decision %d past the burst of 2: %+v; want would_deny", i, out)
		}
	}
}

// TestConfigFromEtcd: an agent following etcd answers 503/UNAVAILABLE and
// is not ready until a config is applied, then decides on it; the
// watcher's built-in fallback is never served.
func TestConfigFromEtcd(t *testing.T) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	r, _ := region(t, cfg)
	etcd := etcdtest.Start(t)
	store := configstore.NewStore(etcd.Client(t), "/agenttest")
	w := configstore.NewWatcher(store, nil, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	a := startAgent(t, r.Addr, agent.Watched{W: w})
	web := httpClient(t)

	if code, data := post(t, web, a, `{"tenant":"acme","class":"read"}`); code != http.StatusServiceUnavailable || !strings.Contains(string(data), "no config loaded") {
		t.Errorf("before any config: %d %s; want 503 naming the missing config", code, data)
	}
	if _, err := rls(t, a).ShouldRateLimit(ctx, envoyRequest("sluice", 0, "tenant", "acme", "class", "read")); status.Code(err) != codes.Unavailable {
		t.Errorf("RLS before any config: %v; want Unavailable", err)
	}
	conn, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	if st, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health before any config: %v, %v; want NOT_SERVING", st, err)
	}

	if _, err := store.Apply(ctx, cfg, 0); err != nil {
		t.Fatal(err)
	}
	// Ready once the watcher has seen the config in etcd. The test judges
	// that it becomes ready, not how fast: the deadline is ten of the
	// config's lease TTLs, room for an etcd watch and a watcher starved
	// of CPU by a busy machine.
	patience := 10 * time.Duration(cfg.LeaseTTL)
	deadline := time.Now().Add(patience)
	for {
		st, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && st.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not SERVING %v after the config was applied: %v, %v", patience, st, err)
		}
		time.Sleep(10 * time.Millisecond) // polling readiness with a deadline
	}
	if out := allow(t, web, a, `{"tenant":"acme","class":"read"}`); !out.Allowed || out.Limit != 20 {
		t.Errorf("after the config: %+v; want allowed with limit 20", out)
	}
}
