// Package shard is the global tier's shard map: which allocator shard owns
// a quota key. The key hash space (a stable 64-bit hash of tenant and
// class) is cut into N equal ranges, shard i owning the i-th; N comes from
// the config the global tier and the regions run (global_shards, default
// 1). One shard is the unsharded global tier: its election key and etcd
// paths are the ones a deployment without shards uses.
//
// Pure: no clock, no I/O. The hash never changes between releases (the
// regions and every shard must agree on it), and a test pins it.
package shard

import (
	"fmt"
	"math/bits"
	"strconv"

	"github.com/sluicehq/sluice/pkg/quota"
)

// MaxShards bounds N: more shards than regions × keys ever need, and few
// enough that a region keeps one client and one static lease per shard.
const MaxShards = 256

// Map assigns keys to N shards by ranges of the key hash space. The zero
// Map is one shard. A value; safe to copy and to share.
type Map struct{ n int }

// New is the map of n shards; n outside 1..MaxShards is refused, naming the
// bound.
func New(n int) (Map, error) {
	if err := Validate(n); err != nil {
		return Map{}, err
	}
	return Map{n: n}, nil
}

// Validate checks a shard count.
func Validate(n int) error {
	if n < 1 || n > MaxShards {
		return fmt.Errorf("%w: shard count %d must be in 1..%d", quota.ErrInvalid, n, MaxShards)
	}
	return nil
}

// N is the number of shards (at least 1).
func (m Map) N() int { return max(m.n, 1) }

// Of is the shard owning k: the range of the hash space its hash falls in.
func (m Map) Of(k quota.Key) int {
	if m.N() == 1 {
		return 0 // no hash on the unsharded path
	}
	return m.OfHash(Hash(k))
}

// OfHash is the shard owning the hash h: shard i owns
// [i·2⁶⁴/N, (i+1)·2⁶⁴/N).
func (m Map) OfHash(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(m.N()))
	return int(hi)
}

// Owns says whether shard i owns k.
func (m Map) Owns(i int, k quota.Key) bool { return m.Of(k) == i }

// String names the map for errors and logs ("3 shards").
func (m Map) String() string {
	if m.N() == 1 {
		return "1 shard"
	}
	return strconv.Itoa(m.N()) + " shards"
}

// Hash is the stable 64-bit hash of a key: FNV-1a over tenant, a
// separator that never occurs in a tenant or class name, and class, mixed
// by the 64-bit finalizer of MurmurHash3 so its high bits (which pick the
// range) depend on every input byte.
func Hash(k quota.Key) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := 0; i < len(k.Tenant); i++ {
		h = (h ^ uint64(k.Tenant[i])) * prime
	}
	h = (h ^ '|') * prime
	for i := 0; i < len(k.Class); i++ {
		h = (h ^ uint64(k.Class[i])) * prime
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// ElectionName is shard i's election under the store's election prefix:
// "global" for shard 0 (the unsharded global tier's), "global-shard-I"
// for the others. No name is a prefix of another's candidates' keys
// (those live under name + "/").
func ElectionName(i int) string {
	if i == 0 {
		return "global"
	}
	return "global-shard-" + strconv.Itoa(i)
}

// LapsedName is shard i's durable lapsed set under "<prefix>/global/":
// "lapsed" for shard 0, "lapsed-shard-I" for the others.
func LapsedName(i int) string {
	if i == 0 {
		return "lapsed"
	}
	return "lapsed-shard-" + strconv.Itoa(i)
}

// Split groups the indexes of keys by owner: out[i] lists, in order, the
// positions of the keys shard i owns.
func (m Map) Split(keys []quota.Key) [][]int {
	out := make([][]int, m.N())
	for j, k := range keys {
		i := m.Of(k)
		out[i] = append(out[i], j)
	}
	return out
}
