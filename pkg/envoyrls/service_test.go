package envoyrls_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
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
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/regional"
)

// One region, so the region's static share is the whole limit. "write" is
// the shared key of the conformance test; "read" of tier std is so large
// that it never runs out; tier tiny refills so slowly (per minute) that
// refill during a test does not move the numbers.
const testConfig = `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}}
classes:
  write: {mode: lease}
  read:  {mode: lease}
  audit: {mode: lease, shadow: true}
tiers:
  std:
    write: {rate: 100/s, burst: 100}
    read:  {rate: 1000000/s, burst: 1000000}
    audit: {rate: 1/m, burst: 2}
  tiny:
    write: {rate: 1/m, burst: 3}
    read:  {rate: 6/m, burst: 10}
    audit: {rate: 1/m, burst: 2}
tenants:
  small:  {tier: tiny}
  small2: {tier: tiny}
default_tier: std
envoy:
  descriptors:
    - {domain: sluice, tenant_key: tenant, class_key: class}
    - {domain: edge, tenant_key: customer, class: read}
`

// process is one regional daemon serving the Envoy endpoint, decided by a
// lease client dialled to the daemon's own address.
type process struct {
	daemon *regional.Daemon
	svc    *envoyrls.Service
	lim    *envoyrls.Loopback
	reg    *prometheus.Registry
	rls    rlsv3.RateLimitServiceClient
}

// startProcess starts a daemon on rs, with no global tier (unleased).
// With attach false the Service has no Limiter until the test calls
// attach.
func startProcess(t *testing.T, rs *redistest.Server, cfg *config.Config, id string, attach bool) *process {
	t.Helper()
	return startProcessLeased(t, rs, cfg, id, attach, false)
}

