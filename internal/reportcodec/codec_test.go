package reportcodec

import (
	"fmt"
	"math"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// sameAsProto decodes b both ways and fails t unless they agree: both
// fail, or both succeed with equal messages that marshal to equal bytes.
func sameAsProto(t interface {
	Helper()
	Fatalf(string, ...any)
}, b []byte) (fast bool) {
	t.Helper()
	got, want := new(sluicev1.RegionReport), new(sluicev1.RegionReport)
	fast = decodeReport(b, new(sluicev1.RegionReport))
	gotErr, wantErr := Unmarshal(b, got), proto.Unmarshal(b, want)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("Unmarshal: %v, proto.Unmarshal: %v (input %x)", gotErr, wantErr, b)
	}
	if wantErr != nil {
		if fast {
			t.Fatalf("the fast path took input proto refuses (%v): %x", wantErr, b)
		}
		return fast
	}
	if !proto.Equal(got, want) {
		t.Fatalf("decoded differently from proto\n got: %v\nwant: %v\ninput %x", got, want, b)
	}
	opts := proto.MarshalOptions{Deterministic: true}
	gb, err1 := opts.Marshal(got)
	wb, err2 := opts.Marshal(want)
	if err1 != nil || err2 != nil || string(gb) != string(wb) {
		t.Fatalf("re-marshalled differently (%v, %v):\n got %x\nwant %x", err1, err2, gb, wb)
	}
	return fast
}

func demand(tenant, class string, i int) *sluicev1.KeyDemand {
	kd := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: tenant, Class: class},
		Admitted: int64(100 * i), Denied: int64(i), WindowMs: 1000, HeldRate: 12.5 * float64(i),
		HeldBurst: 30, HeldValidMs: int64(4000 + i), Holding: 7.25}
	if i%2 == 0 {
		kd.DemandRate = proto.Float64(float64(i) / 3)
	}
	return kd
}

func sampleReport(keys int) *sluicev1.RegionReport {
	r := &sluicev1.RegionReport{Region: "eu-west", Seq: 1764633600123456, ConfigRevisions: []int64{7, 9},
		StaticValidMs: 12000, Page: 1, Pages: 3, AnswerPage: 2, Shard: proto.Uint32(2)}
	for i := range keys {
		r.Keys = append(r.Keys, demand(fmt.Sprintf("tenant-%06d", i), []string{"read", "write", "bulk"}[i%3], i))
	}
	return r
}

func mustMarshal(t interface{ Fatal(...any) }, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestReportsTakeTheFastPath(t *testing.T) {
	for _, r := range []*sluicev1.RegionReport{
		{},
		{Region: "us-east"},
		sampleReport(1),
		sampleReport(50),
		{Region: "x", Keys: []*sluicev1.KeyDemand{{}}},                          // a key with nothing set
		{Region: "x", Keys: []*sluicev1.KeyDemand{{Key: &sluicev1.QuotaKey{}}}}, // an empty key, present
		{Region: "x", Keys: []*sluicev1.KeyDemand{{Key: &sluicev1.QuotaKey{Tenant: "t"}, DemandRate: proto.Float64(0)}}},
		{Region: "x", ConfigRevisions: []int64{-1, math.MaxInt64, math.MinInt64}, StaticValidMs: -5},
		{Region: "x", Shard: proto.Uint32(0)}, // shard 0 named: present, unlike a report of no shard
		{Region: "x", Shard: proto.Uint32(math.MaxUint32)},
		{Region: "x", Keys: []*sluicev1.KeyDemand{{Key: &sluicev1.QuotaKey{Tenant: "t"}, HeldRate: math.Copysign(0, -1),
			Holding: math.Inf(1), HeldBurst: math.NaN(), Admitted: -3}}},
	} {
		if !sameAsProto(t, mustMarshal(t, r)) {
			t.Errorf("a report as the regions send it left the fast path: %v", r)
		}
	}
}

// TestInputProtoAcceptsDifferentlyIsLeftToIt: what the schema allows but the
// fast path does not expect goes to proto, which decides.
func TestInputProtoAcceptsDifferentlyIsLeftToIt(t *testing.T) {
	base := mustMarshal(t, sampleReport(2))
	unknown := protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), base...), 99, protowire.VarintType), 5)
	wrongType := protowire.AppendFixed32(protowire.AppendTag(append([]byte(nil), base...), 2, protowire.Fixed32Type), 5)
	var inner []byte
	inner = protowire.AppendTag(inner, 1, protowire.BytesType)
	inner = protowire.AppendString(inner, "t")
	inner = protowire.AppendTag(inner, 3, protowire.BytesType) // unknown in QuotaKey
	inner = protowire.AppendString(inner, "?")
	var kd []byte
	kd = protowire.AppendTag(kd, 1, protowire.BytesType)
	kd = protowire.AppendBytes(kd, inner)
	var nestedUnknown []byte
	nestedUnknown = protowire.AppendTag(nestedUnknown, 3, protowire.BytesType)
	nestedUnknown = protowire.AppendBytes(nestedUnknown, kd)
	badUTF8 := mustMarshal(t, &sluicev1.RegionReport{Region: "ok"})
	badUTF8[len(badUTF8)-1] = 0xff
	for name, in := range map[string][]byte{
		"unknown field":          unknown,
		"known field, odd wire":  wrongType,
		"unknown nested field":   nestedUnknown,
		"region not UTF-8":       badUTF8,
		"truncated":              base[:len(base)-3],
		"field number 0":         {0x00, 0x01},
		"length past the end":    {0x1a, 0x7f, 0x00},
		"packed revision cut":    {0x22, 0x02, 0x07, 0x80},
		"varint of eleven bytes": {0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	} {
		t.Run(name, func(t *testing.T) {
			if sameAsProto(t, in) {
				t.Errorf("the fast path decoded %x", in)
			}
		})
	}
}

