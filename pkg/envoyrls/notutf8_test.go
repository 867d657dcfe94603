package envoyrls_test

import (
	"context"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
)

// wireRequest is a RateLimitRequest already in wire form, sent as it is
// by bytesCodec: a Go client cannot marshal a string that is not UTF-8.
type wireRequest []byte

// bytesCodec sends wireRequests as they are and everything else with
// gRPC's proto codec.
type bytesCodec struct{ proto encoding.CodecV2 }

func (c bytesCodec) Marshal(v any) (mem.BufferSlice, error) {
	if w, ok := v.(wireRequest); ok {
		return mem.BufferSlice{mem.SliceBuffer(w)}, nil
	}
	return c.proto.Marshal(v)
}
func (c bytesCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }
func (c bytesCodec) Name() string                                { return c.proto.Name() }

// wireDescriptors encodes a request of domain sluice with one descriptor
// of (tenant, class) per pair, the strings as the bytes given.
func wireDescriptors(pairs ...[2]string) wireRequest {
	b := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "sluice")
	for _, p := range pairs {
		var d []byte
		for _, kv := range [][2]string{{"tenant", p[0]}, {"class", p[1]}} {
			e := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), kv[0])
			e = protowire.AppendString(protowire.AppendTag(e, 2, protowire.BytesType), kv[1])
			d = protowire.AppendBytes(protowire.AppendTag(d, 1, protowire.BytesType), e)
		}
		b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), d)
	}
	return b
}

// TestAHeaderThatIsNotUTF8IsDecidedAndCharged: a request with a
// descriptor whose value is not UTF-8 (a header of bytes from 0x80, which
// Envoy passes on as it came) is decided like any other by the regional
// endpoint, on a real daemon and redis-server: the value is a tenant of
// its own, charged, and the other descriptors of the request are charged
// and decide the answer. It was refused with Internal before the handler
// ran, uncharged, and Envoy lets a request through on an error by
// default: one such header skipped every limit of the request.
func TestAHeaderThatIsNotUTF8IsDecidedAndCharged(t *testing.T) {
	cfg := regiontest.MustConfig(t, testConfig)
	p := startProcess(t, redistest.Start(t), cfg, "not-utf8", true)
	conn, err := grpc.NewClient(p.daemon.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	codec := bytesCodec{proto: encoding.GetCodecV2("proto")}
	call := func(req wireRequest) *rlsv3.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp := new(rlsv3.RateLimitResponse)
		if err := conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, req, resp, grpc.ForceCodecV2(codec)); err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp
	}
	// small's write: burst 3 (tier tiny); caf\xe9 is a tenant of the
	// default tier (write: burst 100).
	req := wireDescriptors([2]string{"small", "write"}, [2]string{"caf\xe9", "write"})
	var lastRemaining uint32 = 100
	for i := range 4 {
		resp := call(req)
		want := rlsv3.RateLimitResponse_OK
		if i == 3 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != want || len(resp.Statuses) != 2 {
			t.Fatalf("call %d: %v with %d statuses, want %v with 2", i+1, resp.OverallCode, len(resp.Statuses), want)
		}
		other := resp.Statuses[1]
		if other.Code != rlsv3.RateLimitResponse_OK || other.LimitRemaining >= lastRemaining {
			t.Fatalf("call %d: the descriptor that is not UTF-8: %v, %d remaining after %d; want OK and charged",
				i+1, other.Code, other.LimitRemaining, lastRemaining)
		}
		lastRemaining = other.LimitRemaining
	}
}
