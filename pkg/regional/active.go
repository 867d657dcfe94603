package regional

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/shrink"
	"github.com/sluicehq/sluice/pkg/quota"
)

// activeKeys remembers the keys this replica served recently and the live
// lease count each key showed in the last script reply (for the replica's
// live-lease and active-key gauges). It is this replica's alone: the
// region leader finds the keys to report in the candidate sets the
// scripts mark (candidates.go), never in an index of every served key.
//
// It holds only live keys: prune drops a key that was not served since the
// previous prune and has no live lease left as far as this replica knows
// (its last lease reply said none, a release took the last one off, or no
// reply came for a lease TTL, after which every lease that reply counted
// has expired or was renewed through another replica, which counts it).
//
// The keys are split among activeShards maps by a hash of the key, each
// under its own lock: every lease reply records its key, and a walk of
// every key (a scrape of the live-lease gauge, a prune) holds one shard's
// lock at a time, so a reply waits for at most a shard's part of it, not
// for a walk of a million keys. Safe for concurrent use.
type activeKeys struct {
	seed   maphash.Seed
	shards [activeShards]activeShard
}

// activeShards is how many maps activeKeys splits its keys among.
const activeShards = 64

type activeShard struct {
	mu   sync.Mutex                // guards keys and peak
	keys map[quota.Key]activeEntry // guarded by mu
	peak shrink.Peak               // guarded by mu
}

type activeEntry struct {
	seen bool      // served since the last prune
	live int64     // live leases on the key, as last seen
	at   time.Time // when live was last read from a script reply
}

func newActiveKeys() *activeKeys {
	a := &activeKeys{seed: maphash.MakeSeed()}
	for i := range a.shards {
		a.shards[i].keys = map[quota.Key]activeEntry{}
	}
	return a
}

// shard is k's shard, locked; the caller unlocks it.
func (a *activeKeys) shard(k quota.Key) *activeShard {
	var h maphash.Hash
	h.SetSeed(a.seed)
	h.WriteString(k.Tenant)
	h.WriteByte(0)
	h.WriteString(k.Class)
	sh := &a.shards[h.Sum64()%activeShards]
	sh.mu.Lock()
	return sh
}

// touch records a lease reply at now that showed live leases on k.
func (a *activeKeys) touch(now time.Time, k quota.Key, live int64) {
	sh := a.shard(k)
	sh.keys[k] = activeEntry{seen: true, live: max(live, 0), at: now}
	sh.peak.Note(len(sh.keys))
	sh.mu.Unlock()
}

// mark records that k was served without a lease count (a strict check).
func (a *activeKeys) mark(k quota.Key) {
	sh := a.shard(k)
	e := sh.keys[k]
	e.seen = true
	sh.keys[k] = e
	sh.peak.Note(len(sh.keys))
	sh.mu.Unlock()
}

// release records that an instance released its lease on k: the release
// script deletes that instance's lease, so one fewer is live.
func (a *activeKeys) release(k quota.Key) {
	sh := a.shard(k)
	e := sh.keys[k]
	e.seen = true
	e.live = max(e.live-1, 0)
	sh.keys[k] = e
	sh.peak.Note(len(sh.keys))
	sh.mu.Unlock()
}

// leases is the live leases on the keys whose count was read within ttl
// before now.
func (a *activeKeys) leases(now time.Time, ttl time.Duration) int64 {
	var n int64
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		for _, e := range sh.keys {
			if e.live > 0 && now.Sub(e.at) < ttl {
				n += e.live
			}
		}
		sh.mu.Unlock()
	}
	return n
}

// size is how many keys the index holds.
func (a *activeKeys) size() int {
	n := 0
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		n += len(sh.keys)
		sh.mu.Unlock()
	}
	return n
}

// prune forgets the keys not served since the last prune with no live
// lease at now (see activeKeys) and gives each map's room back once it
// has mostly emptied.
func (a *activeKeys) prune(now time.Time, ttl time.Duration) {
	for i := range a.shards {
		sh := &a.shards[i]
		sh.mu.Lock()
		for k, e := range sh.keys {
			if !e.seen && (e.live <= 0 || now.Sub(e.at) >= ttl) {
				delete(sh.keys, k)
				continue
			}
			if e.seen {
				e.seen = false
				sh.keys[k] = e
			}
		}
		sh.keys = shrink.Map(sh.keys, &sh.peak)
		sh.mu.Unlock()
	}
}
