package envoyrls_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/regional"
)

// fuzzConfig maps two domains, has lease and strict classes, a class
// whose requests may cost more than 1, and a slow key whose burst is 1.
const fuzzConfig = `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}}
classes:
  write:  {mode: lease, max_cost: 4}
  read:   {mode: lease}
  audit:  {mode: lease, shadow: true}
  export: {mode: strict, on_failure: closed, max_cost: 2}
tiers:
  std:
    write:  {rate: 100/s, burst: 100}
    read:   {rate: 0.151/s, burst: 1}
    audit:  {rate: 1/m, burst: 2}
    export: {rate: 1000000000/s, burst: 1000000000}
default_tier: std
envoy:
  descriptors:
    - {domain: sluice, tenant_key: tenant, class_key: class}
    - {domain: edge, tenant_key: customer, class: read}
  domains:
    - domain: tree
      descriptors:
        - key: service
          descriptors:
            - {key: user, value: "vip-*", unlimited: true}
            - {key: user, class: write}
            - {key: user, value: bob, class: audit, shadow_mode: true}
        - {key: ip, class: read}
        - {key: ip, value: 10.0.0.1, unlimited: true}
`

// rlsSeeds are valid requests and every kind of refused one: the fuzzer
// mutates their wire bytes. testdata/fuzz/FuzzShouldRateLimit holds the
// same, so `go test` runs them without the fuzzer.
func rlsSeeds() []*rlsv3.RateLimitRequest {
	valid := desc("tenant", "acme", "class", "write")
	return []*rlsv3.RateLimitRequest{
		request("sluice", 0, valid),
		request("sluice", 4, valid, desc("tenant", "acme", "class", "export"), desc("unrelated", "x")),
		request("edge", 1, desc("customer", "c1"), desc("customer", "c1")),
		request("sluice", 0, withHits(desc("tenant", "acme", "class", "audit"), 2), desc("tenant", "ac}me", "class", "read")),
		request("other", 7, desc("k", "v")),
		request("", 0, valid),
		request("sluice", 0),
		request("sluice", 0, valid, desc()),
		request("sluice", 0, desc("tenant", "ac me", "class", "write")),
		request("sluice", 0, desc("tenant", "acme", "class", "bogus")),
		request("sluice", 0, desc("tenant", "acme", "class", "write", "tenant", "other")),
		request("sluice", 1<<20+1, valid),
		request("sluice", 0, withHits(valid, 0)),
		request("sluice", 0, withHits(valid, 1<<40)),
		request("sluice", 0, negative(valid)),
		request("sluice", 0, override(valid)),
		request("sluice", 2, valid, desc("tenant", "acme", "class", "read")),
		request("sluice", 5, valid),
		request("sluice", 3, desc("tenant", "acme", "class", "export")),
		request("tree", 2, desc("service", "s1", "user", "u1"), desc("ip", "10.0.0.2"), desc("ip", "10.0.0.1")),
		request("tree", 0, desc("service", "s1", "user", "vip-7"), desc("service", "s1", "user", "bob"), desc("service", "s1")),
		request("tree", 0, desc("service", "s/1", "user", "u1")),
		request("tree", 0, withHits(desc("ip", "10.0.0.3"), 2)),
		request("tree", 0, desc("ip", "2001:db8::1"), desc("service", "/v1/orders", "user", "Zoë"), desc("service", "a:b", "user", "")),
	}
}

// FuzzShouldRateLimit sends arbitrary RateLimitRequests (decoded from
// fuzz bytes) over gRPC to the real Envoy rate-limit service, deciding
// through a loopback lease client on a real regional service and
// redis-server. No input may crash the service or fail inside it; a
// request refused as InvalidArgument leaves Redis byte for byte as it
// was. Each input gets its own lease client, closed after the check, so
// no background refill of an earlier input lands in between.
func FuzzShouldRateLimit(f *testing.F) {
	for _, r := range rlsSeeds() {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	cfg := regiontest.MustConfig(f, fuzzConfig)
	reg := regiontest.Start(f, cfg, "local")
	svc, err := envoyrls.New(envoyrls.Options{Config: regional.StaticConfig{C: cfg}})
	if err != nil {
		f.Fatal(err)
	}
	rls := serveRegistered(f, svc)

	f.Fuzz(func(t *testing.T, msg []byte) {
		req := &rlsv3.RateLimitRequest{}
		if err := proto.Unmarshal(msg, req); err != nil {
			return // not a message: gRPC would refuse it before the handler
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		lim, err := envoyrls.DialLoopback(reg.Addr, nil, lease.Options{
			InstanceID: lease.UniqueID("fuzz"), BreakerTimeout: 5 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		svc.SetLimiter(lim)
		defer func() {
			svc.SetLimiter(nil)
			if err := lim.Close(ctx); err != nil {
				t.Errorf("closing the loopback limiter: %v", err)
			}
		}()
		if n, err := reg.RDB.DBSize(ctx).Result(); err != nil {
			t.Fatal(err)
		} else if n > 200 {
			reg.RDB.FlushAll(ctx) // keep snapshots small; an empty Redis is a state too
		}
		before, err := redistest.Snapshot(ctx, reg.RDB)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := rls.ShouldRateLimit(ctx, req)
		st := status.Convert(err)
		switch st.Code() {
		case codes.OK:
			if n, want := len(resp.GetStatuses()), len(req.GetDescriptors()); n != want {
				t.Fatalf("%d statuses for %d descriptors", n, want)
			}
		case codes.InvalidArgument:
			if strings.TrimSpace(st.Message()) == "" {
				t.Fatal("refused without a message")
			}
			after, err := redistest.Snapshot(ctx, reg.RDB)
			if err != nil {
				t.Fatal(err)
			}
			if err := redistest.Unchanged(before, after); err != nil {
				t.Fatalf("refused (%s) but Redis changed: %v", st.Message(), err)
			}
		case codes.Unavailable, codes.DeadlineExceeded:
			// Redis is up: only a slow machine may time out; a script that
			// fails on what the input made it compute is a bug.
			if strings.Contains(st.Message(), "ERR") || strings.Contains(st.Message(), "script") {
				t.Fatalf("script failed on the input: %v", err)
			}
			t.Logf("slow: %v", err)
		default:
			t.Fatalf("unexpected answer: %v", err)
		}
	})
}
