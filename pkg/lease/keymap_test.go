package lease

import (
	"fmt"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/pkg/quota"
)

// Concurrent readers always find every key stored before they look, while
// writers insert and delete; deleted keys disappear after publish.
func TestKeyMapConcurrent(t *testing.T) {
	m := newKeyMap()
	key := func(i int) quota.Key { return quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "c"} }
	const n = 2000
	var wg sync.WaitGroup
	stored := make(chan int, n)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(stored)
		for i := 0; i < n; i++ {
			k := key(i)
			m.loadOrStore(k, func() *entry { return newKeyEntry(k) })
			stored <- i
		}
	}()
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range stored {
				if e := m.lookupFresh(key(i)); e == nil || !e.is(key(i)) {
					t.Errorf("key %d stored but not found", i)
				}
			}
		}()
	}
	wg.Wait()
	if m.len() != n {
		t.Fatalf("len %d, want %d", m.len(), n)
	}
	for i := 0; i < n; i += 2 {
		e := m.lookupFresh(key(i))
		e.set(removedFlag, true)
		m.delete(key(i), e)
	}
	m.publish()
	for i := 0; i < n; i++ {
		got := m.load(key(i))
		if (got == nil) != (i%2 == 0) {
			t.Fatalf("key %d: present=%v after deleting even keys", i, got != nil)
		}
	}
	// A replaced key is not deleted by a stale delete.
	k := key(1)
	old := m.lookupFresh(k)
	old.set(removedFlag, true)
	m.delete(k, old)
	fresh, created := m.loadOrStore(k, func() *entry { return newKeyEntry(k) })
	if !created {
		t.Fatal("removed key not re-created")
	}
	m.delete(k, old)
	if m.lookupFresh(k) != fresh {
		t.Fatal("stale delete removed the fresh entry")
	}
}

// Keys whose hashes are equal are told apart by the keys their entries
// hold: each is found, and removing one leaves the other.
func TestKeyIndexSharedHash(t *testing.T) {
	const h = 42
	a := newKeyEntry(quota.Key{Tenant: "a", Class: "c"})
	b := newKeyEntry(quota.Key{Tenant: "b", Class: "c"})
	c := quota.Key{Tenant: "c", Class: "c"}
	x := &keyIndex{byHash: map[uint64]*entry{}}
	x.put(h, a)
	x.put(h, b)
	if x.len() != 2 || x.get(h, a.key()) != a || x.get(h, b.key()) != b || x.get(h, c) != nil {
		t.Fatalf("after two keys under one hash: len %d, a %v, b %v, c %v", x.len(), x.get(h, a.key()), x.get(h, b.key()), x.get(h, c))
	}
	y := x.clone()
	x.del(h, a)
	if x.len() != 1 || x.get(h, a.key()) != nil || x.get(h, b.key()) != b {
		t.Fatalf("after removing the first: len %d, a %v, b %v", x.len(), x.get(h, a.key()), x.get(h, b.key()))
	}
	x.put(h, a)
	x.del(h, b)
	x.del(h, a)
	if x.len() != 0 || x.clash != nil {
		t.Fatalf("after removing both: len %d, clash %v", x.len(), x.clash)
	}
	if y.len() != 2 || y.get(h, a.key()) != a || y.get(h, b.key()) != b {
		t.Fatal("a copy changed with its original")
	}
}

// A stale delete (of an entry already removed and replaced) leaves the
// fresh entry of the key, also when the key shares its hash with another
// (here every key whose tenant and class are equal hashes to 0).
func TestKeyMapStaleDeleteOfASharedHash(t *testing.T) {
	m := newKeyMap()
	m.seed[1] = m.seed[0]
	a, b := quota.Key{Tenant: "x", Class: "x"}, quota.Key{Tenant: "y", Class: "y"}
	if m.hash(a) != m.hash(b) {
		t.Fatal("keys do not share their hash")
	}
	ea, _ := m.loadOrStore(a, func() *entry { return newKeyEntry(a) })
	old, _ := m.loadOrStore(b, func() *entry { return newKeyEntry(b) })
	old.set(removedFlag, true)
	m.delete(b, old)
	fresh, created := m.loadOrStore(b, func() *entry { return newKeyEntry(b) })
	if !created {
		t.Fatal("removed key not re-created")
	}
	m.delete(b, old)
	if got := m.lookupFresh(b); got != fresh {
		t.Fatalf("after a stale delete: entry %p, want the fresh %p", got, fresh)
	}
	if got := m.lookupFresh(a); got != ea || m.len() != 2 {
		t.Fatalf("after a stale delete: other key's entry %p (want %p), %d keys (want 2)", got, ea, m.len())
	}
}

// A key being forgotten (marked removed, its delete not yet done) is made
// afresh by the next loadOrStore, which finds the fresh entry from then on,
// also after the late delete of the removed one; a key that is not being
// forgotten is found, not made again.
func TestKeyMapRemakesAKeyBeingForgotten(t *testing.T) {
	m := newKeyMap()
	k := quota.Key{Tenant: "t", Class: "c"}
	old, created := m.loadOrStore(k, func() *entry { return newKeyEntry(k) })
	if !created {
		t.Fatal("first loadOrStore made nothing")
	}
	if again, created := m.loadOrStore(k, func() *entry { return newKeyEntry(k) }); created || again != old {
		t.Fatalf("loadOrStore of a held key: created %v, same entry %v; want the held one", created, again == old)
	}
	old.set(removedFlag, true)
	fresh, created := m.loadOrStore(k, func() *entry { return newKeyEntry(k) })
	if !created || fresh == old {
		t.Fatalf("loadOrStore of a key being forgotten: created %v, same entry %v; want a fresh one", created, fresh == old)
	}
	for _, when := range []string{"before", "after"} {
		if got := m.lookupFresh(k); got != fresh {
			t.Fatalf("%s the late delete: lookupFresh found the fresh entry %v", when, got == fresh)
		}
		m.delete(k, old)
	}
	m.publish()
	if got := m.load(k); got != fresh || m.len() != 1 {
		t.Fatalf("after publishing: load found the fresh entry %v, %d keys; want it and 1", got == fresh, m.len())
	}
}

// Keys of distinct hashes are kept by their hash alone: the clash map,
// which holds a key's two strings beside its entry, is never made for
// them.
func TestKeyIndexKeepsKeysByHashAlone(t *testing.T) {
	m := newKeyMap()
	const n = 100
	for i := range n {
		k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "c"}
		m.loadOrStore(k, func() *entry { return newKeyEntry(k) })
	}
	m.publish()
	if x := m.read.Load(); x.clash != nil || len(x.byHash) != n {
		t.Fatalf("%d keys of distinct hashes: %d kept by hash, %d in the clash map; want all by hash", n, len(x.byHash), len(x.clash))
	}
}
