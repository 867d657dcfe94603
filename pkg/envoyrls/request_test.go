package envoyrls

import (
	"math/rand/v2"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// randomRequestWire is the wire form of a RateLimitRequest as a client
// might send it, or not quite: mostly the fields Envoy sends, in any
// order, repeated, empty or missing, and sometimes what requestBlock.read
// leaves to proto.Unmarshal (a descriptor's limit or hits_addend, unknown
// fields, a known field with another wire type, strings that are not
// UTF-8, bytes cut short).
func randomRequestWire(r *rand.Rand) []byte {
	str := func() string {
		s := []string{"", "acme", "read", "tenant", "class", "a:b", "é", "x*", "\xff", "\xc3"}[r.IntN(10)]
		if r.IntN(10) > 0 && (s == "\xff" || s == "\xc3") {
			return "fine" // invalid UTF-8 now and then, not in most requests
		}
		return s
	}
	odd := func(b []byte) []byte {
		switch r.IntN(100) {
		case 0:
			b = protowire.AppendTag(b, protowire.Number(5+r.IntN(20)), protowire.VarintType)
			return protowire.AppendVarint(b, r.Uint64N(300))
		case 1:
			b = protowire.AppendTag(b, protowire.Number(5+r.IntN(20)), protowire.BytesType)
			return protowire.AppendString(b, str())
		case 2:
			b = protowire.AppendTag(b, 1, protowire.VarintType) // a known number, another type
			return protowire.AppendVarint(b, 1)
		case 3:
			b = protowire.AppendTag(b, 2, protowire.Fixed32Type)
			return protowire.AppendFixed32(b, 7)
		}
		return b
	}
	entry := func() []byte {
		var e []byte
		for range r.IntN(4) {
			e = protowire.AppendTag(e, protowire.Number(1+r.IntN(2)), protowire.BytesType)
			e = protowire.AppendString(e, str())
		}
		return odd(e)
	}
	descriptor := func() []byte {
		var d []byte
		for range r.IntN(5) {
			switch r.IntN(40) {
			case 0:
				d = protowire.AppendTag(d, 4, protowire.VarintType) // is_negative_hits
				d = protowire.AppendVarint(d, r.Uint64N(3))
			case 1:
				d = protowire.AppendTag(d, 2, protowire.BytesType) // limit
				d = protowire.AppendBytes(d, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 5))
			case 2:
				d = protowire.AppendTag(d, 3, protowire.BytesType) // hits_addend
				d = protowire.AppendBytes(d, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), r.Uint64N(9)))
			default:
				d = protowire.AppendTag(d, 1, protowire.BytesType)
				d = protowire.AppendBytes(d, entry())
			}
		}
		return odd(d)
	}
	var b []byte
	for range r.IntN(7) {
		switch r.IntN(6) {
		case 0, 1:
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendString(b, str())
		case 2:
			b = protowire.AppendTag(b, 3, protowire.VarintType)
			b = protowire.AppendVarint(b, []uint64{0, 1, 7, 1 << 32, 1<<32 + 5, r.Uint64()}[r.IntN(6)])
		default:
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendBytes(b, descriptor())
		}
	}
	b = odd(b)
	if len(b) > 0 && r.IntN(30) == 0 {
		b = b[:r.IntN(len(b))]
	}
	return b
}

// TestReadRequestIsProtoUnmarshal: what the Service's codec reads into a
// requestBlock is the message proto.Unmarshal makes of the same bytes
// (or the same error, unless all it refused was a string that is not
// UTF-8: checkCodecIsLenientUnmarshal), for 30,000 random requests; requestBlock.read
// itself reads most of them (the rest it leaves to proto.Unmarshal, and
// leaves the block untouched), and what it read does not change when the
// bytes it was read from are reused.
func TestReadRequestIsProtoUnmarshal(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	c := newAnswerCodec()
	read, cases := 0, 30000
	for i := range cases {
		data := randomRequestWire(r)
		want := new(rlsv3.RateLimitRequest)
		wantErr := proto.Unmarshal(data, want)
		checkCodecIsLenientUnmarshal(t, c, data)

		own := new(requestBlock)
		if !own.read(data) {
			if !proto.Equal(&own.req, new(rlsv3.RateLimitRequest)) || own.desc[0].Entries != nil || own.ent[0].Key != "" {
				t.Fatalf("request %d (% x): read refused it but changed the block: %v", i, data, &own.req)
			}
			continue
		}
		read++
		if wantErr != nil {
			t.Fatalf("request %d (% x): read it, proto.Unmarshal refused it: %v", i, data, wantErr)
		}
		for j := range data {
			data[j] = 0xee
		}
		if !proto.Equal(&own.req, want) {
			t.Fatalf("request %d: read %v, proto.Unmarshal %v (after its bytes were reused)", i, &own.req, want)
		}
	}
	if read < cases/2 {
		t.Errorf("read itself %d of %d requests; the generator should mostly make requests of the shape Envoy sends", read, cases)
	}
}

