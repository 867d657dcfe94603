package envoyrls

import (
	"bytes"
	"context"
	"math"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec answerCodec defers to
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// ServerOptions are the options of a gRPC server that serves a Service
// with RegisterEncoded: its codec sends the answers the handler encoded
// itself, reads the handler's requests itself when they have the shape
// Envoy sends (the message proto.Unmarshal would make, in a block reused
// from call to call and one allocation for its strings, instead of a
// dozen allocations), and reads and writes every other message with
// gRPC's own "proto" codec.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodecV2(newAnswerCodec())}
}

// RegisterEncoded serves svc on g like Register, but answers in wire
// form: the handler writes the RateLimitResponse's bytes straight from
// its decisions, with the parts shared by every answer about a limit
// encoded once, instead of building the message for gRPC to encode. The
// bytes are the ones proto.Marshal writes for the message ShouldRateLimit
// returns (TestEncodedAnswerIsTheMessage). g must have been built with
// ServerOptions.
//
// Unary interceptors on g (authorization, bounds) run as with Register:
// they are given the request as a message and may refuse it, or answer
// with a message of their own. The answer they get from the handler is
// its wire form, a value they must pass on as it is: use Register on a
// server whose interceptors read answers. The request message, and the
// descriptors and entries it points to, are reused for another call once
// the call returns: interceptors and stats handlers must not keep them
// past it (the strings in them they may).
func RegisterEncoded(g *grpc.Server, svc *Service) {
	g.RegisterService(&encodedServiceDesc, svc)
}

var encodedServiceDesc = grpc.ServiceDesc{
	ServiceName: rlsv3.RateLimitService_ServiceDesc.ServiceName,
	HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: shouldRateLimitEncoded}},
	Streams:     []grpc.StreamDesc{},
	Metadata:    rlsv3.RateLimitService_ServiceDesc.Metadata,
}

func shouldRateLimitEncoded(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	rb := requestBlocks.Get().(*requestBlock)
	defer rb.release()
	if err := dec(rb); err != nil {
		return nil, err
	}
	in := &rb.req
	s := srv.(*Service)
	if interceptor != nil {
		return interceptor(ctx, in, s.encoded.info, s.encoded.handler)
	}
	return s.answerEncoded(ctx, in)
}

// encodedCall is what shouldRateLimitEncoded hands a server's
// interceptors, built once per Service rather than per call.
type encodedCall struct {
	info    *grpc.UnaryServerInfo
	handler grpc.UnaryHandler
}