// startProcessLeased is startProcess; leased runs the daemon as a region
// with a global tier (not Unleased) whose leader is not running, so it
// runs on its floor, each class's partition_share of its static share.
func startProcessLeased(t *testing.T, rs *redistest.Server, cfg *config.Config, id string, attach, leased bool) *process {
	t.Helper()
	p := &process{reg: prometheus.NewRegistry()}
	var err error
	p.svc, err = envoyrls.New(envoyrls.Options{Config: regional.StaticConfig{C: cfg}, Registerer: p.reg})
	if err != nil {
		t.Fatal(err)
	}
	p.daemon, err = regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: rs.Addr(),
		Config: regional.StaticConfig{C: cfg}, ColdStart: regional.ColdStartFull,
		Unleased: !leased, // no global tier: static shares unconditional
		Logger:   slog.New(slog.DiscardHandler),
		Envoy:    p.svc, // as cmd/regional serves it
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.daemon.Stop)
	conn, err := grpc.NewClient(p.daemon.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	p.rls = rlsv3.NewRateLimitServiceClient(conn)
	p.lim, err = envoyrls.DialLoopback(p.daemon.GRPCAddr(), nil, lease.Options{
		InstanceID: id,
		// Generous: the machine running the tests is shared, and a slow
		// acquire must not turn into a degraded (fallback) decision.
		BreakerTimeout: 2 * time.Second,
		Registerer:     p.daemon.Registry,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Runs before the daemon stops (cleanups are last in, first out), so
	// the release reaches the region.
	t.Cleanup(func() {
		if err := p.lim.Close(context.Background()); err != nil {
			t.Errorf("closing the loopback limiter: %v", err)
		}
	})
	if attach {
		p.svc.SetLimiter(p.lim)
	}
	return p
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func request(domain string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: ds}
}

func ask(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	return resp
}

func headerMap(resp *rlsv3.RateLimitResponse) map[string]string {
	h := map[string]string{}
	for _, hv := range resp.GetResponseHeadersToAdd() {
		h[hv.GetKey()] = hv.GetValue()
	}
	return h
}

// limitSpec is what a status of a matched descriptor must say.
type limitSpec struct {
	class   string
	perUnit uint32
	unit    rlsv3.RateLimitResponse_RateLimit_Unit
	burst   int64
	window  int64 // refill window, whole seconds
}

var writeStd = limitSpec{"write", 100, rlsv3.RateLimitResponse_RateLimit_SECOND, 100, 1}

// checkStatus returns what is wrong with one descriptor status.
func checkStatus(st *rlsv3.RateLimitResponse_DescriptorStatus, want limitSpec, maxReset time.Duration) error {
	cl := st.GetCurrentLimit()
	if cl.GetName() != want.class || cl.GetRequestsPerUnit() != want.perUnit || cl.GetUnit() != want.unit {
		return fmt.Errorf("current_limit %v, want %d per %v named %q", cl, want.perUnit, want.unit, want.class)
	}
	if int64(st.GetLimitRemaining()) > want.burst {
		return fmt.Errorf("limit_remaining %d above the burst %d", st.GetLimitRemaining(), want.burst)
	}
	if st.GetDurationUntilReset() == nil {
		return fmt.Errorf("no duration_until_reset")
	}
	if d := st.GetDurationUntilReset().AsDuration(); d < 0 || d > maxReset {
		return fmt.Errorf("duration_until_reset %v outside [0, %v]", d, maxReset)
	}
	return nil
}

// checkHeaders returns what is wrong with the headers describing st: the
// families must agree (checkFields), name the key's burst and window as
// the policy, and the region's cap (the whole burst: one region) as what
// the caller can expect, with st's remaining; the time fields are
// duration_until_reset unless over limit, where they are the retry delay.
func checkHeaders(resp *rlsv3.RateLimitResponse, st *rlsv3.RateLimitResponse_DescriptorStatus, want limitSpec) error {
	s, err := checkFields(resp)
	if err != nil {
		return err
	}
	if s.q != want.burst || s.w != want.window || s.cap != want.burst {
		return fmt.Errorf("cap %d, q=%d, w=%d; want %d, %d, %d", s.cap, s.q, s.w, want.burst, want.burst, want.window)
	}
	if s.remaining != int64(st.GetLimitRemaining()) {
		return fmt.Errorf("remaining %d, limit_remaining %d", s.remaining, st.GetLimitRemaining())
	}
	over := resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT
	if !over {
		reset := st.GetDurationUntilReset().AsDuration()
		if !s.hasT || s.t != int64(math.Ceil(reset.Seconds())) {
			return fmt.Errorf("t=%d (present %v), want duration_until_reset %v rounded up", s.t, s.hasT, reset)
		}
	} else if !s.hasT || s.t < 1 {
		return fmt.Errorf("over limit: t=%d (present %v), want a retry delay >= 1", s.t, s.hasT)
	} else if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && st.GetDurationUntilReset().AsDuration() != time.Duration(s.t)*time.Second {
		// Envoy's filter writes x-ratelimit-reset from duration_until_reset.
		return fmt.Errorf("over limit: duration_until_reset %v, t=%d: they must name the same second", st.GetDurationUntilReset().AsDuration(), s.t)
	}
	return nil
}

// counter sums a counter family's samples whose labels include all of want.
func counter(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metric
				}
			}
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

// TestTwoProcessesShareOneLimit: two regional processes of one region on
// one Redis each serve Envoy from their own leases. Saturating Envoy
// traffic spread over both admits at most b + r·t of a shared key (t on
// Redis time), saturates it, and every answer is in the RLS format.
func TestTwoProcessesShareOneLimit(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, testConfig)
	procs := []*process{startProcess(t, rs, cfg, "envoy-a", true), startProcess(t, rs, cfg, "envoy-b", true)}
	rdb := rs.Client()
	redisNow := func() time.Time {
		now, err := rdb.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now
	}

	const r, b = 100.0, 100.0
	const run = 3 * time.Second
	req := request("sluice", 0, desc("tenant", "acme", "class", "write"))
	var ok, over, badFormat [2]atomic.Int64
	var firstBad sync.Once
	var wg sync.WaitGroup
	stop := make(chan struct{})
	start := redisNow()
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				i := (g + n) % 2 // alternate between the processes
				resp, err := procs[i].rls.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Errorf("process %d: %v", i, err)
					return
				}
				st := resp.GetStatuses()
				var bad error
				switch {
				case len(st) != 1:
					bad = fmt.Errorf("%d statuses for 1 descriptor", len(st))
				case st[0].GetCode() != resp.GetOverallCode():
					bad = fmt.Errorf("status code %v, overall %v", st[0].GetCode(), resp.GetOverallCode())
				default:
					// The region's reset time is at most b/r = 1s away when
					// reported; allow for a late retry delay on top.
					if bad = checkStatus(st[0], writeStd, 2*time.Second); bad == nil {
						bad = checkHeaders(resp, st[0], writeStd)
					}
				}
				if bad != nil {
					badFormat[i].Add(1)
					firstBad.Do(func() { t.Errorf("process %d answered %v: %v", i, resp, bad) })
				}
				switch resp.GetOverallCode() {
				case rlsv3.RateLimitResponse_OK:
					ok[i].Add(1)
				case rlsv3.RateLimitResponse_OVER_LIMIT:
					over[i].Add(1)
					// Envoy would answer 429 now; pace the loop so the test
					// does not spin on denials.
					select {
					case <-stop:
						return
					case <-time.After(2 * time.Millisecond):
					}
				default:
					t.Errorf("overall code %v", resp.GetOverallCode())
					return
				}
			}
		}()
	}
	// The traffic runs for run, and on until both processes have answered
	// both ways: a load generator starved of CPU offers about r and may
	// meet no denial within run. The wait is for that event, bounded by
	// ten runs.
	<-time.After(run)
	for deadline := time.Now().Add(10 * run); time.Now().Before(deadline); {
		if ok[0].Load() > 0 && ok[1].Load() > 0 && over[0].Load() > 0 && over[1].Load() > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling the answer counts, with a deadline
	}
	close(stop)
	wg.Wait()
	// Tokens the processes still hold were debited from the bucket too:
	// the upper check is on everything the region gave out, read before
	// the end of the window is taken.
	var held int64
	for _, p := range procs {
		held += p.lim.Client().Table().HeldTokens()
	}
	elapsed := redisNow().Sub(start).Seconds()
	limit := b + r*elapsed
	got := float64(ok[0].Load() + ok[1].Load())
	t.Logf("OK %d + %d (+%d held), OVER_LIMIT %d + %d in %.2fs of Redis time; b + r·t = %.0f (%.1f%%)",
		ok[0].Load(), ok[1].Load(), held, over[0].Load(), over[1].Load(), elapsed, limit, 100*(got+float64(held))/limit)
	if got+float64(held) > limit {
		t.Fatalf("admitted %.0f + held %d > b + r·t = %.0f", got, held, limit)
	}
	// Liveness, not a performance target (≥ 90% on an idle machine): a
	// process starved of CPU lets the bucket sit at its cap, and that
	// refill is lost, as it should be.
	if floor := b + r*elapsed/2; got+float64(held) < floor {
		t.Fatalf("admitted %.0f + held %d < b + r·t/2 = %.0f: the key was not saturated", got, held, floor)
	}
	for i, p := range procs {
		if ok[i].Load() == 0 || over[i].Load() == 0 {
			t.Errorf("process %d answered OK %d times and OVER_LIMIT %d times; want both", i, ok[i].Load(), over[i].Load())
		}
		labels := map[string]string{"class": "write", "tier": "std"}
		if n := counter(t, p.reg, "sluice_envoy_decisions_total", with(labels, "result", "ok")); n != float64(ok[i].Load()) {
			t.Errorf("process %d: decisions_total{result=ok} = %v, answered OK %d times", i, n, ok[i].Load())
		}
		if n := counter(t, p.reg, "sluice_envoy_decisions_total", with(labels, "result", "over_limit")); n != float64(over[i].Load()) {
			t.Errorf("process %d: decisions_total{result=over_limit} = %v, answered OVER_LIMIT %d times", i, n, over[i].Load())
		}
		if n := counter(t, p.reg, "sluice_envoy_degraded_decisions_total", nil); n != 0 {
			t.Errorf("process %d: %v degraded decisions; the region was reachable", i, n)
		}
		if n := counter(t, p.reg, "sluice_envoy_request_duration_seconds", nil); n != float64(ok[i].Load()+over[i].Load()) {
			t.Errorf("process %d: %v requests timed, %d answered", i, n, ok[i].Load()+over[i].Load())
		}
	}
}

