package envoyrls

import (
	"bytes"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// randomRequest is the targets and decisions of a request of one to
// three descriptors, matched (over limit or not, shadow or not, never or
// not), unlimited or unmatched, over random limits and class names.
func randomRequest(r *rand.Rand, caches map[string]*classCounters) ([]Target, []decided) {
	classes := []string{"read", "a", "write.bulk:x@y-z_1", `we"ird\cl` + "\x01ass\u00e9", ""}
	durations := []time.Duration{0, 1, time.Millisecond, 999 * time.Millisecond, time.Second, 1500 * time.Millisecond,
		119 * time.Second, 121 * time.Second, 3 * time.Hour, -time.Second, 1 << 62}
	n := 1 + r.IntN(3)
	targets, decisions := make([]Target, n), make([]decided, n)
	for i := range n {
		switch r.IntN(6) {
		case 0:
			targets[i] = Target{Unlimited: true}
			continue
		case 1:
			continue // unmatched
		}
		class := classes[r.IntN(len(classes))]
		targets[i] = Target{Matched: true, Shadow: r.IntN(4) == 0, Resolved: config.Resolved{ClassName: class}}
		dd := decided{
			limit:     quota.Limit{Rate: []float64{0, 0.1, 1, 2.5, 100, 1e9, 5e9}[r.IntN(7)], Burst: []int64{0, 1, 5, 100, 1e9, math.MaxInt64}[r.IntN(6)]},
			result:    result(r.IntN(int(numResults))),
			cap:       []int64{0, 3, 1e9, math.MaxInt64}[r.IntN(4)],
			remaining: []uint32{0, 1, 99, 128, math.MaxUint32}[r.IntN(5)],
			reset:     durations[r.IntN(len(durations))],
			retry:     durations[r.IntN(len(durations))],
			never:     r.IntN(5) == 0,
		}
		if r.IntN(8) != 0 {
			dd.cache = caches[class]
		}
		decisions[i] = dd
	}
	return targets, decisions
}

// TestEncodedAnswerIsTheMessage: over random requests, with and without
// headers, the answer the handler encodes itself is byte for byte
// proto.Marshal of the message ShouldRateLimit answers with, and the
// codec sends it as it is.
func TestEncodedAnswerIsTheMessage(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	caches := map[string]*classCounters{}
	for _, c := range []string{"read", "a", "write.bulk:x@y-z_1", `we"ird\cl` + "\x01ass\u00e9", ""} {
		caches[c] = &classCounters{class: c}
	}
	codec := newAnswerCodec()
	for i := range 10000 {
		s := &Service{headers: i%4 != 0}
		targets, decisions := randomRequest(r, caches)
		resp, out := s.respond(targets, decisions)
		want, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		got, wireOut := s.respondWire(targets, decisions)
		if !bytes.Equal(got.bytes(), want) || wireOut != out {
			var back rlsv3.RateLimitResponse
			err := proto.Unmarshal(got.bytes(), &back)
			t.Fatalf("case %d: outcome %v, want %v\nencoded %v (%v)\nwant    %v\n% x\n% x", i, wireOut, out, &back, err, resp, got.bytes(), want)
		}
		data, err := codec.Marshal(got)
		if err != nil || !bytes.Equal(data.Materialize(), want) {
			t.Fatalf("case %d: the codec sent % x (%v), want % x", i, data.Materialize(), err, want)
		}
		data.Free() // as gRPC does once sent: the next answers reuse the buffer
	}
}

// TestAnswerCodecDefers: every message other than an encoded answer is
// read and written by gRPC's proto codec.
func TestAnswerCodecDefers(t *testing.T) {
	c := newAnswerCodec()
	req := &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 3}
	data, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(req)
	if !bytes.Equal(data.Materialize(), want) {
		t.Errorf("encoded % x, want % x", data.Materialize(), want)
	}
	var back rlsv3.RateLimitRequest
	if err := c.Unmarshal(data, &back); err != nil || !proto.Equal(&back, req) {
		t.Errorf("read back %v (%v), want %v", &back, err, req)
	}
	if _, err := c.Marshal("not a message"); err == nil {
		t.Error("a value that is no message was encoded")
	}
	if c.Name() != "proto" {
		t.Errorf("codec name %q, want proto", c.Name())
	}
}