// field appends one well-formed field num of wire type typ.
func field(b []byte, num protowire.Number, typ protowire.Type) []byte {
	b = protowire.AppendTag(b, num, typ)
	switch typ {
	case protowire.VarintType:
		return protowire.AppendVarint(b, 3)
	case protowire.Fixed64Type:
		return protowire.AppendFixed64(b, math.Float64bits(2.5))
	case protowire.Fixed32Type:
		return protowire.AppendFixed32(b, 7)
	default:
		return protowire.AppendString(b, "w")
	}
}

// wrap nests payload as field num of a message.
func wrap(num protowire.Number, payload []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), payload)
}

// TestEveryFieldInEveryWireType: each field number around the schema's, in
// each wire type, at the top, in a key's demand and in its QuotaKey,
// decodes as proto decides (as the field, or as an unknown field, which
// the fast path leaves to proto).
func TestEveryFieldInEveryWireType(t *testing.T) {
	base := mustMarshal(t, sampleReport(1))
	kd := mustMarshal(t, demand("acme", "write", 2))
	qk := mustMarshal(t, &sluicev1.QuotaKey{Tenant: "acme", Class: "write"})
	types := []protowire.Type{protowire.VarintType, protowire.Fixed64Type, protowire.Fixed32Type, protowire.BytesType}
	for num := protowire.Number(1); num <= 11; num++ {
		for _, typ := range types {
			name := fmt.Sprintf("field %d type %d", num, typ)
			top := field(append([]byte(nil), base...), num, typ)
			inDemand := append(append([]byte(nil), base...), wrap(3, field(append([]byte(nil), kd...), num, typ))...)
			inKey := append(append([]byte(nil), base...), wrap(3, wrap(1, field(append([]byte(nil), qk...), num, typ)))...)
			t.Run(name, func(t *testing.T) {
				sameAsProto(t, top)
				sameAsProto(t, inDemand)
				sameAsProto(t, inKey)
			})
		}
	}
}

// TestMalformedNestedMessages: a key's demand or its QuotaKey cut short
// at every byte, or with any one byte changed, inside a report whose own
// framing is sound, decodes (or fails) as proto decides.
func TestMalformedNestedMessages(t *testing.T) {
	kd := mustMarshal(t, demand("acme", "write", 2))
	qk := mustMarshal(t, &sluicev1.QuotaKey{Tenant: "acme", Class: "write"})
	head := mustMarshal(t, &sluicev1.RegionReport{Region: "eu-west", Seq: 9})
	report := func(payload []byte) []byte { return append(append([]byte(nil), head...), wrap(3, payload)...) }
	inKey := func(payload []byte) []byte { return report(wrap(1, payload)) }
	for _, c := range []struct {
		name   string
		inner  []byte
		frames func([]byte) []byte
	}{{"demand", kd, report}, {"key", qk, inKey}} {
		for cut := range len(c.inner) {
			sameAsProto(t, c.frames(c.inner[:cut]))
		}
		for at := range len(c.inner) {
			for _, x := range []byte{0x01, 0x07, 0x80, 0xff} {
				changed := append([]byte(nil), c.inner...)
				changed[at] ^= x
				sameAsProto(t, c.frames(changed))
			}
		}
		// A trailing byte that starts a field and ends the message.
		for _, tail := range [][]byte{{0x10}, {0x29}, {0x0a}, {0x00}, {0x80}} {
			sameAsProto(t, c.frames(append(append([]byte(nil), c.inner...), tail...)))
		}
	}
}