func with(m map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for kk, vv := range m {
		out[kk] = vv
	}
	return out
}

// TestInvalidInputChangesNothing: without a Limiter valid requests are
// Unavailable; once attached, every malformed request is InvalidArgument
// naming the field, and none of them — not even the valid descriptors in
// them — charges anything.
func TestInvalidInputChangesNothing(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, testConfig)
	p := startProcess(t, rs, cfg, "envoy-bad", false)
	valid := desc("tenant", "acme", "class", "write")

	ctx := context.Background()
	if _, err := p.rls.ShouldRateLimit(ctx, request("sluice", 0, valid)); status.Code(err) != codes.Unavailable {
		t.Fatalf("before a Limiter is attached: %v, want Unavailable", err)
	}
	if n := counter(t, p.reg, "sluice_envoy_request_duration_seconds", map[string]string{"result": "error"}); n != 1 {
		t.Errorf("%v requests timed as error before a Limiter is attached, want 1", n)
	}
	p.svc.SetLimiter(p.lim)

	rdb := rs.Client()
	before, err := redistest.Dump(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		msg  string
	}{
		{"empty domain", request("", 0, valid), "domain is empty"},
		{"no descriptors", request("sluice", 0), "descriptors"},
		{"descriptor without entries", request("sluice", 0, valid, desc()), "descriptors[1]: invalid argument: entries"},
		{"tenant given twice", request("sluice", 0, desc("tenant", "acme", "class", "write", "tenant", "other")), `key "tenant" appears again`},
		{"negative hits", request("sluice", 0, negative(valid)), "is_negative_hits"},
		{"limit override", request("sluice", 0, override(valid)), "limit overrides are not supported"},
		{"valid descriptor, then a bad one", request("sluice", 0, valid, negative(desc("tenant", "acme", "class", "write"))), "descriptors[1]"},
	}
	for _, c := range cases {
		_, err := p.rls.ShouldRateLimit(ctx, c.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), c.msg) {
			t.Errorf("%s: %v, want InvalidArgument mentioning %q", c.name, err, c.msg)
		}
	}
	after, err := redistest.Dump(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Errorf("refused requests changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if n := counter(t, p.reg, "sluice_envoy_decisions_total", nil); n != 0 {
		t.Errorf("%v decisions counted for refused requests", n)
	}
	if n := counter(t, p.reg, "sluice_envoy_request_duration_seconds", map[string]string{"result": "invalid_argument"}); n != float64(len(cases)) {
		t.Errorf("%v requests timed as invalid_argument, want %d", n, len(cases))
	}
	// The same service decides valid requests: the refusals were about
	// the input, not a broken service.
	if resp := ask(t, p.rls, request("sluice", 0, valid)); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("valid request after the refusals: %v", resp)
	}
	// SetLimiter(nil) detaches it: valid requests are Unavailable again.
	p.svc.SetLimiter(nil)
	if _, err := p.rls.ShouldRateLimit(ctx, request("sluice", 0, valid)); status.Code(err) != codes.Unavailable {
		t.Errorf("after SetLimiter(nil): %v, want Unavailable", err)
	}
}

func withHits(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	c := desc()
	c.Entries = d.Entries
	c.HitsAddend = wrapperspb.UInt64(n)
	return c
}

func negative(d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
	c := withHits(d, 1)
	c.IsNegativeHits = true
	return c
}

func override(d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
	c := desc()
	c.Entries = d.Entries
	c.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 1}
	return c
}

