package regional

import (
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
// Safe for concurrent use.
type activeKeys struct {
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
	return &activeKeys{keys: map[quota.Key]activeEntry{}}
}

// touch records a lease reply at now that showed live leases on k.
func (a *activeKeys) touch(now time.Time, k quota.Key, live int64) {
	a.mu.Lock()
	a.keys[k] = activeEntry{seen: true, live: max(live, 0), at: now}
	a.peak.Note(len(a.keys))
	a.mu.Unlock()
}

// mark records that k was served without a lease count (a strict check).
func (a *activeKeys) mark(k quota.Key) {
	a.mu.Lock()
	e := a.keys[k]
	e.seen = true
	a.keys[k] = e
	a.peak.Note(len(a.keys))
	a.mu.Unlock()
}

// release records that an instance released its lease on k: the release
// script deletes that instance's lease, so one fewer is live.
func (a *activeKeys) release(k quota.Key) {
	a.mu.Lock()
	e := a.keys[k]
	e.seen = true
	e.live = max(e.live-1, 0)
	a.keys[k] = e
	a.peak.Note(len(a.keys))
	a.mu.Unlock()
}

// leases is the live leases on the keys whose count was read within ttl
// before now.
func (a *activeKeys) leases(now time.Time, ttl time.Duration) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for _, e := range a.keys {
		if e.live > 0 && now.Sub(e.at) < ttl {
			n += e.live
		}
	}
	return n
}

// size is how many keys the index holds.
func (a *activeKeys) size() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.keys)
}

// prune forgets the keys not served since the last prune with no live
// lease at now (see activeKeys) and gives the map's room back once it has
// mostly emptied.
func (a *activeKeys) prune(now time.Time, ttl time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, e := range a.keys {
		if !e.seen && (e.live <= 0 || now.Sub(e.at) >= ttl) {
			delete(a.keys, k)
			continue
		}
		if e.seen {
			e.seen = false
			a.keys[k] = e
		}
	}
	a.keys = shrink.Map(a.keys, &a.peak)
}