// TestFieldsGivenTwice: a scalar given twice keeps the last, a message
// given twice is merged, unpacked revisions append, all as proto does.
func TestFieldsGivenTwice(t *testing.T) {
	var tk []byte
	tk = protowire.AppendTag(tk, 1, protowire.BytesType)
	tk = protowire.AppendString(tk, "first")
	var ck []byte
	ck = protowire.AppendTag(ck, 2, protowire.BytesType)
	ck = protowire.AppendString(ck, "write")
	ck = protowire.AppendTag(ck, 1, protowire.BytesType)
	ck = protowire.AppendString(ck, "second")
	var kd []byte
	kd = protowire.AppendTag(kd, 1, protowire.BytesType)
	kd = protowire.AppendBytes(kd, tk)
	kd = protowire.AppendTag(kd, 9, protowire.Fixed64Type)
	kd = protowire.AppendFixed64(kd, math.Float64bits(1.5))
	kd = protowire.AppendTag(kd, 1, protowire.BytesType)
	kd = protowire.AppendBytes(kd, ck)
	kd = protowire.AppendTag(kd, 9, protowire.Fixed64Type)
	kd = protowire.AppendFixed64(kd, math.Float64bits(2.5))
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "us-east")
	b = protowire.AppendTag(b, 4, protowire.VarintType)
	b = protowire.AppendVarint(b, 3)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendBytes(b, kd)
	b = protowire.AppendTag(b, 4, protowire.BytesType)
	b = protowire.AppendBytes(b, protowire.AppendVarint(protowire.AppendVarint(nil, 4), 5))
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "eu-west")
	if !sameAsProto(t, b) {
		t.Fatal("fields given twice left the fast path")
	}
	got := new(sluicev1.RegionReport)
	if err := Unmarshal(b, got); err != nil {
		t.Fatal(err)
	}
	k := got.GetKeys()[0]
	if got.GetRegion() != "eu-west" || k.GetKey().GetTenant() != "second" || k.GetKey().GetClass() != "write" ||
		k.GetDemandRate() != 2.5 || fmt.Sprint(got.GetConfigRevisions()) != "[3 4 5]" {
		t.Fatalf("decoded %v", got)
	}
}

// TestDecodedStringsAreCopies: the input buffer is gRPC's, reused after the
// call; nothing decoded may point into it.
func TestDecodedStringsAreCopies(t *testing.T) {
	b := mustMarshal(t, sampleReport(3))
	got := new(sluicev1.RegionReport)
	if err := Unmarshal(b, got); err != nil {
		t.Fatal(err)
	}
	want := proto.Clone(got)
	for i := range b {
		b[i] = 'z'
	}
	if !proto.Equal(got, want) {
		t.Fatalf("the decoded report changed with its input: %v", got)
	}
}