// TestAnswers covers the per-descriptor answers: over limit with
// retry-after, costs from hits_addend, several descriptors (the headers
// describe the one over limit), unmatched descriptors, a fixed-class
// mapping, and a service without headers.
func TestAnswers(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, testConfig)
	p := startProcess(t, rs, cfg, "envoy-answers", true)
	smallWrite := desc("tenant", "small", "class", "write")
	tinyWrite := limitSpec{"write", 1, rlsv3.RateLimitResponse_RateLimit_MINUTE, 3, 180}

	t.Run("over limit", func(t *testing.T) {
		for i := range 4 {
			resp := ask(t, p.rls, request("sluice", 0, smallWrite))
			want := rlsv3.RateLimitResponse_OK
			if i == 3 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			st := resp.GetStatuses()[0]
			if resp.GetOverallCode() != want || st.GetCode() != want {
				t.Fatalf("request %d: %v, want %v", i+1, resp, want)
			}
			// Burst 3 at 1/m: full again within 3 minutes.
			if err := checkStatus(st, tinyWrite, 3*time.Minute); err != nil {
				t.Fatalf("request %d: %v", i+1, err)
			}
			if err := checkHeaders(resp, st, tinyWrite); err != nil {
				t.Fatalf("request %d: %v", i+1, err)
			}
			if i == 3 {
				if st.GetLimitRemaining() != 0 {
					t.Errorf("over limit with %d remaining", st.GetLimitRemaining())
				}
				if n, _ := strconv.Atoi(headerMap(resp)[envoyrls.HeaderRetryAfter]); n > 60 {
					t.Errorf("retry-after %d s; one token refills in 60 s", n)
				}
			}
		}
	})

	t.Run("hits_addend", func(t *testing.T) {
		// tier tiny read: burst 10. Three requests of 4 tokens: the third
		// finds only 2 left.
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
			resp := ask(t, p.rls, request("sluice", 4, desc("tenant", "small", "class", "read")))
			if resp.GetOverallCode() != want {
				t.Fatalf("request %d of cost 4: %v, want %v", i+1, resp, want)
			}
			if rem := resp.GetStatuses()[0].GetLimitRemaining(); i == 1 && rem > 2 {
				t.Errorf("after 8 of 10 tokens, %d remaining", rem)
			}
		}
		// A descriptor's own hits_addend wins over the request's.
		d := withHits(desc("tenant", "small2", "class", "read"), 6)
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
			if resp := ask(t, p.rls, request("sluice", 1, d)); resp.GetOverallCode() != want {
				t.Fatalf("request %d of descriptor cost 6: %v, want %v", i+1, resp, want)
			}
		}
	})

	t.Run("several descriptors", func(t *testing.T) {
		unmatchedBefore := counter(t, p.reg, "sluice_envoy_unmatched_descriptors_total", nil)
		resp := ask(t, p.rls, request("sluice", 0,
			desc("tenant", "acme", "class", "read"),
			smallWrite, // exhausted above
			desc("path", "/healthz"),
		))
		st := resp.GetStatuses()
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || len(st) != 3 {
			t.Fatalf("answer %v, want OVER_LIMIT with 3 statuses", resp)
		}
		if st[0].GetCode() != rlsv3.RateLimitResponse_OK || st[1].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("codes %v, %v; want OK, OVER_LIMIT", st[0].GetCode(), st[1].GetCode())
		}
		readStd := limitSpec{"read", 1000000, rlsv3.RateLimitResponse_RateLimit_SECOND, 1000000, 1}
		if err := checkStatus(st[0], readStd, time.Second); err != nil {
			t.Error(err)
		}
		if st[2].GetCode() != rlsv3.RateLimitResponse_OK || st[2].GetCurrentLimit() != nil || st[2].GetLimitRemaining() != 0 {
			t.Errorf("unmatched descriptor answered %v, want OK without a limit", st[2])
		}
		// The headers describe the descriptor over limit.
		if err := checkHeaders(resp, st[1], tinyWrite); err != nil {
			t.Error(err)
		}
		if n := counter(t, p.reg, "sluice_envoy_unmatched_descriptors_total", nil) - unmatchedBefore; n != 1 {
			t.Errorf("unmatched counter grew by %v, want 1", n)
		}
	})

	t.Run("unmatched domain", func(t *testing.T) {
		resp := ask(t, p.rls, request("elsewhere", 0, desc("tenant", "acme", "class", "write")))
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 1 ||
			resp.GetStatuses()[0].GetCurrentLimit() != nil || len(resp.GetResponseHeadersToAdd()) != 0 {
			t.Errorf("answer %v, want OK, one status without a limit, no headers", resp)
		}
	})

	t.Run("fixed-class mapping", func(t *testing.T) {
		resp := ask(t, p.rls, request("edge", 0, desc("customer", "acme", "unrelated", "x")))
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit().GetName() != "read" {
			t.Errorf("answer %v, want OK on class read", resp)
		}
	})

	t.Run("headers off", func(t *testing.T) {
		off := false
		quiet, err := envoyrls.New(envoyrls.Options{Config: regional.StaticConfig{C: cfg}, Limiter: p.lim, Headers: &off})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := quiet.ShouldRateLimit(context.Background(), request("sluice", 0, smallWrite))
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || len(resp.GetResponseHeadersToAdd()) != 0 {
			t.Errorf("answer %v, want OVER_LIMIT without headers", resp)
		}
	})
}

