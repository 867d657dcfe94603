package lease

import (
	"hash/maphash"
	"slices"
	"strings"
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
	read atomic.Pointer[keyIndex] // never mutated once stored
	seed [2]maphash.Seed          // of the tenant's and the class's hash
	// ordered: entries lists the keys in key order (TableOptions.OrderedScans).
	// Set before the map is shared.
	ordered bool

	mu     sync.Mutex
	dirty  *keyIndex   // guarded by mu; nil when read is current
	misses int         // guarded by mu
	peak   shrink.Peak // guarded by mu: dirty's high-water mark
	// sorted is the entries in key order while ordered, nil when a key
	// was stored or deleted since they were sorted; never mutated once
	// built. Guarded by mu.
	sorted []*entry
}

// keyIndex finds an entry by its key's 64-bit hash and compares the key
// the entry holds, so each key is stored once, in its entry: a slot costs
// the hash and a pointer instead of the key's two string headers and a
// pointer. A key whose hash another key holds (about never with 64 bits
// and a random seed) is kept in clash.
type keyIndex struct {
	byHash map[uint64]*entry
	clash  map[quota.Key]*entry // nil while empty
}

func (x *keyIndex) get(h uint64, k quota.Key) *entry {
	if e := x.byHash[h]; e != nil && e.is(k) {
		return e
	}
	if x.clash == nil {
		return nil
	}
	return x.clash[k]
}

// put stores e, whose key is not in x, under its key's hash h.
func (x *keyIndex) put(h uint64, e *entry) {
	if x.byHash[h] == nil {
		x.byHash[h] = e
		return
	}
	if x.clash == nil {
		x.clash = map[quota.Key]*entry{}
	}
	x.clash[e.key()] = e
}

// del removes e, stored under its key's hash h.
func (x *keyIndex) del(h uint64, e *entry) {
	if x.byHash[h] == e {
		delete(x.byHash, h)
		return
	}
	if x.clash != nil {
		delete(x.clash, e.key())
		if len(x.clash) == 0 {
			x.clash = nil
		}
	}
}

func (x *keyIndex) len() int { return len(x.byHash) + len(x.clash) }

// clone is a copy of x with room for one more key.
func (x *keyIndex) clone() *keyIndex {
	c := &keyIndex{byHash: make(map[uint64]*entry, len(x.byHash)+1)}
	for h, e := range x.byHash {
		c.byHash[h] = e
	}
	if x.clash != nil {
		c.clash = make(map[quota.Key]*entry, len(x.clash))
		for k, e := range x.clash {
			c.clash[k] = e
		}
	}
	return c
}

func (m *keyMap) hash(k quota.Key) uint64 {
	return maphash.String(m.seed[0], k.Tenant) ^ maphash.String(m.seed[1], k.Class)
}

func newKeyMap() *keyMap {
	m := &keyMap{seed: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
	m.read.Store(&keyIndex{byHash: map[uint64]*entry{}})
	return m
}

// load is the hot-path lookup: no locks, no allocation. It may return an
// entry that was removed since the snapshot was published.
func (m *keyMap) load(k quota.Key) *entry {
	return m.read.Load().get(m.hash(k), k)
}

// lookupFresh returns the current entry for k, consulting the private copy
// when the snapshot is stale. Counts a miss towards the next publish.
func (m *keyMap) lookupFresh(k quota.Key) *entry {
	h := m.hash(k)
	if e := m.read.Load().get(h, k); e != nil && !e.has(removedFlag) {
		return e
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dirty == nil {
		return nil
	}
	e := m.dirty.get(h, k)
	m.misses++
	if m.misses >= m.dirty.len() {
		m.publishLocked()
	}
	return e
}

// loadOrStore returns the current entry for k, or stores and returns
// fresh() (an entry whose key is k) when there is none. fresh runs under
// the map lock.
func (m *keyMap) loadOrStore(k quota.Key, fresh func() *entry) (e *entry, created bool) {
	h := m.hash(k)
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.currentLocked()
	if e := cur.get(h, k); e != nil && !e.has(removedFlag) {
		return e, false
	}
	m.ensureDirtyLocked()
	if old := m.dirty.get(h, k); old != nil {
		m.dirty.del(h, old) // removed: replaced
	}
	e = fresh()
	m.dirty.put(h, e)
	m.sorted = nil
	m.peak.Note(m.dirty.len())
	return e, true
}

// delete removes k if it still maps to e.
func (m *keyMap) delete(k quota.Key, e *entry) {
	h := m.hash(k)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.currentLocked().get(h, k) != e {
		return
	}
	m.ensureDirtyLocked()
	m.dirty.del(h, e)
	m.sorted = nil
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

// entries returns the current entries (safe to iterate unlocked; the
// caller must not modify the slice), in the maps' random order, or sorted
// by key when m.ordered.
func (m *keyMap) entries() []*entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sorted != nil {
		return m.sorted
	}
	cur := m.currentLocked()
	out := make([]*entry, 0, cur.len())
	for _, e := range cur.byHash {
		out = append(out, e)
	}
	for _, e := range cur.clash {
		out = append(out, e)
	}
	if m.ordered {
		slices.SortFunc(out, func(a, b *entry) int {
			if c := strings.Compare(a.tenant, b.tenant); c != 0 {
				return c
			}
			return strings.Compare(a.class.Value(), b.class.Value())
		})
		m.sorted = out
	}
	return out
}

func (m *keyMap) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.currentLocked().len()
}

func (m *keyMap) currentLocked() *keyIndex {
	if m.dirty != nil {
		return m.dirty
	}
	return m.read.Load()
}

func (m *keyMap) ensureDirtyLocked() {
	if m.dirty != nil {
		return
	}
	m.dirty = m.read.Load().clone()
	m.peak.Reset(m.dirty.len())
}

// publishLocked publishes dirty, right-sized if most of its keys were
// removed since it was made (Go maps never shrink), so the room of
// forgotten keys is given back.
func (m *keyMap) publishLocked() {
	m.dirty.byHash = shrink.Map(m.dirty.byHash, &m.peak)
	m.read.Store(m.dirty)
	m.dirty = nil
	m.misses = 0
}