// TestReadRequestAllocatesTwice: the common request (one descriptor of
// two entries) is read in two allocations, the block and one copy of its
// bytes, where proto.Unmarshal needs a dozen.
func TestReadRequestAllocatesTwice(t *testing.T) {
	var d []byte
	for _, kv := range [][2]string{{"tenant", "acme"}, {"class", "read"}} {
		var e []byte
		e = protowire.AppendString(protowire.AppendTag(e, 1, protowire.BytesType), kv[0])
		e = protowire.AppendString(protowire.AppendTag(e, 2, protowire.BytesType), kv[1])
		d = protowire.AppendBytes(protowire.AppendTag(d, 1, protowire.BytesType), e)
	}
	data := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "sluice")
	data = protowire.AppendBytes(protowire.AppendTag(data, 2, protowire.BytesType), d)
	var rb *requestBlock
	n := testing.AllocsPerRun(100, func() {
		rb = new(requestBlock)
		if !rb.read(data) {
			t.Fatal("the common request was left to proto.Unmarshal")
		}
	})
	if n != 2 {
		t.Errorf("reading the common request: %v allocations, want 2", n)
	}
	if got := rb.req.GetDescriptors()[0].GetEntries()[1].GetValue(); rb.req.GetDomain() != "sluice" || got != "read" {
		t.Errorf("read %v", &rb.req)
	}
}

// FuzzReadRequest: for any bytes, the Service's codec reads the message
// proto.Unmarshal makes of them, or fails as it does, except that a
// string that is not UTF-8 is read as its bytes
// (checkCodecIsLenientUnmarshal).
func FuzzReadRequest(f *testing.F) {
	r := rand.New(rand.NewPCG(13, 14))
	for range 20 {
		f.Add(randomRequestWire(r))
	}
	c := newAnswerCodec()
	f.Fuzz(func(t *testing.T, data []byte) { checkCodecIsLenientUnmarshal(t, c, data) })
}

// TestReadRequestKnownFieldOtherType: a request of the shape Envoy sends
// (with is_negative_hits too) is read by read itself; a known field number
// with another wire type than its own (the domain or descriptors as a
// varint, hits_addend as bytes, a descriptor's entries or
// is_negative_hits, an entry's key) or bytes cut short inside a
// descriptor or an entry is not: read leaves such a request to
// proto.Unmarshal, and the codec's message or error is proto.Unmarshal's.
func TestReadRequestKnownFieldOtherType(t *testing.T) {
	// The fields of another type carry a varint of 0 or empty bytes, which
	// a reader that ignored the wire type would take for its own type.
	tagged := func(num protowire.Number, typ protowire.Type, v []byte) []byte {
		b := protowire.AppendTag(nil, num, typ)
		if typ == protowire.VarintType {
			return protowire.AppendVarint(b, uint64(len(v)))
		}
		return protowire.AppendBytes(b, v)
	}
	one := []byte{1} // a varint of 1
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	entry := cat(tagged(1, protowire.BytesType, []byte("tenant")), tagged(2, protowire.BytesType, []byte("acme")))
	desc := tagged(1, protowire.BytesType, entry)
	domain := tagged(1, protowire.BytesType, []byte("sluice"))
	descs := func(payload []byte) []byte { return cat(domain, tagged(2, protowire.BytesType, payload)) }
	c := newAnswerCodec()
	for _, tc := range []struct {
		name     string
		data     []byte
		readable bool
	}{
		{"as Envoy sends it", cat(descs(desc), tagged(3, protowire.VarintType, one)), true},
		{"with is_negative_hits", descs(cat(desc, tagged(4, protowire.VarintType, one))), true},
		{"the domain as a varint", cat(tagged(1, protowire.VarintType, nil), tagged(2, protowire.BytesType, desc)), false},
		{"descriptors as a varint", cat(domain, tagged(2, protowire.VarintType, nil)), false},
		{"hits_addend as bytes", cat(domain, tagged(3, protowire.BytesType, desc)), false},
		{"descriptor's entries as a varint", descs(tagged(1, protowire.VarintType, nil)), false},
		{"is_negative_hits as bytes", descs(cat(desc, tagged(4, protowire.BytesType, nil))), false},
		{"an entry's key as a varint", descs(tagged(1, protowire.BytesType, tagged(1, protowire.VarintType, nil))), false},
		{"a descriptor's tag cut short", descs([]byte{0x80}), false},
		{"a descriptor's last byte stray", descs(cat(desc, []byte{0x08})), false},
		{"is_negative_hits cut short", descs(cat(desc, []byte{0x20})), false},
		{"an entry cut short", descs(cat([]byte{0x0a, 0x05}, entry[:2])), false},
		{"an entry's last byte stray", descs(tagged(1, protowire.BytesType, cat(entry, []byte{0x0a}))), false},
	} {
		want := new(rlsv3.RateLimitRequest)
		wantErr := proto.Unmarshal(tc.data, want)
		if tc.readable && wantErr != nil {
			t.Fatalf("%s: proto.Unmarshal: %v", tc.name, wantErr)
		}
		own := new(requestBlock)
		switch ok := own.read(tc.data); {
		case ok != tc.readable:
			t.Errorf("%s: read says %v, want %v (read %v; proto.Unmarshal makes %v, error %v)", tc.name, ok, tc.readable, &own.req, want, wantErr)
		case ok && !proto.Equal(&own.req, want):
			t.Errorf("%s: read %v, proto.Unmarshal %v", tc.name, &own.req, want)
		}
		rb := new(requestBlock)
		err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.data)}, rb)
		if (err != nil) != (wantErr != nil) || (err == nil && !proto.Equal(&rb.req, want)) {
			t.Errorf("%s: codec read %v (error %v), proto.Unmarshal %v (error %v)", tc.name, &rb.req, err, want, wantErr)
		}
	}
}