// TestShadowModeNeverLimits: a shadow class answers OK past its limit and
// counts the would-be denials as shadow_denied.
func TestShadowModeNeverLimits(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, testConfig)
	p := startProcess(t, rs, cfg, "envoy-shadow", true)
	audit := limitSpec{"audit", 1, rlsv3.RateLimitResponse_RateLimit_MINUTE, 2, 120}
	const n = 10
	for i := range n {
		resp := ask(t, p.rls, request("sluice", 0, desc("tenant", "acme", "class", "audit")))
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v, want OK (shadow)", i+1, resp)
		}
		if err := checkStatus(st, audit, 2*time.Minute); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		if err := checkHeaders(resp, st, audit); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
	}
	labels := map[string]string{"class": "audit", "tier": "std"}
	okN := counter(t, p.reg, "sluice_envoy_decisions_total", with(labels, "result", "ok"))
	shadowN := counter(t, p.reg, "sluice_envoy_decisions_total", with(labels, "result", "shadow_denied"))
	// The lease client answers a shadow key without waiting for a
	// synchronous acquire (the request passes anyway), so its real verdict
	// may deny before the whole burst of 2 was fetched; it never allows
	// more than the burst.
	if okN < 1 || okN > 2 || shadowN < n-2 || okN+shadowN != n {
		t.Errorf("ok %v, shadow_denied %v; want 1..2 (burst 2) and the rest shadow_denied", okN, shadowN)
	}
	if over := counter(t, p.reg, "sluice_envoy_decisions_total", with(labels, "result", "over_limit")); over != 0 {
		t.Errorf("%v over_limit decisions in shadow mode", over)
	}
}

