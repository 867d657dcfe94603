package regional

import (
	"sync"
	"time"
)

// scriptFailureLogEvery is the least time between two log lines about
// failing calls of one script. A Redis outage fails every caller's call:
// each is counted (sluice_regional_redis_errors_total) but one line a
// second per script says it as well as thousands.
const scriptFailureLogEvery = time.Second

// logThrottle decides which of a run of like events are logged: the
// first of each key, then at most one per interval, each logged line
// carrying how many were left out since the one before. Safe for
// concurrent use.
type logThrottle struct {
	every time.Duration
	mu    sync.Mutex
	last  map[string]time.Time // guarded by mu: key → when last logged
	quiet map[string]int       // guarded by mu: key → left out since then
}

func newLogThrottle(every time.Duration) *logThrottle {
	return &logThrottle{every: every, last: map[string]time.Time{}, quiet: map[string]int{}}
}

// allow reports whether the event of key at now is logged, and if so how
// many events of key were left out since the last logged one. Keys are a
// small set (script names; the classes a config change removed while the
// process ran), so nothing is ever forgotten.
func (t *logThrottle) allow(key string, now time.Time) (ok bool, leftOut int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if last, seen := t.last[key]; seen && now.Sub(last) < t.every {
		t.quiet[key]++
		return false, 0
	}
	t.last[key] = now
	leftOut = t.quiet[key]
	t.quiet[key] = 0
	return true, leftOut
}
