package envoyrls

import (
	"fmt"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Field numbers read only by readLenient.
const (
	fieldDescriptorLimit      = 2
	fieldDescriptorHitsAddend = 3
)

// readLenient reads a RateLimitRequest's wire form into r (empty) as
// proto.Unmarshal does, except that the strings (the domain, an entry's
// key and value) are taken as the bytes they carry, valid UTF-8 or not.
// It is the codec's last resort, for a request proto.Unmarshal refused.
//
// Why: proto3 requires a string field to be UTF-8, and proto.Unmarshal
// refuses a request that breaks it, so gRPC answered Internal before the
// handler ran. A header value is whatever bytes a client sends (HTTP
// allows bytes from 0x80 in a field value), and Envoy's descriptors carry
// them as they came: one descriptor built from such a header made the
// whole request an error, which Envoy lets through by default
// (failure_mode_deny: false), unlimited and uncounted, so any client could
// skip every limit of a request by adding a byte to one header. A value
// that is not a plain tenant name is a digest tenant of its own (TreeTenant),
// whatever its bytes, so such a request is now decided like any other.
//
// Everything else is as proto.Unmarshal: a later singular field replaces
// an earlier one, a singular message field seen twice is merged, a field
// of an unknown number or of another wire type than its own is skipped,
// and malformed bytes are an error.
func readLenient(data []byte, r *rlsv3.RateLimitRequest) error {
	return eachField(data, func(num protowire.Number, typ protowire.Type, b []byte, v uint64) error {
		switch {
		case num == fieldRequestDomain && typ == protowire.BytesType:
			r.Domain = string(b)
		case num == fieldRequestDescriptors && typ == protowire.BytesType:
			d := new(ratelimitv3.RateLimitDescriptor)
			r.Descriptors = append(r.Descriptors, d)
			return readLenientDescriptor(b, d)
		case num == fieldRequestHitsAddend && typ == protowire.VarintType:
			r.HitsAddend = uint32(v) // as proto.Unmarshal: truncated
		}
		return nil
	})
}

// readLenientDescriptor reads one descriptor into d as readLenient does.
// Its limit and hits_addend carry no string and are read by
// proto.Unmarshal, merged into what an earlier occurrence left.
func readLenientDescriptor(data []byte, d *ratelimitv3.RateLimitDescriptor) error {
	merge := proto.UnmarshalOptions{Merge: true}
	return eachField(data, func(num protowire.Number, typ protowire.Type, b []byte, v uint64) error {
		switch {
		case num == fieldDescriptorEntries && typ == protowire.BytesType:
			e := new(ratelimitv3.RateLimitDescriptor_Entry)
			d.Entries = append(d.Entries, e)
			return eachField(b, func(num protowire.Number, typ protowire.Type, b []byte, _ uint64) error {
				switch {
				case num == fieldEntryKey && typ == protowire.BytesType:
					e.Key = string(b)
				case num == fieldEntryValue && typ == protowire.BytesType:
					e.Value = string(b)
				}
				return nil
			})
		case num == fieldDescriptorLimit && typ == protowire.BytesType:
			if d.Limit == nil {
				d.Limit = new(ratelimitv3.RateLimitDescriptor_RateLimitOverride)
			}
			return merge.Unmarshal(b, d.Limit)
		case num == fieldDescriptorHitsAddend && typ == protowire.BytesType:
			if d.HitsAddend == nil {
				d.HitsAddend = new(wrapperspb.UInt64Value)
			}
			return merge.Unmarshal(b, d.HitsAddend)
		case num == fieldDescriptorNegative && typ == protowire.VarintType:
			d.IsNegativeHits = protowire.DecodeBool(v)
		}
		return nil
	})
}

// eachField walks the fields of the message in data, in order, and calls
// field with each one of bytes or varint type: its number, its type, and
// its bytes or its varint. Fields of other types are skipped, as fields
// field does not know must be: proto.Unmarshal keeps them as unknown.
// Malformed bytes, or an error of field, end the walk with that error.
func eachField(data []byte, field func(num protowire.Number, typ protowire.Type, b []byte, v uint64) error) error {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			// ConsumeTag takes numbers up to 2^31-1; proto.Unmarshal
			// refuses those above 2^29-1.
			return fmt.Errorf("field number %d is above the largest, %d", num, protowire.MaxValidNumber)
		}
		data = data[n:]
		var b []byte
		var v uint64
		switch typ {
		case protowire.BytesType:
			b, n = protowire.ConsumeBytes(data)
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(data)
		default:
			n = protowire.ConsumeFieldValue(num, typ, data)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		if typ != protowire.BytesType && typ != protowire.VarintType {
			continue
		}
		if err := field(num, typ, b, v); err != nil {
			return err
		}
	}
	return nil
}
