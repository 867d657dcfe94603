package lease

import (
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/internal/shrink"
	"github.com/sluicehq/sluice/pkg/quota"
)

// keyMap maps quota keys to entries with lock-free reads of a published,
// immutable snapshot. Writes go to a private copy (dirty) that is published
// once enough reads have missed the snapshot, so inserting n keys copies the
// map O(1) times per n lookups instead of once per insert. Removed entries
// may linger in the snapshot until the next publish; readers check
// entry.removed and fall back to lookupFresh. Safe for concurrent use.
type keyMap struct {
	read atomic.Pointer[map[quota.Key]*entry] // never mutated once stored

	mu     sync.Mutex
	dirty  map[quota.Key]*entry // guarded by mu; nil when read is current
	misses int                  // guarded by mu
	peak   shrink.Peak          // guarded by mu: dirty's high-water mark
}

func newKeyMap() *keyMap {
	m := &keyMap{}
	empty := map[quota.Key]*entry{}
	m.read.Store(&empty)
	return m
}

// load is the hot-path lookup: no locks, no allocation. It may return an
// entry that was removed since the snapshot was published.
func (m *keyMap) load(k quota.Key) *entry {
	return (*m.read.Load())[k]
}

// lookupFresh returns the current entry for k, consulting the private copy
// when the snapshot is stale. Counts a miss towards the next publish.
func (m *keyMap) lookupFresh(k quota.Key) *entry {
	if e := m.load(k); e != nil && !e.removed.Load() {
		return e
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dirty == nil {
		return nil
	}
	e := m.dirty[k]
	m.misses++
	if m.misses >= len(m.dirty) {
		m.publishLocked()
	}
	return e
}

// loadOrStore returns the current entry for k, or stores and returns
// fresh() when there is none. fresh runs under the map lock.
func (m *keyMap) loadOrStore(k quota.Key, fresh func() *entry) (e *entry, created bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.currentLocked()
	if e := cur[k]; e != nil && !e.removed.Load() {
		return e, false
	}
	m.ensureDirtyLocked()
	e = fresh()
	m.dirty[k] = e
	m.peak.Note(len(m.dirty))
	return e, true
}

// delete removes k if it still maps to e.
func (m *keyMap) delete(k quota.Key, e *entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.currentLocked()[k] != e {
		return
	}
	m.ensureDirtyLocked()
	delete(m.dirty, k)
}

// publish makes every change visible to load; used after removing a batch
// of keys so stale entries do not linger in the snapshot.
func (m *keyMap) publish() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dirty != nil {
		m.publishLocked()
	}
}

// entries returns the current entries (a copy; safe to iterate unlocked).
func (m *keyMap) entries() []*entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.currentLocked()
	out := make([]*entry, 0, len(cur))
	for _, e := range cur {
		out = append(out, e)
	}
	return out
}

func (m *keyMap) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.currentLocked())
}

func (m *keyMap) currentLocked() map[quota.Key]*entry {
	if m.dirty != nil {
		return m.dirty
	}
	return *m.read.Load()
}

func (m *keyMap) ensureDirtyLocked() {
	if m.dirty != nil {
		return
	}
	src := *m.read.Load()
	m.dirty = make(map[quota.Key]*entry, len(src)+1)
	for k, e := range src {
		m.dirty[k] = e
	}
	m.peak.Reset(len(m.dirty))
}

// publishLocked publishes dirty, right-sized if most of its keys were
// removed since it was made (Go maps never shrink), so the room of
// forgotten keys is given back.
func (m *keyMap) publishLocked() {
	d := shrink.Map(m.dirty, &m.peak)
	m.read.Store(&d)
	m.dirty = nil
	m.misses = 0
}
