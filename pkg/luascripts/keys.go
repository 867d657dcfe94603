package luascripts

import (
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// DefaultPrefix starts every Redis key Sluice writes.
const DefaultPrefix = "sl:"

// Keys are the Redis keys one script call on a quota key touches: its
// three keys, which share the hash tag {tenant|class}, and the born
// sentinel of the data set they live in (see lib.lua, KEYS[4]), which
// hashes to the same slot. The tenant and class of a validated quota.Key
// never contain '{', '}' or '|', so the tag is unambiguous.
type Keys struct {
	// Bucket is the bucket hash, which also holds the key's lease records
	// (field LeaseField(id)); Expiry the expiry set of a key with more
	// than a few leases; Leases the lease hash of older scripts, read and
	// moved into Bucket by the first call that loads the key (lib.lua,
	// "Layouts").
	Bucket, Leases, Expiry string
	// Born is the sentinel: prefix+"born" on a single Redis, one key per
	// hash slot on a cluster (BornKey).
	Born string
	// Cand is the candidate set the scripts mark the key into when it
	// needs the global tier (see lib.lua, KEYS[5]): prefix+"cand" on a
	// single Redis, one per hash slot on a cluster (CandKey). Member is
	// the key's member in it, "tenant|class".
	Cand, Member string
	// Gen is the born sentinel's write generation (GenKey(Born)): every
	// call that saves a bucket raises it, so a data set that goes back in
	// time is found (see lib.lua, Rollback).
	Gen string
}

// GenKey is the write generation of the data set of born sentinel born:
// its name + ":gen", in the same hash slot.
func GenKey(born string) string { return born + ":gen" }

// KeysFor names the Redis keys of k under prefix on a single Redis (one
// data set, one sentinel). k must be valid.
func KeysFor(prefix string, k quota.Key) Keys {
	tag := prefix + "{" + k.Tenant + "|" + k.Class + "}:"
	return Keys{Bucket: tag + "b", Leases: tag + "l", Expiry: tag + "x", Born: prefix + "born",
		Cand: prefix + "cand", Member: k.Tenant + "|" + k.Class, Gen: GenKey(prefix + "born")}
}

// ClusterKeysFor names the Redis keys of k under prefix on a Redis
// Cluster: the sentinel is its hash slot's (BornKey), so a node that
// restarts empty loses it together with the buckets it held, and a slot
// that migrates takes its sentinel along. k must be valid.
func ClusterKeysFor(prefix string, k quota.Key) Keys {
	ks := KeysFor(prefix, k)
	slot := Slot(k.Tenant + "|" + k.Class)
	ks.Born = BornKey(prefix, slot)
	ks.Cand = CandKey(prefix, slot)
	ks.Gen = GenKey(ks.Born)
	return ks
}

// CandKey is the candidate set of hash slot slot (0 ≤ slot < SlotCount)
// under prefix: the slot's born sentinel's name (its hash tag) + ":cand".
func CandKey(prefix string, slot int) string { return BornKey(prefix, slot) + ":cand" }

// CandKeys lists every candidate set the region leader reads: the single
// Redis's one, or every slot's on a cluster.
func CandKeys(prefix string, cluster bool) []string {
	if !cluster {
		return []string{prefix + "cand"}
	}
	out := make([]string, SlotCount)
	for s := range out {
		out[s] = CandKey(prefix, s)
	}
	return out
}

// SlotCount is the number of hash slots of a Redis Cluster.
const SlotCount = 16384

// BornKey is the born sentinel of hash slot slot (0 ≤ slot < SlotCount)
// under prefix: prefix+"{born-T}" with the shortest base-36 T whose hash
// tag falls in that slot.
func BornKey(prefix string, slot int) string {
	slotTagsOnce.Do(findSlotTags)
	return prefix + "{born-" + slotTags[slot] + "}"
}

// BornKeys lists every sentinel a regional service stamps: the single
// Redis's one, or every slot's on a cluster.
func BornKeys(prefix string, cluster bool) []string {
	if !cluster {
		return []string{prefix + "born"}
	}
	out := make([]string, SlotCount)
	for s := range out {
		out[s] = BornKey(prefix, s)
	}
	return out
}

var (
	slotTagsOnce sync.Once
	slotTags     [SlotCount]string
)

// findSlotTags finds one short tag per slot (about 170,000 CRC16s, once).
func findSlotTags() {
	left := SlotCount
	for n := int64(0); left > 0; n++ {
		t := strconv.FormatInt(n, 36)
		s := Slot("born-" + t)
		if slotTags[s] == "" {
			slotTags[s] = t
			left--
		}
	}
}

// Slot is the Redis Cluster hash slot of a key whose hash tag (or whole
// name, without braces) is tag: CRC16/XMODEM mod 16384.
func Slot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % SlotCount
}

// RestartWait is how long after a data set's birth a bucket missing from it
// starts empty (Common.RestartWait): the longer of one lease TTL (leases
// issued before the loss may be spent until they end) and one grant
// validity plus one epoch (the lost bucket may have held a grant below the
// region's static share whose donated capacity another region uses until
// the grant ends, at most grant_validity after its report was sent, before
// the loss, plus one epoch of clock margin). The regional service and the
// simulator both take it from here.
func RestartWait(leaseTTL, grantValidity, epoch time.Duration) time.Duration {
	return max(leaseTTL, grantValidity+epoch)
}

func (k Keys) list() []string { return []string{k.Bucket, k.Leases, k.Expiry, k.Born, k.Cand, k.Gen} }

// LeaseField is the field of the bucket hash that holds instance id's
// lease record (lib.lua, "Layouts").
func LeaseField(id string) string { return "#" + id }