func (s *Service) initEncoded() {
	s.encoded.info = &grpc.UnaryServerInfo{Server: s, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	s.encoded.handler = func(ctx context.Context, req any) (any, error) {
		return s.answerEncoded(ctx, req.(*rlsv3.RateLimitRequest))
	}
}

// answerEncoded is shouldRateLimitEncoded's answer as a handler returns
// it: nil with an error.
func (s *Service) answerEncoded(ctx context.Context, req *rlsv3.RateLimitRequest) (any, error) {
	resp, err := s.shouldRateLimitEncoded(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// wireAnswer is an answer in wire form: a RateLimitResponse's bytes, in
// a buffer of answerBuffers that gRPC gives back once it has sent them
// (answerCodec.Marshal). An answer never sent is left to the collector.
// Its one field is a pointer, so that a wireAnswer is handed to gRPC as
// an interface value without an allocation.
type wireAnswer struct{ buf *[]byte }

// bytes are the answer's bytes.
func (w wireAnswer) bytes() []byte { return *w.buf }

// answerBufferSize is the room of a new answer buffer: an answer about a
// few descriptors, with its headers, takes a few hundred bytes. It is
// above mem's pooling threshold (1 KiB), below which gRPC would keep a
// buffer as its own instead of giving it back.
const answerBufferSize = 2048

// maxKeptAnswerBuffer: a buffer an answer of many descriptors grew beyond
// this is not kept for another answer.
const maxKeptAnswerBuffer = 64 << 10

// answerPool is the mem.BufferPool of answer buffers.
type answerPool struct{ free sync.Pool }

var answerBuffers = &answerPool{free: sync.Pool{New: func() any {
	b := make([]byte, 0, answerBufferSize)
	return &b
}}}

// Get returns a buffer of length bytes.
func (p *answerPool) Get(length int) *[]byte {
	b := p.free.Get().(*[]byte)
	if cap(*b) < length {
		*b = make([]byte, length, max(length, answerBufferSize))
	}
	*b = (*b)[:length]
	return b
}

// Put takes back a buffer nothing reads any more.
func (p *answerPool) Put(b *[]byte) {
	if cap(*b) > maxKeptAnswerBuffer {
		return
	}
	*b = (*b)[:0]
	p.free.Put(b)
}

// answerCodec is gRPC's proto codec that also sends wireAnswers and
// reads requestBlocks.
type answerCodec struct{ proto encoding.CodecV2 }

func newAnswerCodec() answerCodec {
	c := encoding.GetCodecV2("proto")
	if c == nil {
		panic("envoyrls: gRPC's proto codec is not registered")
	}
	return answerCodec{proto: c}
}

func (c answerCodec) Marshal(v any) (mem.BufferSlice, error) {
	if w, ok := v.(wireAnswer); ok {
		// gRPC frees the slice once the answer is written out, and the
		// buffer goes back to answerBuffers.
		return mem.BufferSlice{mem.NewBuffer(w.buf, answerBuffers)}, nil
	}
	return c.proto.Marshal(v)
}

// Unmarshal reads the requests of RegisterEncoded's handler itself when
// it can (requestBlock.read), every other message with gRPC's codec.
func (c answerCodec) Unmarshal(data mem.BufferSlice, v any) error {
	rb, ok := v.(*requestBlock)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	var read bool
	if len(data) == 1 {
		read = rb.read(data[0].ReadOnlyData())
	} else {
		read = rb.read(data.Materialize())
	}
	if read {
		return nil
	}
	err := c.proto.Unmarshal(data, &rb.req)
	if err == nil {
		return nil
	}
	// A string that is not UTF-8 (readLenient); anything proto.Unmarshal
	// refuses for another reason readLenient refuses too.
	rb.req = rlsv3.RateLimitRequest{}
	if readLenient(data.Materialize(), &rb.req) != nil {
		return err
	}
	return nil
}

func (c answerCodec) Name() string { return c.proto.Name() }

// respondWire is respond in wire form: the same message, encoded as
// proto.Marshal encodes it (fields in number order, zero scalars and
// empty strings left out, a set message written even when empty).
func (s *Service) respondWire(targets []Target, decisions []decided) (wireAnswer, outcome) {
	v := judge(targets, decisions)
	buf := answerBuffers.Get(0)
	b := appendEnum(*buf, 1, int32(v.code()))
	for i, t := range targets {
		switch {
		case t.Unlimited:
			b = appendPlainStatus(b, math.MaxUint32)
		case !t.Matched:
			b = appendPlainStatus(b, 0)
		default:
			b = appendDecidedStatus(b, decisions[i], sharedFor(decisions[i], t.Resolved.ClassName))
		}
	}
	if s.headers && v.haveShown {
		b = appendHeaders(b, v.shown, sharedFor(v.shown, v.shownClass), v.out == outcomeOverLimit, v.never, v.retry)
	}
	*buf = b
	return wireAnswer{buf}, v.out
}

// appendPlainStatus appends a statuses entry that is OK with remaining
// and nothing else (an unlimited or unmatched descriptor's).
func appendPlainStatus(b []byte, remaining uint32) []byte {
	ok := int32(rlsv3.RateLimitResponse_OK)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(enumSize(ok)+uintSize(uint64(remaining))))
	b = appendEnum(b, 1, ok)
	return appendUint(b, 3, uint64(remaining))
}

// appendDecidedStatus appends the statuses entry statusBlock.fill makes.
func appendDecidedStatus(b []byte, dd decided, sh *shared) []byte {
	code := int32(rlsv3.RateLimitResponse_OK)
	if dd.result == resultOverLimit {
		code = int32(rlsv3.RateLimitResponse_OVER_LIMIT)
	}
	size := enumSize(code) + len(sh.rlWire) + uintSize(uint64(dd.remaining))
	var secs int64
	var nanos int32
	durSize := 0
	if !dd.never {
		// As durationpb.New.
		n := dd.reset.Nanoseconds()
		secs = n / 1e9
		nanos = int32(n - secs*1e9)
		durSize = uintSize(uint64(secs)) + enumSize(nanos)
		size += 1 + protowire.SizeVarint(uint64(durSize)) + durSize
	}
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = appendEnum(b, 1, code)
	b = append(b, sh.rlWire...)
	b = appendUint(b, 3, uint64(dd.remaining))
	if !dd.never {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(durSize))
		b = appendUint(b, 1, uint64(secs))
		b = appendEnum(b, 2, nanos)
	}
	return b
}

// appendHeaders appends the response_headers_to_add entries
// headerBlock.build makes, in its order.
func appendHeaders(b []byte, shown decided, sh *shared, overLimit, never bool, retry time.Duration) []byte {
	t, timed := headerTime(shown, overLimit, never, retry)
	var scratch [96]byte
	own, remainingEnd := appendOwnValues(scratch[:0], shown, sh, t, timed)
	b = append(b, sh.hLimitWire...)
	b = appendHeaderField(b, HeaderRemaining, own[:remainingEnd])
	b = append(b, sh.hPolicyWire...)
	b = appendHeaderField(b, HeaderRateLimit, own[remainingEnd:])
	if !timed {
		return b
	}
	if t < int64(len(timeHeadersWire)) {
		b = append(b, timeHeadersWire[t][0]...)
		if overLimit {
			b = append(b, timeHeadersWire[t][1]...)
		}
		return b
	}
	ts := own[bytes.LastIndexByte(own, '=')+1:] // RateLimit's t
	b = appendHeaderField(b, HeaderReset, ts)
	if overLimit {
		b = appendHeaderField(b, HeaderRetryAfter, ts)
	}
	return b
}

// appendRateLimitField appends rl as a DescriptorStatus's current_limit.
func appendRateLimitField(b []byte, rl *rlsv3.RateLimitResponse_RateLimit) []byte {
	size := uintSize(uint64(rl.RequestsPerUnit)) + enumSize(int32(rl.Unit)) + stringSize(rl.Name)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(size))
	b = appendUint(b, 1, uint64(rl.RequestsPerUnit))
	b = appendEnum(b, 2, int32(rl.Unit))
	return appendString(b, 3, rl.Name)
}

// appendHeaderField appends a HeaderValue of key and value as a
// response_headers_to_add entry.
func appendHeaderField[V string | []byte](b []byte, key string, value V) []byte {
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(stringSize(key)+stringSize(value)))
	b = appendString(b, 1, key)
	return appendString(b, 2, value)
}

// A tag is one byte: every field number written here is below 16.
const tagSize = 1

func uintSize(v uint64) int {
	if v == 0 {
		return 0
	}
	return tagSize + protowire.SizeVarint(v)
}

// enumSize is also int32's: a negative value is sign-extended to ten
// bytes.
func enumSize(v int32) int { return uintSize(uint64(int64(v))) }

func stringSize[V string | []byte](s V) int {
	if len(s) == 0 {
		return 0
	}
	return tagSize + protowire.SizeBytes(len(s))
}

func appendUint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendEnum(b []byte, num protowire.Number, v int32) []byte {
	return appendUint(b, num, uint64(int64(v)))
}

func appendString[V string | []byte](b []byte, num protowire.Number, s V) []byte {
	if len(s) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(s)))
	return append(b, s...)
}
