package envoyrls_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // the codec rawCodec defers to
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/internal/tlstest"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// TestRegionalEndpointAnswersAsRegister: the regional daemon's Envoy
// endpoint (DaemonOptions.Envoy: answers in wire form, behind the daemon's
// bounds and, with mutual TLS, its authorization) sends for each decision
// byte for byte the answer a Service served with Register (gRPC encoding
// the message) sends for the same decision. Random requests — one to
// three descriptors of keys that run out or never do, shadow, unmatched,
// invalid, with hits_addend — are answered by the daemon, deciding from
// its loopback lease client, whose decisions are recorded; then by a
// Service with Register on a plain server, which replays them. Both
// decide at one fixed clock, so equal decisions make equal answers.
func TestRegionalEndpointAnswersAsRegister(t *testing.T) {
	for _, mtls := range []bool{false, true} {
		name := "plaintext"
		if mtls {
			name = "mutual TLS"
		}
		t.Run(name, func(t *testing.T) { testRegionalAnswersAsRegister(t, mtls) })
	}
}

func testRegionalAnswersAsRegister(t *testing.T, mtls bool) {
	cfg := regiontest.MustConfig(t, testConfig+`
auth:
  identities:
    - {match: spiffe://t/region/local, roles: instance}
    - {match: spiffe://t/envoy, roles: envoy}
`)
	src := regional.StaticConfig{C: cfg}
	quiet := slog.New(slog.DiscardHandler)
	t0 := time.Now()
	clock := func() time.Time { return t0 }

	var serverTLS *tls.Config
	loopCreds, clientCreds := insecure.NewCredentials(), insecure.NewCredentials()
	if mtls {
		serverTLS, loopCreds, clientCreds = testPKI(t)
	}

	var log decisionLog
	encoded, err := envoyrls.New(envoyrls.Options{Config: src, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	envoyrls.SetClock(encoded, clock)
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: redistest.Start(t).Addr(),
		Config: src, ColdStart: regional.ColdStartFull, Unleased: true, ServerTLS: serverTLS,
		Logger: quiet, Envoy: encoded,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	loop, err := envoyrls.DialLoopback(d.GRPCAddr(), loopCreds, lease.Options{
		InstanceID: lease.UniqueID("envoy"), Logger: quiet,
		BreakerTimeout: 2 * time.Second, // a slow acquire on a busy machine is still a decision, recorded like any
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Close(context.Background()) })
	encoded.SetLimiter(&recorder{Limiter: loop, log: &log})

	reference, err := envoyrls.New(envoyrls.Options{Config: src, Logger: quiet, Limiter: &replayer{t: t, log: &log}})
	if err != nil {
		t.Fatal(err)
	}
	envoyrls.SetClock(reference, clock)
	plain := serveRegistered(t, reference)
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(clientCreds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	daemon := rlsv3.NewRateLimitServiceClient(conn)

	r := rand.New(rand.NewPCG(11, 12))
	codes := map[rlsv3.RateLimitResponse_Code]int{}
	for i := range 300 {
		req := randomEnvoyRequest(r)
		got, gotErr := rawAnswer(t, daemon, req)
		want, wantErr := rawAnswer(t, plain, req)
		if fmt.Sprint(status.Convert(gotErr)) != fmt.Sprint(status.Convert(wantErr)) {
			t.Fatalf("request %d %v: the daemon answered error %v, Register %v", i, req, gotErr, wantErr)
		}
		if string(got) != string(want) {
			t.Fatalf("request %d %v: the daemon sent\n% x\nRegister sent\n% x", i, req, got, want)
		}
		if gotErr == nil {
			var resp rlsv3.RateLimitResponse
			if err := proto.Unmarshal(got, &resp); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			codes[resp.GetOverallCode()]++
		}
		if rest := log.left(); rest != 0 {
			t.Fatalf("request %d %v: %d decisions of the daemon not replayed", i, req, rest)
		}
	}
	t.Logf("answers by code of 300 requests: %v", codes)
	// Both kinds of answer, and not mostly errors.
	if codes[rlsv3.RateLimitResponse_OK] < 100 || codes[rlsv3.RateLimitResponse_OVER_LIMIT] < 20 {
		t.Errorf("answers by code %v of 300 requests: want at least 100 OK and 20 OVER_LIMIT", codes)
	}
}

// randomEnvoyRequest draws a request against testConfig: keys that run
// out (tenant small's), keys that never do, the shadow class, the edge
// domain, unmatched descriptors and domains, and hits_addend up to 4
// (above tiny's write burst: invalid).
func randomEnvoyRequest(r *rand.Rand) *rlsv3.RateLimitRequest {
	descs := []func() *ratelimitv3.RateLimitDescriptor{
		func() *ratelimitv3.RateLimitDescriptor { return desc("tenant", "small", "class", "write") },
		func() *ratelimitv3.RateLimitDescriptor { return desc("tenant", "small2", "class", "read") },
		func() *ratelimitv3.RateLimitDescriptor { return desc("tenant", "small", "class", "audit") },
		func() *ratelimitv3.RateLimitDescriptor { return desc("tenant", "acme", "class", "read") },
		func() *ratelimitv3.RateLimitDescriptor { return desc("tenant", "acme", "class", "write") },
		func() *ratelimitv3.RateLimitDescriptor { return desc("customer", "globex") },
		func() *ratelimitv3.RateLimitDescriptor { return desc("nobody", "x") },
	}
	domain := []string{"sluice", "sluice", "sluice", "edge", "elsewhere"}[r.IntN(5)]
	n := 1 + r.IntN(3)
	ds := make([]*ratelimitv3.RateLimitDescriptor, n)
	for i := range ds {
		ds[i] = descs[r.IntN(len(descs))]()
		if r.IntN(6) == 0 {
			ds[i] = withHits(ds[i], uint64(r.IntN(3)))
		}
	}
	hits := uint32(0)
	if r.IntN(8) == 0 {
		hits = uint32(r.IntN(5))
	}
	return request(domain, hits, ds...)
}

// rawAnswer calls ShouldRateLimit and returns the answer's bytes as
// received.
func rawAnswer(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	codec := &rawCodec{proto: encoding.GetCodecV2("proto")}
	_, err := c.ShouldRateLimit(ctx, req, grpc.ForceCodecV2(codec))
	return codec.got, err
}

// rawCodec is gRPC's proto codec keeping the bytes it read.
type rawCodec struct {
	proto encoding.CodecV2
	got   []byte
}

func (c *rawCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }
func (c *rawCodec) Name() string                           { return c.proto.Name() }
func (c *rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.got = data.Materialize()
	return c.proto.Unmarshal(data, v)
}

// decisionLog is the decisions the daemon's Service took, in order, for
// the reference Service to take again.
type decisionLog struct {
	mu   sync.Mutex
	list []allowed
	next int
}

type allowed struct {
	key  quota.Key
	cost int64
	d    quota.Decision
	err  error
}

func (l *decisionLog) left() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.list) - l.next
}

// recorder is a Limiter that logs its Limiter's decisions.
type recorder struct {
	envoyrls.Limiter
	log *decisionLog
}

func (r *recorder) Allow(ctx context.Context, key quota.Key, cost int64) (quota.Decision, error) {
	d, err := r.Limiter.Allow(ctx, key, cost)
	r.log.mu.Lock()
	r.log.list = append(r.log.list, allowed{key, cost, d, err})
	r.log.mu.Unlock()
	return d, err
}

// replayer is a Limiter that takes the logged decisions again, in order.
type replayer struct {
	t   *testing.T
	log *decisionLog
}

func (r *replayer) Allow(_ context.Context, key quota.Key, cost int64) (quota.Decision, error) {
	r.log.mu.Lock()
	defer r.log.mu.Unlock()
	if r.log.next == len(r.log.list) {
		r.t.Errorf("the reference asked for a decision on %v (cost %d) the daemon did not take", key, cost)
		return quota.Decision{}, fmt.Errorf("no decision logged")
	}
	a := r.log.list[r.log.next]
	r.log.next++
	if a.key != key || a.cost != cost {
		r.t.Errorf("the reference asked for %v cost %d, the daemon decided %v cost %d", key, cost, a.key, a.cost)
	}
	return a.d, a.err
}

// testPKI issues a CA, the regional service's certificate (role instance,
// for its loopback lease client) and Envoy's (role envoy), and returns
// the server's TLS config and the loopback's and Envoy's credentials.
func testPKI(t *testing.T) (*tls.Config, credentials.TransportCredentials, credentials.TransportCredentials) {
	t.Helper()
	pki := tlstest.Write(t,
		tlsconfig.Leaf{Name: "regional", URIs: []string{"spiffe://t/region/local"}, DNSNames: []string{"localhost"}, Server: true, Client: true},
		tlsconfig.Leaf{Name: "envoy", URIs: []string{"spiffe://t/envoy"}, Client: true})
	return pki.Server(t, "regional"), pki.Creds(t, "regional", "localhost"), pki.Creds(t, "envoy", "localhost")
}
