package envoyrls

import (
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
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		switch {
		case num == fieldRequestDomain && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(data)
			if m < 0 {
				return protowire.ParseError(m)
			}
			r.Domain, n = string(v), m
		case num == fieldRequestDescriptors && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(data)
			if m < 0 {
				return protowire.ParseError(m)
			}
			d := new(ratelimitv3.RateLimitDescriptor)
			if err := readLenientDescriptor(v, d); err != nil {
				return err
			}
			r.Descriptors, n = append(r.Descriptors, d), m
		case num == fieldRequestHitsAddend && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(data)
			if m < 0 {
				return protowire.ParseError(m)
			}
			r.HitsAddend, n = uint32(v), m // as proto.Unmarshal: truncated
		default:
			if n = protowire.ConsumeFieldValue(num, typ, data); n < 0 {
				return protowire.ParseError(n)
			}
		}
		data = data[n:]
	}
	return nil
}

// readLenientDescriptor reads one descriptor into d as readLenient does.
// Its limit and hits_addend carry no string and are read by
// proto.Unmarshal, merged into what an earlier occurrence left.
func readLenientDescriptor(data []byte, d *ratelimitv3.RateLimitDescriptor) error {
	merge := proto.UnmarshalOptions{Merge: true}
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		if typ == protowire.BytesType && (num == fieldDescriptorEntries || num == fieldDescriptorLimit || num == fieldDescriptorHitsAddend) {
			v, m := protowire.ConsumeBytes(data)
			if m < 0 {
				return protowire.ParseError(m)
			}
			var err error
			switch num {
			case fieldDescriptorEntries:
				e := new(ratelimitv3.RateLimitDescriptor_Entry)
				err = readLenientEntry(v, e)
				d.Entries = append(d.Entries, e)
			case fieldDescriptorLimit:
				if d.Limit == nil {
					d.Limit = new(ratelimitv3.RateLimitDescriptor_RateLimitOverride)
				}
				err = merge.Unmarshal(v, d.Limit)
			default:
				if d.HitsAddend == nil {
					d.HitsAddend = new(wrapperspb.UInt64Value)
				}
				err = merge.Unmarshal(v, d.HitsAddend)
			}
			if err != nil {
				return err
			}
			data = data[m:]
			continue
		}
		if num == fieldDescriptorNegative && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(data)
			if m < 0 {
				return protowire.ParseError(m)
			}
			d.IsNegativeHits = protowire.DecodeBool(v)
			data = data[m:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, data); n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
	}
	return nil
}

// readLenientEntry reads one entry into e, its key and value as bytes.
func readLenientEntry(data []byte, e *ratelimitv3.RateLimitDescriptor_Entry) error {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		if typ == protowire.BytesType && (num == fieldEntryKey || num == fieldEntryValue) {
			v, m := protowire.ConsumeBytes(data)
			if m < 0 {
				return protowire.ParseError(m)
			}
			if num == fieldEntryKey {
				e.Key = string(v)
			} else {
				e.Value = string(v)
			}
			data = data[m:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, data); n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
	}
	return nil
}
