package logthrottle

import (
	"sync"
	"time"
)

// maxKeys is how many keys a Throttle remembers before it forgets those
// whose last line is an interval old with nothing left out since (an
// event of such a key is logged anyway): keys may come from peers.
const maxKeys = 4096

// Throttle spaces the log lines of each key by its interval. Safe for
// concurrent use.
type Throttle struct {
	every time.Duration
	mu    sync.Mutex
	last  map[string]time.Time // guarded by mu: key → when last logged
	quiet map[string]int       // guarded by mu: key → left out since then
}

// New returns a Throttle logging each key at most once per every.
func New(every time.Duration) *Throttle {
	return &Throttle{every: every, last: map[string]time.Time{}, quiet: map[string]int{}}
}

// Allow reports whether the event of key at now is logged, and if so how
// many events of key were left out since the last logged one.
func (t *Throttle) Allow(key string, now time.Time) (ok bool, leftOut int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if last, seen := t.last[key]; seen && now.Sub(last) < t.every {
		t.quiet[key]++
		return false, 0
	}
	t.last[key] = now
	leftOut = t.quiet[key]
	delete(t.quiet, key)
	if len(t.last) > maxKeys {
		for k, at := range t.last {
			if now.Sub(at) >= t.every && t.quiet[k] == 0 {
				delete(t.last, k)
			}
		}
	}
	return true, leftOut
}
