package envoyrls_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/envoyrls"
)

// serveEncoded serves svc with RegisterEncoded on a server of its own
// built with ServerOptions (and opts).
func serveEncoded(t testing.TB, svc *envoyrls.Service, opts ...grpc.ServerOption) rlsv3.RateLimitServiceClient {
	t.Helper()
	g := grpc.NewServer(append(envoyrls.ServerOptions(), opts...)...)
	envoyrls.RegisterEncoded(g, svc)
	return serveOn(t, g)
}

// serveRegistered serves svc with Register on a plain server of its own.
func serveRegistered(t testing.TB, svc *envoyrls.Service) rlsv3.RateLimitServiceClient {
	t.Helper()
	g := grpc.NewServer()
	envoyrls.Register(g, svc)
	return serveOn(t, g)
}

// serveOn serves g on a loopback port until the test ends and returns a
// client of it.
func serveOn(t testing.TB, g *grpc.Server) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(grpctest.Serve(t, g), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// TestEncodedAnswersOverGRPC: a Service served with RegisterEncoded
// answers over gRPC as TestAnswers checks the answers of Register: a key
// walked past its limit gets statuses and headers that agree with the
// limit and with each other, an unmatched descriptor an OK status. A
// unary interceptor on the server runs on every call and is given the
// request as a message, and the answer in wire form, which it passes on.
func TestEncodedAnswersOverGRPC(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, testConfig)
	p := startProcess(t, rs, cfg, "envoy-encoded", true)
	tinyWrite := limitSpec{"write", 1, rlsv3.RateLimitResponse_RateLimit_MINUTE, 3, 180}
	var intercepted atomic.Int64
	for _, tc := range []struct {
		name   string
		tenant string
		opts   []grpc.ServerOption
	}{
		{"plain", "small", nil},
		{"intercepted", "small2", []grpc.ServerOption{grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if _, ok := req.(*rlsv3.RateLimitRequest); !ok {
				t.Errorf("the interceptor was given a request of type %T", req)
			}
			resp, err := h(ctx, req)
			if _, ok := resp.(proto.Message); ok {
				t.Errorf("the interceptor was given the answer as a message %T, want wire form", resp)
			}
			intercepted.Add(1)
			return resp, err
		})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			encoded := serveEncoded(t, p.svc, tc.opts...)
			for i := range 4 {
				resp := ask(t, encoded, request("sluice", 0, desc("tenant", tc.tenant, "class", "write"), desc("nobody", "x")))
				want := rlsv3.RateLimitResponse_OK
				if i == 3 {
					want = rlsv3.RateLimitResponse_OVER_LIMIT
				}
				if len(resp.GetStatuses()) != 2 {
					t.Fatalf("request %d: %d statuses, want 2: %v", i+1, len(resp.GetStatuses()), resp)
				}
				st, other := resp.GetStatuses()[0], resp.GetStatuses()[1]
				if resp.GetOverallCode() != want || st.GetCode() != want {
					t.Fatalf("request %d: %v, want %v", i+1, resp, want)
				}
				if !proto.Equal(other, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}) {
					t.Errorf("request %d: unmatched descriptor answered %v, want a bare OK", i+1, other)
				}
				if err := checkStatus(st, tinyWrite, 3*time.Minute); err != nil {
					t.Fatalf("request %d: %v", i+1, err)
				}
				if err := checkHeaders(resp, st, tinyWrite); err != nil {
					t.Fatalf("request %d: %v", i+1, err)
				}
				if _, err := checkFields(resp); err != nil {
					t.Fatalf("request %d: %v", i+1, err)
				}
			}
		})
	}
	if n := intercepted.Load(); n != 4 {
		t.Errorf("the interceptor saw %d calls, want 4", n)
	}
}

// TestEncodedInterceptorsDecide: on a server that answers in wire form, a
// unary interceptor still decides the call: its refusal reaches the
// caller and the handler never runs, and an answer of its own (a
// message) is sent as it is.
func TestEncodedInterceptorsDecide(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, testConfig)
	p := startProcess(t, rs, cfg, "envoy-intercepted", true)
	own := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}
	var handled atomic.Int64
	encoded := serveEncoded(t, p.svc, grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		switch req.(*rlsv3.RateLimitRequest).GetDomain() {
		case "refused":
			return nil, status.Error(codes.PermissionDenied, "not you")
		case "own":
			return own, nil
		}
		handled.Add(1)
		return h(ctx, req)
	}))
	ctx := t.Context()
	if _, err := encoded.ShouldRateLimit(ctx, request("refused", 0, desc("tenant", "small3", "class", "write"))); status.Code(err) != codes.PermissionDenied {
		t.Errorf("refused by the interceptor: %v, want PermissionDenied", err)
	}
	if resp, err := encoded.ShouldRateLimit(ctx, request("own", 0, desc("tenant", "small3", "class", "write"))); err != nil || !proto.Equal(resp, own) {
		t.Errorf("the interceptor's own answer arrived as %v (%v), want %v", resp, err, own)
	}
	if resp := ask(t, encoded, request("sluice", 0, desc("tenant", "small3", "class", "write"))); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("answer %v, want OK", resp)
	}
	if n := handled.Load(); n != 1 {
		t.Errorf("the handler ran for %d calls, want 1", n)
	}
}
