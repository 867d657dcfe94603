package reportcodec

import (
	"math"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// Codec is a gRPC encoding.CodecV2 named "proto", as gRPC's own, so clients
// see no difference: it decodes *sluicev1.RegionReport with Unmarshal
// below and hands every other message to gRPC's proto codec. Serve it with
// grpc.ForceServerCodecV2. The zero value is not usable; use New.
type Codec struct {
	standard encoding.CodecV2
}

// New returns the codec.
func New() *Codec {
	c := encoding.GetCodecV2(grpcproto.Name)
	if c == nil {
		// grpc/encoding/proto registers it when imported, as here.
		panic("reportcodec: gRPC's proto codec is not registered")
	}
	return &Codec{standard: c}
}

// Name is gRPC's name of the proto codec.
func (c *Codec) Name() string { return grpcproto.Name }

// Marshal is gRPC's proto codec's. (Answers written by hand measured no
// faster than proto's table-driven marshalling: BENCHMARKS.md, "Reports
// decoded into slabs".)
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) { return c.standard.Marshal(v) }

// Unmarshal decodes a region report with Unmarshal below and any other
// message with gRPC's proto codec.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*sluicev1.RegionReport)
	if !ok {
		return c.standard.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	// The error is proto's own, as gRPC's codec returns it.
	return Unmarshal(buf.ReadOnlyData(), r)
}

// Unmarshal decodes b into r as proto.Unmarshal does (r is reset first),
// and fails exactly when it fails. The strings decoded are copies: b may
// be reused once it returns.
func Unmarshal(b []byte, r *sluicev1.RegionReport) error {
	if decodeReport(b, r) {
		return nil
	}
	return proto.Unmarshal(b, r)
}

// classCache shares the class names of one report's keys: a report names
// a few classes many times. Round-robin over its slots; a miss costs one
// string, as without it.
type classCache struct {
	names [8]string
	next  int
}

func (c *classCache) get(b []byte) string {
	for _, s := range c.names {
		if s == string(b) && s != "" {
			return s
		}
	}
	s := string(b)
	c.names[c.next] = s
	c.next = (c.next + 1) % len(c.names)
	return s
}

// decodeReport is the fast path: true when it decoded all of b into r,
// false when b holds anything it leaves to proto.Unmarshal (r is then in
// an unspecified state; proto.Unmarshal resets it).
func decodeReport(b []byte, r *sluicev1.RegionReport) bool {
	proto.Reset(r)
	keys, ok := countKeys(b)
	if !ok {
		return false
	}
	var (
		demands []sluicev1.KeyDemand
		qkeys   []sluicev1.QuotaKey
		rates   []float64
		classes classCache
	)
	if keys > 0 {
		demands = make([]sluicev1.KeyDemand, keys)
		qkeys = make([]sluicev1.QuotaKey, keys)
		r.Keys = make([]*sluicev1.KeyDemand, 0, keys)
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !utf8.Valid(v) {
				return false
			}
			r.Region = string(v)
			b = b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return false
			}
			i := len(r.Keys)
			kd := &demands[i]
			if !decodeDemand(v, kd, &qkeys[i], &rates, keys, &classes) {
				return false
			}
			r.Keys = append(r.Keys, kd)
			b = b[n:]
		case num == 4 && typ == protowire.BytesType: // packed
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return false
			}
			for len(v) > 0 {
				x, m := protowire.ConsumeVarint(v)
				if m < 0 {
					return false
				}
				r.ConfigRevisions = append(r.ConfigRevisions, int64(x))
				v = v[m:]
			}
			b = b[n:]
		case typ == protowire.VarintType && num >= 2 && num <= 9 && num != 3:
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			switch num {
			case 2:
				r.Seq = x
			case 4: // not packed
				r.ConfigRevisions = append(r.ConfigRevisions, int64(x))
			case 5:
				r.StaticValidMs = int64(x)
			case 6:
				r.Page = uint32(x)
			case 7:
				r.Pages = uint32(x)
			case 8:
				r.AnswerPage = uint32(x)
			case 9:
				r.Shard = proto.Uint32(uint32(x))
			}
			b = b[n:]
		default:
			return false
		}
	}
	return true
}

// countKeys counts the keys field's entries, so the slabs are sized once.
// False for bytes that do not parse as fields.
func countKeys(b []byte) (int, bool) {
	keys := 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		if num == 3 && typ == protowire.BytesType {
			keys++
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
	}
	return keys, true
}

// decodeDemand decodes one KeyDemand into kd, its key (when present) into
// qk. rates is the report's slab of demand rates, allocated for keys
// entries on first use.
func decodeDemand(b []byte, kd *sluicev1.KeyDemand, qk *sluicev1.QuotaKey, rates *[]float64, keys int, classes *classCache) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return false
			}
			// A message field given twice is merged, as proto does.
			kd.Key = qk
			if !decodeQuotaKey(v, qk, classes) {
				return false
			}
			b = b[n:]
		case typ == protowire.VarintType && (num == 2 || num == 3 || num == 4 || num == 7):
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			switch num {
			case 2:
				kd.Admitted = int64(x)
			case 3:
				kd.Denied = int64(x)
			case 4:
				kd.WindowMs = int64(x)
			case 7:
				kd.HeldValidMs = int64(x)
			}
			b = b[n:]
		case typ == protowire.Fixed64Type && (num == 5 || num == 6 || num == 8 || num == 9 || num == 10):
			x, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return false
			}
			f := math.Float64frombits(x)
			switch num {
			case 5:
				kd.HeldRate = f
			case 6:
				kd.HeldBurst = f
			case 8:
				kd.Holding = f
			case 10:
				kd.Released = f
			case 9:
				if kd.DemandRate == nil {
					if *rates == nil {
						*rates = make([]float64, 0, keys)
					}
					*rates = append(*rates, 0)
					kd.DemandRate = &(*rates)[len(*rates)-1]
				}
				*kd.DemandRate = f
			}
			b = b[n:]
		default:
			return false
		}
	}
	return true
}

// decodeQuotaKey decodes one QuotaKey into qk; a later field overwrites an
// earlier one, as proto's merge of a message given twice does.
func decodeQuotaKey(b []byte, qk *sluicev1.QuotaKey, classes *classCache) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || (num != 1 && num != 2) {
			return false
		}
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 || !utf8.Valid(v) {
			return false
		}
		if num == 1 {
			qk.Tenant = string(v)
		} else {
			qk.Class = classes.get(v)
		}
		b = b[n:]
	}
	return true
}
