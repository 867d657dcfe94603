package envoyrls

import (
	"math/rand/v2"
	"testing"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// bytesMirror is RateLimitRequest with every string field a bytes field,
// the same numbers and types otherwise: proto.Unmarshal reads into it
// what it reads into RateLimitRequest, strings that are not UTF-8
// included. It is the reference readLenient is checked against.
var bytesMirror = func() protoreflect.MessageDescriptor {
	f := func(name string, num int32, typ descriptorpb.FieldDescriptorProto_Type, label descriptorpb.FieldDescriptorProto_Label, msg string) *descriptorpb.FieldDescriptorProto {
		fd := &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(num), Type: typ.Enum(), Label: label.Enum(), JsonName: proto.String(name)}
		if msg != "" {
			fd.TypeName = proto.String(".mirror." + msg)
		}
		return fd
	}
	const (
		opt = descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL
		rep = descriptorpb.FieldDescriptorProto_LABEL_REPEATED
		by  = descriptorpb.FieldDescriptorProto_TYPE_BYTES
		u32 = descriptorpb.FieldDescriptorProto_TYPE_UINT32
		u64 = descriptorpb.FieldDescriptorProto_TYPE_UINT64
		i32 = descriptorpb.FieldDescriptorProto_TYPE_INT32 // an open enum reads as int32
		bo  = descriptorpb.FieldDescriptorProto_TYPE_BOOL
		msg = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
	)
	m := func(name string, fields ...*descriptorpb.FieldDescriptorProto) *descriptorpb.DescriptorProto {
		return &descriptorpb.DescriptorProto{Name: proto.String(name), Field: fields}
	}
	fdp := &descriptorpb.FileDescriptorProto{
		Name: proto.String("mirror.proto"), Package: proto.String("mirror"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			m("Request", f("domain", 1, by, opt, ""), f("descriptors", 2, msg, rep, "Descriptor"), f("hits_addend", 3, u32, opt, "")),
			m("Descriptor", f("entries", 1, msg, rep, "Entry"), f("limit", 2, msg, opt, "Override"), f("hits_addend", 3, msg, opt, "U64"), f("is_negative_hits", 4, bo, opt, "")),
			m("Entry", f("key", 1, by, opt, ""), f("value", 2, by, opt, "")),
			m("Override", f("requests_per_unit", 1, u32, opt, ""), f("unit", 2, i32, opt, ""), f("unit_multiplier", 3, msg, opt, "U32")),
			m("U64", f("value", 1, u64, opt, "")),
			m("U32", f("value", 1, u32, opt, "")),
		},
	}
	file, err := protodesc.NewFile(fdp, nil)
	if err != nil {
		panic(err)
	}
	return file.Messages().ByName("Request")
}()

// readMirror reads data with proto.Unmarshal into bytesMirror and builds
// the RateLimitRequest it stands for.
func readMirror(data []byte) (*rlsv3.RateLimitRequest, error) {
	m := dynamicpb.NewMessage(bytesMirror)
	if err := proto.Unmarshal(data, m); err != nil {
		return nil, err
	}
	get := func(m protoreflect.Message, name string) protoreflect.Value {
		return m.Get(m.Descriptor().Fields().ByName(protoreflect.Name(name)))
	}
	has := func(m protoreflect.Message, name string) bool {
		return m.Has(m.Descriptor().Fields().ByName(protoreflect.Name(name)))
	}
	r := &rlsv3.RateLimitRequest{Domain: string(get(m, "domain").Bytes()), HitsAddend: uint32(get(m, "hits_addend").Uint())}
	ds := get(m, "descriptors").List()
	for i := range ds.Len() {
		dm := ds.Get(i).Message()
		d := &ratelimitv3.RateLimitDescriptor{IsNegativeHits: get(dm, "is_negative_hits").Bool()}
		es := get(dm, "entries").List()
		for j := range es.Len() {
			em := es.Get(j).Message()
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: string(get(em, "key").Bytes()), Value: string(get(em, "value").Bytes())})
		}
		// The limit and hits_addend hold no string: their bytes again,
		// unknown fields and all, are read by proto.Unmarshal.
		if has(dm, "limit") {
			d.Limit = new(ratelimitv3.RateLimitDescriptor_RateLimitOverride)
			if err := reread(get(dm, "limit").Message(), d.Limit); err != nil {
				return nil, err
			}
		}
		if has(dm, "hits_addend") {
			d.HitsAddend = new(wrapperspb.UInt64Value)
			if err := reread(get(dm, "hits_addend").Message(), d.HitsAddend); err != nil {
				return nil, err
			}
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r, nil
}

// reread encodes the mirror's message m and reads it into dst.
func reread(m protoreflect.Message, dst proto.Message) error {
	b, err := proto.Marshal(m.Interface())
	if err != nil {
		return err
	}
	return proto.Unmarshal(b, dst)
}

// utf8Strings says whether every string of r is UTF-8.
func utf8Strings(r *rlsv3.RateLimitRequest) bool {
	if !utf8.ValidString(r.Domain) {
		return false
	}
	for _, d := range r.Descriptors {
		for _, e := range d.Entries {
			if !utf8.ValidString(e.Key) || !utf8.ValidString(e.Value) {
				return false
			}
		}
	}
	return true
}

// checkCodecIsLenientUnmarshal checks what the Service's codec reads of
// data against proto.Unmarshal and the bytes mirror: proto.Unmarshal's
// message whenever it reads one; otherwise the mirror's message when the
// mirror reads one (what proto.Unmarshal refused was a string that is not
// UTF-8, perhaps one a later field replaced), and an error when the
// mirror fails too.
func checkCodecIsLenientUnmarshal(t *testing.T, c answerCodec, data []byte) {
	t.Helper()
	want := new(rlsv3.RateLimitRequest)
	wantErr := proto.Unmarshal(data, want)
	mirror, mirrorErr := readMirror(data)
	rb := new(requestBlock)
	err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, rb)
	switch {
	case wantErr == nil:
		if err != nil || !proto.Equal(&rb.req, want) {
			t.Fatalf("% x: codec read %v (%v), proto.Unmarshal %v", data, &rb.req, err, want)
		}
	case mirrorErr == nil:
		if err != nil || !proto.Equal(&rb.req, mirror) {
			t.Fatalf("% x: codec read %v (%v), want %v with its strings as their bytes (proto.Unmarshal: %v)", data, &rb.req, err, mirror, wantErr)
		}
	default:
		if err == nil {
			t.Fatalf("% x: codec read %v, proto.Unmarshal refused it (%v), the mirror read %v (%v)", data, &rb.req, wantErr, mirror, mirrorErr)
		}
	}
}

// TestCodecReadsStringsThatAreNotUTF8: a request whose domain, entry key
// or value is not UTF-8 (a header of bytes from 0x80, carried by Envoy as
// it came) is read with those bytes, as proto.Unmarshal reads the rest:
// it was refused before the handler ran (Internal), which Envoy lets
// through by default, unlimited. 30,000 random requests, some with a
// descriptor's limit and hits_addend.
func TestCodecReadsStringsThatAreNotUTF8(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	c := newAnswerCodec()
	lenient := 0
	for range 30000 {
		data := randomRequestWire(r)
		if proto.Unmarshal(data, new(rlsv3.RateLimitRequest)) != nil {
			if m, err := readMirror(data); err == nil && !utf8Strings(m) {
				lenient++
			}
		}
		checkCodecIsLenientUnmarshal(t, c, data)
	}
	if lenient < 100 {
		t.Errorf("only %d requests had strings that are not UTF-8; the generator should make more", lenient)
	}
}