// TestEncodedAnswerAllocatesOnce: an answer in wire form, encoded and
// sent, is one allocation (the one-buffer slice the codec hands gRPC)
// once its class's shared parts are built, against the message's two and
// gRPC's encoding of it: its bytes are written into a buffer that comes
// back once gRPC has sent them.
func TestEncodedAnswerAllocatesOnce(t *testing.T) {
	s := &Service{headers: true}
	targets := []Target{{Matched: true, Resolved: config.Resolved{ClassName: "read"}}}
	decisions := []decided{{limit: quota.Limit{Rate: 100, Burst: 200}, cap: 150, remaining: 7, reset: time.Second, cache: &classCounters{class: "read"}}}
	codec := newAnswerCodec()
	send := func() {
		w, _ := s.respondWire(targets, decisions)
		data, err := codec.Marshal(w)
		if err != nil {
			t.Fatal(err)
		}
		data.Free() // as gRPC does once sent
	}
	send()
	// A collection during the count empties the buffer pool, and the
	// answer after it allocates its buffer anew: not what one answer costs
	// in steady state. The count runs with the collector off (a busy
	// machine ran one in the middle of it).
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// Under -race sync.Pool drops a quarter of its buffers at random (by
	// design), so an answer sometimes allocates its buffer anew: up to two
	// there, exactly one without it (go test ./pkg/envoyrls -run
	// TestEncodedAnswerAllocatesOnce; BenchmarkAnswer).
	want := 1.0
	if raceDetector {
		want = 2
	}
	if n := testing.AllocsPerRun(100, send); n > want || n < 1 {
		t.Errorf("respondWire and Marshal: %v allocations, want 1 (at most %v under -race)", n, want)
	}
}

// BenchmarkAnswer: one answer with its headers built as a message and
// encoded by gRPC's proto codec, and encoded by the handler itself.
func BenchmarkAnswer(b *testing.B) {
	s := &Service{headers: true}
	targets := []Target{{Matched: true, Resolved: config.Resolved{ClassName: "read"}}}
	decisions := []decided{{limit: quota.Limit{Rate: 100, Burst: 200}, cap: 150, remaining: 7, reset: time.Second, cache: &classCounters{class: "read"}}}
	codec := newAnswerCodec()
	b.Run("message", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			resp, _ := s.respond(targets, decisions)
			data, err := codec.Marshal(resp)
			if err != nil {
				b.Fatal(err)
			}
			data.Free()
		}
	})
	b.Run("encoded", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			w, _ := s.respondWire(targets, decisions)
			data, err := codec.Marshal(w)
			if err != nil {
				b.Fatal(err)
			}
			data.Free()
		}
	})
}

// BenchmarkDecodeAnswer is what reading an answer costs its caller (Envoy,
// or a Go client such as BenchmarkRLS's load generator): an answer with
// the rate-limit headers, one without, and the stateless server's bare OK.
func BenchmarkDecodeAnswer(b *testing.B) {
	targets := []Target{{Matched: true, Resolved: config.Resolved{ClassName: "read"}}}
	decisions := []decided{{limit: quota.Limit{Rate: 100, Burst: 200}, cap: 150, remaining: 7, reset: time.Second, cache: &classCounters{class: "read"}}}
	answer := func(headers bool) []byte {
		resp, _ := (&Service{headers: headers}).respond(targets, decisions)
		data, err := proto.Marshal(resp)
		if err != nil {
			b.Fatal(err)
		}
		return data
	}
	bare, err := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		data []byte
	}{{"headers", answer(true)}, {"noheaders", answer(false)}, {"stateless", bare}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.data)))
			for range b.N {
				if err := proto.Unmarshal(c.data, new(rlsv3.RateLimitResponse)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
