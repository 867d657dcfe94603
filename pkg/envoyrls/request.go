package envoyrls

import (
	"sync"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
)

// requestBlock is a request as RegisterEncoded's handler receives it: the
// RateLimitRequest with room for the common request's descriptor and its
// entries in the same allocation. The Service's codec reads the common
// shapes of request into it itself (read) and leaves every other one to
// proto.Unmarshal.
type requestBlock struct {
	req     rlsv3.RateLimitRequest
	descPtr [1]*ratelimitv3.RateLimitDescriptor
	desc    [1]ratelimitv3.RateLimitDescriptor
	entPtr  [2]*ratelimitv3.RateLimitDescriptor_Entry
	ent     [2]ratelimitv3.RateLimitDescriptor_Entry
}

// requestBlocks are the blocks of the calls served with RegisterEncoded:
// a block is taken for a call and given back, emptied, when the call's
// handler (and every interceptor around it) has returned. The strings of
// a request are not in its block (see read): they may outlive the call,
// as quota keys, in errors and in logs.
var requestBlocks = sync.Pool{New: func() any { return new(requestBlock) }}

// release empties b and gives it back to requestBlocks.
func (b *requestBlock) release() {
	*b = requestBlock{}
	requestBlocks.Put(b)
}

// Field numbers of the messages read.
const (
	fieldRequestDomain      = 1
	fieldRequestDescriptors = 2
	fieldRequestHitsAddend  = 3
	fieldDescriptorEntries  = 1
	fieldDescriptorNegative = 4
	fieldEntryKey           = 1
	fieldEntryValue         = 2
)

// read fills b.req from a RateLimitRequest's wire form, exactly as
// proto.Unmarshal would (a later singular field replacing an earlier
// one), and says whether it could. It reads requests made only of the
// fields Envoy sends for descriptors of entries (domain, descriptors,
// hits_addend; a descriptor's entries and is_negative_hits; an entry's
// key and value) with valid UTF-8 strings; on anything else (a
// descriptor's limit or hits_addend, a field it does not know, malformed
// bytes) it returns false and leaves b untouched, and the caller has
// proto.Unmarshal read the request. The strings share one copy of data,
// so data may be reused once read returns: a request of one descriptor of
// up to two entries costs two allocations (b, which RegisterEncoded's
// handler reuses from call to call, and that copy) instead of
// proto.Unmarshal's dozen.
func (b *requestBlock) read(data []byte) bool {
	nd, ne, ok := scanRequest(data)
	if !ok {
		return false
	}
	descs, descPtrs := b.desc[:], b.descPtr[:]
	if nd > len(descs) {
		descs, descPtrs = make([]ratelimitv3.RateLimitDescriptor, nd), make([]*ratelimitv3.RateLimitDescriptor, nd)
	}
	ents, entPtrs := b.ent[:], b.entPtr[:]
	if ne > len(ents) {
		ents, entPtrs = make([]ratelimitv3.RateLimitDescriptor_Entry, ne), make([]*ratelimitv3.RateLimitDescriptor_Entry, ne)
	}
	var s string
	if len(data) > 0 {
		s = string(data)
	}
	r := &b.req
	di, ei := 0, 0
	for i := 0; i < len(data); {
		num, typ, n := protowire.ConsumeTag(data[i:])
		i += n
		if typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(data[i:])
			i += n
			r.HitsAddend = uint32(v) // as proto.Unmarshal: truncated
			continue
		}
		v, n := protowire.ConsumeBytes(data[i:])
		at := i + n - len(v)
		i += n
		if num == fieldRequestDomain {
			r.Domain = s[at : at+len(v)]
			continue
		}
		d := &descs[di]
		descPtrs[di] = d
		di++
		ei = readDescriptor(d, data[:at+len(v)], s, at, ents, entPtrs, ei)
	}
	if nd > 0 {
		r.Descriptors = descPtrs[:nd:nd]
	}
	return true
}

// readDescriptor fills d from the descriptor at data[from:] (its entries
// taken from ents, entPtrs from ei on) and returns the next free entry.
func readDescriptor(d *ratelimitv3.RateLimitDescriptor, data []byte, s string, from int, ents []ratelimitv3.RateLimitDescriptor_Entry, entPtrs []*ratelimitv3.RateLimitDescriptor_Entry, ei int) int {
	first := ei
	for i := from; i < len(data); {
		_, typ, n := protowire.ConsumeTag(data[i:])
		i += n
		if typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(data[i:])
			i += n
			d.IsNegativeHits = protowire.DecodeBool(v)
			continue
		}
		v, n := protowire.ConsumeBytes(data[i:])
		at := i + n - len(v)
		i += n
		e := &ents[ei]
		entPtrs[ei] = e
		ei++
		for j := at; j < at+len(v); {
			num, _, n := protowire.ConsumeTag(data[j:])
			j += n
			f, n := protowire.ConsumeBytes(data[j:])
			fat := j + n - len(f)
			j += n
			if num == fieldEntryKey {
				e.Key = s[fat : fat+len(f)]
			} else {
				e.Value = s[fat : fat+len(f)]
			}
		}
	}
	if ei > first {
		d.Entries = entPtrs[first:ei:ei]
	}
	return ei
}

// scanRequest checks that data is a request read can read and counts its
// descriptors and their entries.
func scanRequest(data []byte) (descriptors, entries int, ok bool) {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return 0, 0, false
		}
		data = data[n:]
		switch {
		case num == fieldRequestHitsAddend && typ == protowire.VarintType:
			if _, n = protowire.ConsumeVarint(data); n < 0 {
				return 0, 0, false
			}
		case num == fieldRequestDomain && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(data)
			if m < 0 || !utf8.Valid(v) {
				return 0, 0, false
			}
			n = m
		case num == fieldRequestDescriptors && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(data)
			if m < 0 {
				return 0, 0, false
			}
			k, ok := scanDescriptor(v)
			if !ok {
				return 0, 0, false
			}
			descriptors, entries, n = descriptors+1, entries+k, m
		default:
			return 0, 0, false
		}
		data = data[n:]
	}
	return descriptors, entries, true
}

// scanDescriptor checks one descriptor and counts its entries.
func scanDescriptor(data []byte) (entries int, ok bool) {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return 0, false
		}
		data = data[n:]
		switch {
		case num == fieldDescriptorNegative && typ == protowire.VarintType:
			if _, n = protowire.ConsumeVarint(data); n < 0 {
				return 0, false
			}
		case num == fieldDescriptorEntries && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(data)
			if m < 0 || !scanEntry(v) {
				return 0, false
			}
			entries, n = entries+1, m
		default:
			return 0, false
		}
		data = data[n:]
	}
	return entries, true
}

// scanEntry checks one entry: a key and a value, UTF-8 both.
func scanEntry(data []byte) bool {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 || typ != protowire.BytesType || (num != fieldEntryKey && num != fieldEntryValue) {
			return false
		}
		v, m := protowire.ConsumeBytes(data[n:])
		if m < 0 || !utf8.Valid(v) {
			return false
		}
		data = data[n+m:]
	}
	return true
}
