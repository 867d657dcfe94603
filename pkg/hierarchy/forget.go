package hierarchy

import (
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// ForgetHorizon is how long a key must go unnamed (no region reported it
// and no answer carried a grant for it) before the global tier may forget
// it (RemoveKey): 2·validity + 2·epoch. Every grant is valid for at most
// one validity from the answer that carried it; the rest is margin for an
// answer still in flight and a report that straddles an epoch, so no
// region can hold a grant for a key that is forgotten.
func ForgetHorizon(epoch, validity time.Duration) time.Duration {
	return 2*validity + 2*epoch
}

// Forgettable reports whether a key last named at lastSeen may be
// forgotten at now: unnamed for longer than ForgetHorizon, and not before
// learnFloor. The floor is set when the epoch, validity or demand alpha
// changes and the allocator is rebuilt (grants issued under the old
// validity may outlive the new horizon); it is the zero time when they
// never changed. ForgetIdle decides with it, for the allocator service
// and the simulator's global tiers alike.
func Forgettable(now, lastSeen, learnFloor time.Time, epoch, validity time.Duration) bool {
	return !now.Before(learnFloor) && now.Sub(lastSeen) > ForgetHorizon(epoch, validity)
}

// ForgetIdle removes every key that may be forgotten at now (Forgettable
// with the Allocator's own epoch and validity, and learnFloor): no report
// named it and no answer carried a grant for it for longer than
// ForgetHorizon. A key set by SetLimit counts as named at the latest time
// the Allocator had seen then. It returns how many keys it removed. The
// Allocator keeps when each key was last named next to the key's other
// state, so a report costs no lookup in a map of every key to keep it
// (the global daemon kept a map of its own, which cost a steady epoch
// about as much as the allocation; BENCHMARKS.md, "The daemon's
// per-key maps"). O(keys).
func (a *Allocator) ForgetIdle(now, learnFloor time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.Before(learnFloor) {
		return 0
	}
	at := a.wall(a.peek(now))
	epoch, validity := time.Duration(a.epochNS), time.Duration(a.validity)
	n := 0
	for k := range a.keys {
		if a.keyLive[k] && Forgettable(at, a.wall(a.named[k]), learnFloor, epoch, validity) {
			a.removeLocked(int32(k))
			n++
		}
	}
	if n > 0 {
		a.compactLocked()
	}
	return n
}

// Keys returns the keys the Allocator holds a limit for, in no particular
// order.
func (a *Allocator) Keys() []quota.Key {
	a.mu.Lock()
	defer a.mu.Unlock()
	keys := make([]quota.Key, 0, len(a.keyIndex))
	for k, live := range a.keyLive {
		if live {
			keys = append(keys, a.keys[k])
		}
	}
	return keys
}

// NumKeys returns how many keys the Allocator holds a limit for.
func (a *Allocator) NumKeys() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.keyIndex)
}

// LastNamed returns when a report last named key or an answer last
// carried a grant for it, as ForgetIdle counts it, and false for a key
// the Allocator holds no limit for.
func (a *Allocator) LastNamed(key quota.Key) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.keyIndex[key]
	if !ok {
		return time.Time{}, false
	}
	return a.wall(a.named[k]), true
}
