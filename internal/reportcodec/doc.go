// Package reportcodec is the global tier's gRPC codec: region reports are
// decoded in one pass into slabs, every other message goes through gRPC's
// standard proto codec.
//
// Why: a global shard's epoch is, per key and region, the allocator's own
// work (about 0.2 µs) plus the wire. The standard decoder makes four heap
// objects of every reported key (its KeyDemand, its QuotaKey and their two
// strings) through reflection, which cost more than the allocator itself
// and feed the garbage collector (BENCHMARKS.md, "The daemon with its
// wire"). Here a report's KeyDemand and QuotaKey messages are two slices
// allocated once, its demand rates a third, class names are shared among
// the keys of one report, and a tenant name is the one heap object a key
// costs.
//
// Invariant: for every input, Unmarshal leaves the message proto.Equal to
// what proto.Unmarshal leaves, and fails exactly when it fails. The fast
// path knows the report's fields as this build's schema defines them; on
// anything else (an unknown field, a known field in an unexpected wire
// type, malformed bytes, a string that is not UTF-8) it gives the whole
// input to proto.Unmarshal, which decides. FuzzDecodeMatchesProto checks
// it.
//
// Messages decoded here share backing arrays: a report's KeyDemand and
// QuotaKey values live in slices, so a pointer to one keeps the whole
// report's slab alive. Nothing in the global tier keeps a report's messages
// past the call that decoded it (the allocator keeps quota.Key strings, each
// its own allocation).
//
// Codec is safe for concurrent use: it holds no state.
package reportcodec
