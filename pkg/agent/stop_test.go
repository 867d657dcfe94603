package agent_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestStopWithDefaultTimeoutsReturnsLeasedTokens: an agent started with
// no DrainTimeout or ReleaseTimeout holds a lease with unspent tokens; by
// the time Stop returns, the region's Redis shows them back: the bucket
// has nothing out in leases and the agent's lease record is gone. Fails on
// a Start that leaves either timeout at zero (Stop's release would then
// give up at once, leaving the tokens out until the lease expires, which
// a long lease TTL keeps beyond the test).
func TestStopWithDefaultTimeoutsReturnsLeasedTokens(t *testing.T) {
	cfg := regiontest.MustConfig(t, quietConfig)
	r, _ := region(t, cfg)
	a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg})
	key := quota.Key{Tenant: "acme", Class: "read"}
	keys := luascripts.KeysFor(luascripts.DefaultPrefix, key)
	id := a.Client().InstanceID()
	ctx := context.Background()

	// outstanding is the bucket's tokens out in leases (0 when the field
	// or the bucket is absent) and whether the agent's lease record exists.
	outstanding := func() (int64, bool) {
		t.Helper()
		s, err := r.RDB.HGet(ctx, keys.Bucket, "out").Result()
		var out int64
		switch {
		case err == redis.Nil:
		case err != nil:
			t.Fatalf("HGET %s out: %v", keys.Bucket, err)
		default:
			if out, err = strconv.ParseInt(s, 10, 64); err != nil {
				t.Fatalf("bucket out %q: %v", s, err)
			}
		}
		held, err := r.RDB.HExists(ctx, keys.Bucket, luascripts.LeaseField(id)).Result()
		if err != nil {
			t.Fatalf("HEXISTS %s %s: %v", keys.Bucket, luascripts.LeaseField(id), err)
		}
		return out, held
	}

	// Demand until the agent holds a lease with tokens it has not spent,
	// and no report is out (the region's record then matches the pool).
	// The lease lasts lease_ttl, the bound of the wait: the first grant
	// comes within a refresh on a quiet machine, later on a starved one.
	web := httpClient(t)
	deadline := time.Now().Add(time.Duration(cfg.LeaseTTL))
	for {
		if out := allow(t, web, a, `{"tenant":"acme","class":"read"}`); !out.Allowed || out.Degraded {
			t.Fatalf("decision while warming up: %+v", out)
		}
		st, _ := a.Client().Table().State(key)
		if st.HasLease && st.Tokens > 0 && !st.InFlight && st.Pending == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lease with unspent tokens within the lease TTL: %+v", st)
		}
	}
	st, _ := a.Client().Table().State(key)
	out, held := outstanding()
	if !held || out < st.Tokens {
		t.Fatalf("before Stop: bucket out %d, lease record %v; want the record and at least the pool's %d unspent tokens out", out, held, st.Tokens)
	}

	a.Stop()
	if out, held := outstanding(); out != 0 || held {
		t.Errorf("after Stop: bucket out %d, lease record %v; want 0 out and no record (the pool's %d unspent tokens released)", out, held, st.Tokens)
	}
}

// TestStopWithDefaultTimeoutsLetsARequestInFlightFinish: a POST /v1/allow
// waiting on the region (its Redis holds writes: CLIENT PAUSE WRITE) when
// Stop begins still gets its answer once the region answers: Stop's drain
// of the HTTP API waits for it. Fails on a Start that leaves DrainTimeout
// at zero (the drain would give up at once and close the connection).
func TestStopWithDefaultTimeoutsLetsARequestInFlightFinish(t *testing.T) {
	cfg := regiontest.MustConfig(t, quietConfig)
	rs := redistest.Start(t)
	// No read timeout: the region's scripts wait out the pause rather than
	// fail, so the request stays in flight until the test lifts it.
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr(), ReadTimeout: -1, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	r := regiontest.StartOn(t, rs, cfg, "local", func(o *regional.Options) { o.Redis = rdb })
	a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg})
	key := quota.Key{Tenant: "acme", Class: "read"}
	ctx := context.Background()

	// The pause lasts longer than the test may; lifted below, and at
	// cleanup before the region stops.
	if err := r.RDB.Do(ctx, "CLIENT", "PAUSE", "600000", "WRITE").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	unpause := func() {
		if err := r.RDB.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
			t.Errorf("CLIENT UNPAUSE: %v", err)
		}
	}
	t.Cleanup(unpause)

	type answer struct {
		code int
		body []byte
		err  error
	}
	done := make(chan answer, 1)
	web := httpClient(t)
	go func() {
		resp, err := web.Post("http://"+a.HTTPAddr()+"/v1/allow", "application/json", strings.NewReader(`{"tenant":"acme","class":"read"}`))
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		done <- answer{code: resp.StatusCode, body: body, err: err}
	}()
	// The request is in flight once its acquire is (the lease client's
	// BreakerTimeout, 10s in startAgent, bounds that wait).
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, ok := a.Client().Table().State(key); ok && st.InFlight {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the request's acquire was not in flight within the breaker timeout")
		}
		runtime.Gosched()
	}

	stopped := make(chan struct{})
	go func() { a.Stop(); close(stopped) }()
	// Stop has begun draining the HTTP API once its listener refuses
	// connections.
	for {
		c, err := net.Dial("tcp", a.HTTPAddr())
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("Stop did not close the HTTP listener")
		}
		runtime.Gosched()
	}
	unpause()
	got := <-done
	<-stopped
	if got.err != nil || got.code != http.StatusOK {
		t.Fatalf("request in flight at Stop: status %d, %q, %v; want its answer (200)", got.code, got.body, got.err)
	}
}

// TestCleanStopLogsNoProblem: an agent that served a request and is then
// stopped logs its stop and no error or warning: the HTTP server's
// "closed" at Stop is how it ends, not a failure, and its leased tokens
// went back (an ERROR or WARN at every rollout would page someone for
// nothing, and hide a real failure among them).
func TestCleanStopLogsNoProblem(t *testing.T) {
	cfg := regiontest.MustConfig(t, quietConfig)
	r, _ := region(t, cfg)
	var logs logtest.Buffer
	a, err := agent.Start(agent.Options{
		RegionAddr: r.Addr, Config: agent.StaticConfig{C: cfg},
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		Lease:  lease.Options{BreakerTimeout: 10 * time.Second},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	if out := allow(t, httpClient(t), a, `{"tenant":"acme","class":"read"}`); !out.Allowed {
		t.Fatalf("decision: %+v", out)
	}
	a.Stop()
	text := logs.String()
	if !strings.Contains(text, "agent stopped") {
		t.Fatalf("no stop logged:\n%s", text)
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN") {
			t.Errorf("a clean stop logged a problem: %s", line)
		}
	}
}