// TestMetricsCarryNoTenant: every series is sluice_envoy_* with labels
// from class, tier and result only.
func TestMetricsCarryNoTenant(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, testConfig)
	p := startProcess(t, rs, cfg, "envoy-metrics", true)
	ask(t, p.rls, request("sluice", 0, desc("tenant", "acme", "class", "write"), desc("other", "x")))
	p.rls.ShouldRateLimit(context.Background(), request("", 0))
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	allowed := map[string]bool{"class": true, "tier": true, "result": true}
	for _, mf := range mfs {
		seen[mf.GetName()] = true
		if !strings.HasPrefix(mf.GetName(), "sluice_envoy_") {
			t.Errorf("metric %s lacks the sluice_envoy_ prefix", mf.GetName())
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if !allowed[lp.GetName()] || lp.GetValue() == "acme" {
					t.Errorf("metric %s has label %s=%q", mf.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}
	for _, name := range []string{"sluice_envoy_decisions_total", "sluice_envoy_unmatched_descriptors_total", "sluice_envoy_request_duration_seconds"} {
		if !seen[name] {
			t.Errorf("metric %s not exported", name)
		}
	}
	// The Service is also a Collector, for registries that exist only
	// after it was built (a daemon's).
	later := prometheus.NewRegistry()
	if err := later.Register(p.svc); err != nil {
		t.Fatal(err)
	}
	if n := counter(t, later, "sluice_envoy_unmatched_descriptors_total", nil); n != 1 {
		t.Errorf("registered later: unmatched %v, want 1", n)
	}
	if _, err := envoyrls.New(envoyrls.Options{Config: regional.StaticConfig{C: cfg}, Registerer: p.reg}); err == nil {
		t.Error("a second Service registered on the same registry")
	}
	if _, err := envoyrls.New(envoyrls.Options{}); err == nil {
		t.Error("New without Config succeeded")
	}
}

// TestNeverAnswerPromisesNoTime: a key of 5/s with a burst of 5 split
// over two regions, so this region's static cap (2.5) is below the burst.
// A cost above the configured burst (6) can never pass while the config
// stays as it is: Envoy is told OVER_LIMIT with no duration_until_reset
// and no retry-after, no time being promised after which the request
// still could not be admitted. A cost within the burst but above the
// region's cap (4) is refused by the region's bucket now; where the
// region has a global tier its cap grows by grants (and leases come back),
// so it is OVER_LIMIT with a time to retry (the client asks the region
// again a refresh later), not the never form; where it has none
// (unleased) its cap is its static share for good, so it is the never
// form. A region with a global tier on its floor with partition_share 0
// (its static lease lapsed: here, its leader never ran) has a rate of 0,
// which the global tier gives back once it answers: one token is
// OVER_LIMIT with a time, not the never form. By a strict check and by a
// lease alike.
func TestNeverAnswerPromisesNoTime(t *testing.T) {
	for _, mode := range []string{"strict", "lease"} {
		for _, region := range []string{"unleased", "leased", "floor"} {
			t.Run(mode+"/"+region, func(t *testing.T) { testNeverAnswer(t, mode, region) })
		}
	}
}

func testNeverAnswer(t *testing.T, mode, region string) {
	rs := redistest.Start(t)
	share := ", partition_share: 1" // the floor is the whole static share
	if region == "floor" {
		share = ", partition_share: 0"
	}
	cfg := regiontest.MustConfig(t, `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}, far: {weight: 1}}
classes:
  export: {mode: `+mode+share+`}
tiers:
  std:
    export: {rate: 5/s, burst: 5}
default_tier: std
envoy:
  descriptors:
    - {domain: sluice, tenant_key: tenant, class_key: class}
`)
	p := startProcessLeased(t, rs, cfg, "envoy-never-"+mode+"-"+region, true, region != "unleased")
	overLimit := func(i int, hits uint32) (*rlsv3.RateLimitResponse_DescriptorStatus, map[string]string) {
		t.Helper()
		resp := ask(t, p.rls, request("sluice", hits, desc("tenant", "acme", "class", "export")))
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("request %d, hits %d: %v, want OVER_LIMIT", i, hits, resp)
		}
		return st, headerMap(resp)
	}
	never := func(what string, st *rlsv3.RateLimitResponse_DescriptorStatus, h map[string]string) {
		t.Helper()
		if st.GetDurationUntilReset() != nil {
			t.Errorf("%s: duration_until_reset %v promises a time", what, st.GetDurationUntilReset().AsDuration())
		}
		for _, k := range []string{envoyrls.HeaderRetryAfter, envoyrls.HeaderReset} {
			if v, ok := h[k]; ok {
				t.Errorf("%s: %s = %q promises a time", what, k, v)
			}
		}
	}
	wait := func(what string, st *rlsv3.RateLimitResponse_DescriptorStatus, h map[string]string) {
		t.Helper()
		if d := st.GetDurationUntilReset(); d == nil || d.AsDuration() <= 0 {
			t.Errorf("%s: duration_until_reset %v, want a time to retry", what, d)
		}
		if h[envoyrls.HeaderRetryAfter] != "1" {
			t.Errorf("%s: retry-after %q, want 1 (the refresh)", what, h[envoyrls.HeaderRetryAfter])
		}
	}
	for i := range 2 {
		st, h := overLimit(i+1, 6)
		never(fmt.Sprintf("request %d, cost above the burst", i+1), st, h)
		// The region has not answered on the key yet and this loopback
		// is given no static share (lease.Options.StaticShare, which
		// cmd/regional's is: TestNeverAnswerCarriesTheRegionsCapNotTheBurst):
		// its cap is not known, so the first value is the configured burst.
		if h[envoyrls.HeaderLimit] != "5, 5;w=1" || h[envoyrls.HeaderRemaining] != "0" {
			t.Errorf("request %d, cost above the burst: headers %v, want limit \"5, 5;w=1\" and remaining 0", i+1, h)
		}
	}
	if region == "floor" {
		for i := range 2 {
			st, h := overLimit(i+1, 1)
			wait(fmt.Sprintf("request %d, one token on the region's floor", i+1), st, h)
			if h[envoyrls.HeaderLimit] != "0, 5;w=1" {
				t.Errorf("request %d, one token on the region's floor: limit %q, want \"0, 5;w=1\" (the floor's cap of 0)", i+1, h[envoyrls.HeaderLimit])
			}
		}
		return
	}
	for i := range 2 {
		st, h := overLimit(i+1, 4)
		what := fmt.Sprintf("request %d, cost within the burst above the %s region's cap", i+1, region)
		if region == "unleased" {
			never(what, st, h)
		} else {
			wait(what, st, h)
		}
		if h[envoyrls.HeaderLimit] != "2, 5;w=1" {
			t.Errorf("%s: limit %q, want \"2, 5;w=1\" (the region's cap of 2)", what, h[envoyrls.HeaderLimit])
		}
	}
	// Once the region has answered on the key, the never form reports the
	// region's cap as the first value, as every other answer does.
	if _, h := overLimit(3, 6); h[envoyrls.HeaderLimit] != "2, 5;w=1" {
		t.Errorf("cost above the burst after the region answered: limit %q, want \"2, 5;w=1\" (the region's cap, then the policy)", h[envoyrls.HeaderLimit])
	}
}

// TestNoConfigIsUnavailable: a Service whose config source has no config
// yet answers a valid request codes.Unavailable, never a verdict.
func TestNoConfigIsUnavailable(t *testing.T) {
	reg := prometheus.NewRegistry()
	svc, err := envoyrls.New(envoyrls.Options{Config: regional.StaticConfig{}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := svc.ShouldRateLimit(context.Background(), request("sluice", 0, desc("tenant", "acme", "class", "write")))
	if status.Code(err) != codes.Unavailable || resp != nil {
		t.Errorf("answer %v, error %v; want Unavailable", resp, err)
	}
	if n := counter(t, reg, "sluice_envoy_request_duration_seconds", map[string]string{"result": "error"}); n != 1 {
		t.Errorf("%v requests timed as error, want 1", n)
	}
}

// TestLimiterErrorsAreNotVerdicts: a request the Limiter fails to decide
// is answered with a gRPC error, never a verdict: InvalidArgument when the
// region refuses the key (a class the Service's config has and the
// region's lacks), Unavailable when the Limiter is closed, and the
// context's own code when Envoy gave up by then.
func TestLimiterErrorsAreNotVerdicts(t *testing.T) {
	const region = `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}}
classes:
  write: {mode: lease}
tiers:
  std:
    write: {rate: 100/s, burst: 100}
default_tier: std
`
	reg := regiontest.Start(t, regiontest.MustConfig(t, region), "local")
	svcCfg := regiontest.MustConfig(t, strings.NewReplacer(
		"  write: {mode: lease}\n", "  write: {mode: lease}\n  extra: {mode: lease}\n",
		"    write: {rate: 100/s, burst: 100}\n", "    write: {rate: 100/s, burst: 100}\n    extra: {rate: 100/s, burst: 100}\n",
	).Replace(region)+`
envoy:
  descriptors:
    - {domain: sluice, tenant_key: tenant, class_key: class}
`)
	// A breaker timeout far beyond the region's answer, so that even a
	// starved machine hears the refusal instead of deciding by on_failure.
	lim, err := envoyrls.DialLoopback(reg.Addr, nil, lease.Options{InstanceID: "envoy-errors", BreakerTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	mreg := prometheus.NewRegistry()
	svc, err := envoyrls.New(envoyrls.Options{Config: regional.StaticConfig{C: svcCfg}, Limiter: lim, Registerer: mreg})
	if err != nil {
		t.Fatal(err)
	}
	// Each refusal is timed under its own result, so that the latency of
	// answers is not mixed with that of failures.
	timed := func(what, result string, want float64) {
		t.Helper()
		if n := counter(t, mreg, "sluice_envoy_request_duration_seconds", map[string]string{"result": result}); n != want {
			t.Errorf("%s: %v requests timed as %s, want %v", what, n, result, want)
		}
	}
	ctx := context.Background()
	resp, err := svc.ShouldRateLimit(ctx, request("sluice", 0, desc("tenant", "acme", "class", "extra")))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), `descriptors[0] (tenant "acme", class "extra")`) || resp != nil {
		t.Errorf("a class the region refuses: answer %v, error %v; want InvalidArgument naming the descriptor", resp, err)
	}
	timed("a class the region refuses", "invalid_argument", 1)
	if err := lim.Close(ctx); err != nil {
		t.Fatal(err)
	}
	write := request("sluice", 0, desc("tenant", "acme", "class", "write"))
	if resp, err := svc.ShouldRateLimit(ctx, write); status.Code(err) != codes.Unavailable || resp != nil {
		t.Errorf("closed Limiter: answer %v, error %v; want Unavailable", resp, err)
	}
	timed("closed Limiter", "error", 1)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if resp, err := svc.ShouldRateLimit(gone, write); status.Code(err) != codes.Canceled || resp != nil {
		t.Errorf("closed Limiter, Envoy gone: answer %v, error %v; want Canceled", resp, err)
	}
	timed("closed Limiter, Envoy gone", "error", 2)
	timed("no request answered", "ok", 0)
}

// TestDegradedDecisionsCounted: a decision the class's on_failure policy
// made because the region could not be reached is answered and counted in
// sluice_envoy_degraded_decisions_total.
func TestDegradedDecisionsCounted(t *testing.T) {
	cfg := regiontest.MustConfig(t, testConfig)
	// An address nothing listens on: every call to the region fails.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	lim, err := envoyrls.DialLoopback(addr, nil, lease.Options{InstanceID: "envoy-degraded", BreakerTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close(context.Background()) })
	reg := prometheus.NewRegistry()
	svc, err := envoyrls.New(envoyrls.Options{Config: regional.StaticConfig{C: cfg}, Limiter: lim, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := svc.ShouldRateLimit(context.Background(), request("sluice", 0, desc("tenant", "acme", "class", "write")))
	if err != nil || len(resp.GetStatuses()) != 1 {
		t.Fatalf("answer %v, error %v; want a decision by the on_failure policy", resp, err)
	}
	labels := map[string]string{"class": "write", "tier": "std"}
	if n := counter(t, reg, "sluice_envoy_degraded_decisions_total", labels); n != 1 {
		t.Errorf("degraded decisions %v, want 1", n)
	}
	if n := counter(t, reg, "sluice_envoy_decisions_total", labels); n != 1 {
		t.Errorf("decisions %v, want 1", n)
	}
}

// TestNoLimitValuesLeaveTheOthersCharged: a class_key value that names no
// class and a descriptor's hits_addend of 0 (no token needed) are answered
// OK as unmatched descriptors, not refused: the request's other
// descriptors are charged as usual (a refusal would let Envoy pass the
// whole request uncharged).
func TestNoLimitValuesLeaveTheOthersCharged(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, testConfig)
	p := startProcess(t, rs, cfg, "envoy-nolimit", true)
	small := desc("tenant", "small", "class", "write") // burst 3
	for i, want := range []rlsv3.RateLimitResponse_Code{
		rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT,
	} {
		resp := ask(t, p.rls, request("sluice", 0, desc("tenant", "small", "class", "bogus"), withHits(small, 0), small, desc("tenant", "small", "class", "wr ite")))
		st := resp.GetStatuses()
		if resp.GetOverallCode() != want || len(st) != 4 || st[2].GetCode() != want || st[2].GetCurrentLimit() == nil {
			t.Fatalf("request %d: %v, want %v decided on the third descriptor", i+1, resp, want)
		}
		for _, j := range []int{0, 1, 3} {
			if st[j].GetCode() != rlsv3.RateLimitResponse_OK || st[j].GetCurrentLimit() != nil {
				t.Errorf("request %d, descriptor %d: %v, want OK without a limit", i+1, j, st[j])
			}
		}
	}
	if n := counter(t, p.reg, "sluice_envoy_unmatched_descriptors_total", nil); n != 12 {
		t.Errorf("unmatched_descriptors_total = %v, want 12", n)
	}
}

// TestDescriptorsAfterTheOneThatLimitsARequestAreNotCharged: once one of a
// request's descriptors is over limit, the descriptors after it are not
// charged (they are answered as not decided: OK, no current_limit), and a
// descriptor whose cost is above its burst charges none of the others:
// Envoy refuses the request anyway, and tokens spent on it starved the
// other descriptors' own requests (a per-address limit and a shared one,
// both charged by every request, passed together about once a second).
func TestDescriptorsAfterTheOneThatLimitsARequestAreNotCharged(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, testConfig)
	p := startProcess(t, rs, cfg, "envoy-skip", true)
	small := desc("tenant", "small", "class", "write")   // tier tiny: burst 3, 1/m
	small2 := desc("tenant", "small2", "class", "write") // the same, a bucket of its own
	codes := func(resp *rlsv3.RateLimitResponse) (out []rlsv3.RateLimitResponse_Code) {
		for _, st := range resp.GetStatuses() {
			out = append(out, st.GetCode())
		}
		return out
	}
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for range 3 { // spend small2's burst
		if resp := ask(t, p.rls, request("sluice", 1, small2)); resp.GetOverallCode() != ok {
			t.Fatalf("spending small2's burst: %v", resp)
		}
	}
	for range 3 {
		resp := ask(t, p.rls, request("sluice", 1, small2, small))
		if resp.GetOverallCode() != over || !slices.Equal(codes(resp), []rlsv3.RateLimitResponse_Code{over, ok}) ||
			resp.GetStatuses()[1].GetCurrentLimit() != nil {
			t.Fatalf("small2 spent, then small: %v; want over limit, small answered OK as not decided", resp)
		}
	}
	// A cost above small2's burst charges small nothing either, whatever
	// the order.
	resp := ask(t, p.rls, &rlsv3.RateLimitRequest{Domain: "sluice", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		small, {Entries: small2.Entries, HitsAddend: wrapperspb.UInt64(4)}}})
	if resp.GetOverallCode() != over {
		t.Fatalf("a cost above small2's burst: %v; want over limit", resp)
	}
	// small kept its whole burst.
	for i := range 3 {
		if resp := ask(t, p.rls, request("sluice", 1, small)); resp.GetOverallCode() != ok {
			t.Fatalf("small's request %d after the refused ones: %v; want its burst of 3 untouched", i+1, resp)
		}
	}
}

// TestShadowDescriptorsNeitherStopNorSkipCharging: a descriptor in shadow
// mode never limits a request, so it stops no charging: the descriptors
// after one it would deny (its bucket spent, or its cost above its burst)
// are charged and decided; and it is itself decided (counted as shadow
// mode observes) after a descriptor that limits the request, which stops
// the charging of the descriptors after it all the same.
func TestShadowDescriptorsNeitherStopNorSkipCharging(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, testConfig)
	p := startProcess(t, rs, cfg, "envoy-shadow", true)
	small := desc("tenant", "small", "class", "write")   // tier tiny: burst 3, 1/m
	small2 := desc("tenant", "small2", "class", "write") // the same, a bucket of its own
	audit := desc("tenant", "small", "class", "audit")   // shadow mode, burst 2, 1/m
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	decided := func(st *rlsv3.RateLimitResponse_DescriptorStatus) bool { return st.GetCurrentLimit() != nil }

	// The audit bucket is spent by the first two requests; small is
	// charged by all three.
	for i := range 3 {
		resp := ask(t, p.rls, request("sluice", 1, audit, small))
		st := resp.GetStatuses()
		if resp.GetOverallCode() != ok || len(st) != 2 || !decided(st[0]) || st[1].GetCode() != ok || !decided(st[1]) {
			t.Fatalf("request %d, audit then small: %v; want both decided, OK", i+1, resp)
		}
	}
	// An audit cost above its burst stops nothing either: small2 is charged.
	resp := ask(t, p.rls, request("sluice", 1, withHits(desc("tenant", "small2", "class", "audit"), 3), small2))
	if st := resp.GetStatuses(); resp.GetOverallCode() != ok || len(st) != 2 || st[1].GetCode() != ok || !decided(st[1]) {
		t.Fatalf("an audit cost above its burst, then small2: %v; want small2 decided, OK", resp)
	}
	// small spent: the shadow descriptor after it is decided, small2 after
	// that is not charged.
	resp = ask(t, p.rls, request("sluice", 1, small, desc("tenant", "bob", "class", "audit"), small2))
	st := resp.GetStatuses()
	if resp.GetOverallCode() != over || len(st) != 3 || st[0].GetCode() != over || !decided(st[1]) || st[2].GetCode() != ok || decided(st[2]) {
		t.Fatalf("small spent, then a shadow descriptor, then small2: %v; want over limit, the shadow one decided, small2 not", resp)
	}
	// small2 kept the two tokens its first request left.
	for i := range 2 {
		if resp := ask(t, p.rls, request("sluice", 1, small2)); resp.GetOverallCode() != ok {
			t.Fatalf("small2's request %d after the limited one: %v; want OK", i+1, resp)
		}
	}
	if resp := ask(t, p.rls, request("sluice", 1, small2)); resp.GetOverallCode() != over {
		t.Fatalf("small2's third request: %v; want over limit (three charged in all)", resp)
	}
}