// TestAKeyCostsOneHeapObject pins what the package is for: a report's keys
// cost their tenant names and a fixed number of slabs, not four objects
// each.
func TestAKeyCostsOneHeapObject(t *testing.T) {
	const keys = 1000
	b := mustMarshal(t, sampleReport(keys))
	allocs := testing.AllocsPerRun(20, func() {
		if err := Unmarshal(b, new(sluicev1.RegionReport)); err != nil {
			t.Fatal(err)
		}
	})
	// The tenants, the report, its slabs (demands, keys, pointers, rates,
	// revisions) and the few class names.
	if limit := float64(keys + 16); allocs > limit {
		t.Fatalf("%v allocations decoding %d keys; want at most %v", allocs, keys, limit)
	}
	standard := testing.AllocsPerRun(5, func() {
		if err := proto.Unmarshal(b, new(sluicev1.RegionReport)); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("allocations per report of %d keys: %v here, %v by proto.Unmarshal", keys, allocs, standard)
}

// TestCodecDecodesReportsAndPassesTheRest goes through the gRPC interface,
// a non-contiguous buffer included.
func TestCodecDecodesReportsAndPassesTheRest(t *testing.T) {
	c := New()
	if c.Name() != "proto" {
		t.Fatalf("Name %q: clients would see another content subtype", c.Name())
	}
	rep := sampleReport(5)
	b := mustMarshal(t, rep)
	split := mem.BufferSlice{mem.SliceBuffer(b[:7]), mem.SliceBuffer(b[7:])}
	got := new(sluicev1.RegionReport)
	if err := c.Unmarshal(split, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, rep) {
		t.Fatalf("got %v, want %v", got, rep)
	}
	grants := &sluicev1.RegionGrants{Region: "eu-west", Seq: 3, Grants: []*sluicev1.KeyGrant{{
		Key: &sluicev1.QuotaKey{Tenant: "t", Class: "c"}, Rate: 1, Burst: 2, ValidMs: 3}}}
	out, err := c.Marshal(grants)
	if err != nil {
		t.Fatal(err)
	}
	back := new(sluicev1.RegionGrants)
	if err := c.Unmarshal(out, back); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back, grants) {
		t.Fatalf("round trip of an answer: %v", back)
	}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x05})}, new(sluicev1.RegionReport)); err == nil {
		t.Fatal("a truncated report decoded")
	}
}

// reportGen draws reports in the shapes the schema allows.
func reportGen() *rapid.Generator[*sluicev1.RegionReport] {
	name := rapid.StringMatching(`[a-z0-9é\-]{0,12}`)
	return rapid.Custom(func(t *rapid.T) *sluicev1.RegionReport {
		r := &sluicev1.RegionReport{Region: name.Draw(t, "region"), Seq: rapid.Uint64().Draw(t, "seq"),
			ConfigRevisions: rapid.SliceOfN(rapid.Int64(), 0, 4).Draw(t, "revisions"),
			StaticValidMs:   rapid.Int64().Draw(t, "static"), Page: rapid.Uint32().Draw(t, "page"),
			Pages: rapid.Uint32().Draw(t, "pages"), AnswerPage: rapid.Uint32().Draw(t, "answer_page")}
		for i := range rapid.IntRange(0, 20).Draw(t, "keys") {
			kd := &sluicev1.KeyDemand{Admitted: rapid.Int64().Draw(t, "admitted"), Denied: rapid.Int64().Draw(t, "denied"),
				WindowMs: rapid.Int64().Draw(t, "window"), HeldRate: rapid.Float64().Draw(t, "rate"),
				HeldBurst: rapid.Float64().Draw(t, "burst"), HeldValidMs: rapid.Int64().Draw(t, "valid"),
				Holding: rapid.Float64().Draw(t, "holding")}
			if rapid.Bool().Draw(t, fmt.Sprint("key", i)) {
				kd.Key = &sluicev1.QuotaKey{Tenant: name.Draw(t, "tenant"), Class: name.Draw(t, "class")}
			}
			if rapid.Bool().Draw(t, fmt.Sprint("has_demand", i)) {
				kd.DemandRate = proto.Float64(rapid.Float64().Draw(t, "demand"))
			}
			r.Keys = append(r.Keys, kd)
		}
		return r
	})
}

func TestRandomReportsDecodeAsProtoDoes(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		b := mustMarshal(rt, reportGen().Draw(rt, "report"))
		if !sameAsProto(rt, b) {
			rt.Fatalf("a report proto.Marshal wrote left the fast path: %x", b)
		}
		// Cut anywhere, or with one byte changed: still as proto decides.
		if len(b) > 0 {
			cut := rapid.IntRange(0, len(b)-1).Draw(rt, "cut")
			sameAsProto(rt, b[:cut])
			flipped := append([]byte(nil), b...)
			flipped[cut] ^= byte(rapid.IntRange(1, 255).Draw(rt, "xor"))
			sameAsProto(rt, flipped)
		}
	})
}

func FuzzDecodeMatchesProto(f *testing.F) {
	for _, r := range []*sluicev1.RegionReport{{}, sampleReport(1), sampleReport(4)} {
		f.Add(mustMarshal(f, r))
	}
	f.Fuzz(func(t *testing.T, b []byte) { sameAsProto(t, b) })
}

func BenchmarkDecodeReport(b *testing.B) {
	in := mustMarshal(b, sampleReport(10_000))
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := Unmarshal(in, new(sluicev1.RegionReport)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(in, new(sluicev1.RegionReport)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
