package rpcguard

import (
	"container/heap"
	"context"
	"errors"
	"sync"
)

var errQueueFull = errors.New("queue full")

// pool holds one weighted semaphore per key (a connection, an identity);
// a key's semaphore lives while calls hold or wait for it.
type pool[K comparable] struct {
	cap, queue int
	mu         sync.Mutex
	m          map[K]*sem
	// free keeps a few semaphores whose key went idle, for the next key:
	// a connection whose calls come one or two at a time has no call in
	// flight between them.
	free []*sem
}

// maxFree bounds pool.free.
const maxFree = 64

// sem is a weighted first-come semaphore: a call that does not fit waits
// behind every earlier waiter, so a stream of small calls cannot pass a
// large one forever.
//
// Calls that name a sub-key (an identity's connections) are shared out
// between the sub-keys instead: a sub-key's own calls keep their order,
// and the next turn goes to the sub-key with the fewest units in flight
// and waiting (the earliest waiter among equals). Instances sharing a
// certificate share its identity's cap, so one of them sending more than
// its share does not queue the others' calls behind its own; it waits
// behind them.
type sem struct {
	used, waiting int
	waiters       []*waiter // calls without a sub-key
	refs          int
	subs          map[any]*subQueue // calls with one
	order         subHeap           // the sub-keys with waiters, next turn first
	spare         []*subQueue       // for reuse, as pool.free
	seq           uint64            // arrival order of waiters
}

// subQueue is one sub-key's calls at a semaphore.
type subQueue struct {
	key     any
	load    int       // units in flight and waiting
	waiters []*waiter // first come first
	index   int       // in sem.order; -1 when it has no waiter
}

// subHeap orders sub-keys with waiters: least load first, then the
// earliest first waiter.
type subHeap []*subQueue

func (h subHeap) Len() int { return len(h) }
func (h subHeap) Less(i, j int) bool {
	if h[i].load != h[j].load {
		return h[i].load < h[j].load
	}
	return h[i].waiters[0].seq < h[j].waiters[0].seq
}
func (h subHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *subHeap) Push(x any) {
	q := x.(*subQueue)
	q.index = len(*h)
	*h = append(*h, q)
}
func (h *subHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	q.index = -1
	return q
}

type waiter struct {
	n     int
	seq   uint64
	ready chan struct{}
	done  bool // granted (under pool.mu)
}

// hold is a turn granted by a pool; release ends it, once.
type hold[K comparable] struct {
	p   *pool[K]
	key K
	s   *sem
	n   int
	sub *subQueue // nil without a sub-key
}

// acquire waits for n units of key's semaphore (n is clamped to the cap)
// and returns the turn, or errQueueFull when key's queue holds its cap, or
// ctx's error when ctx ends first. onWait is called when the call has to
// wait.
func (p *pool[K]) acquire(ctx context.Context, key K, n int, onWait func()) (hold[K], error) {
	return p.acquireFor(ctx, key, nil, n, onWait)
}

// acquireFor is acquire for a call of sub-key sub (nil: none): the turns
// of key are shared out between its sub-keys (sem).
func (p *pool[K]) acquireFor(ctx context.Context, key K, sub any, n int, onWait func()) (hold[K], error) {
	n = min(n, p.cap)
	p.mu.Lock()
	s := p.m[key]
	if s == nil {
		if k := len(p.free); k > 0 {
			s, p.free = p.free[k-1], p.free[:k-1]
		} else {
			s = &sem{}
		}
		p.m[key] = s
	}
	if sub != nil {
		return p.acquireSub(ctx, key, s, sub, n, onWait)
	}
	if len(s.waiters) == 0 && s.used+n <= p.cap {
		s.used += n
		s.refs++
		p.mu.Unlock()
		return hold[K]{p, key, s, n, nil}, nil
	}
	if s.waiting+n > p.queue {
		if s.refs == 0 {
			p.dropLocked(key, s)
		}
		p.mu.Unlock()
		return hold[K]{}, errQueueFull
	}
	w := s.newWaiter(n)
	s.waiters = append(s.waiters, w)
	return p.await(ctx, hold[K]{p, key, s, n, nil}, w, onWait)
}

// newWaiter is a waiter for n units, next in s's arrival order, counted
// as waiting.
func (s *sem) newWaiter(n int) *waiter {
	s.seq++
	s.waiting += n
	s.refs++
	return &waiter{n: n, seq: s.seq, ready: make(chan struct{})}
}

// await waits for w, queued for the turn h (in h.sub's waiters when it
// has a sub-key, else in the semaphore's), and returns h, or ctx's error
// with w taken out of its queue. p.mu is held on entry, unlocked on
// return.
func (p *pool[K]) await(ctx context.Context, h hold[K], w *waiter, onWait func()) (hold[K], error) {
	p.mu.Unlock()
	onWait()
	select {
	case <-w.ready:
		return h, nil
	case <-ctx.Done():
		p.mu.Lock()
		if w.done {
			// Granted as the context ended: give the turn back.
			p.mu.Unlock()
			h.release()
			return hold[K]{}, ctx.Err()
		}
		s, q := h.s, h.sub
		s.waiting -= h.n
		if q != nil {
			q.waiters = withoutWaiter(q.waiters, w)
			q.load -= h.n
			p.reorderLocked(s, q)
		} else {
			s.waiters = withoutWaiter(s.waiters, w)
		}
		p.grantLocked(s) // a large head leaving may let the next ones in
		p.unrefLocked(h.key, s)
		p.mu.Unlock()
		return hold[K]{}, ctx.Err()
	}
}

// withoutWaiter is ws without w, in place.
func withoutWaiter(ws []*waiter, w *waiter) []*waiter {
	for i, x := range ws {
		if x == w {
			return append(ws[:i], ws[i+1:]...)
		}
	}
	return ws
}

// acquireSub is acquireFor with a sub-key, under p.mu, which it unlocks.
func (p *pool[K]) acquireSub(ctx context.Context, key K, s *sem, sub any, n int, onWait func()) (hold[K], error) {
	q := s.subs[sub]
	if q == nil {
		if s.subs == nil {
			s.subs = map[any]*subQueue{}
		}
		if k := len(s.spare); k > 0 {
			q, s.spare = s.spare[k-1], s.spare[:k-1]
		} else {
			q = &subQueue{}
		}
		q.key, q.index = sub, -1
		s.subs[sub] = q
	}
	// A call goes at once when it fits and no sub-key with as few units
	// (its own included) waits.
	if len(s.waiters) == 0 && len(q.waiters) == 0 && s.used+n <= p.cap &&
		(len(s.order) == 0 || s.order[0].load > q.load) {
		s.used += n
		q.load += n
		s.refs++
		p.mu.Unlock()
		return hold[K]{p, key, s, n, q}, nil
	}
	if s.waiting+n > p.queue {
		if q.load == 0 {
			s.forget(q)
		}
		if s.refs == 0 {
			p.dropLocked(key, s)
		}
		p.mu.Unlock()
		return hold[K]{}, errQueueFull
	}
	w := s.newWaiter(n)
	q.waiters = append(q.waiters, w)
	q.load += n
	p.reorderLocked(s, q)
	return p.await(ctx, hold[K]{p, key, s, n, q}, w, onWait)
}

// reorderLocked puts q in its place in s.order after its load or waiters
// changed, and forgets it once it holds nothing.
func (p *pool[K]) reorderLocked(s *sem, q *subQueue) {
	switch {
	case len(q.waiters) == 0 && q.index >= 0:
		heap.Remove(&s.order, q.index)
	case len(q.waiters) > 0 && q.index < 0:
		heap.Push(&s.order, q)
	case q.index >= 0:
		heap.Fix(&s.order, q.index)
	}
	if q.load == 0 && len(q.waiters) == 0 && s.subs[q.key] == q {
		s.forget(q)
	}
}

// forget drops q, which holds nothing, keeping it for the next sub-key.
func (s *sem) forget(q *subQueue) {
	delete(s.subs, q.key)
	if len(s.spare) < maxFree {
		*q = subQueue{waiters: q.waiters[:0], index: -1}
		s.spare = append(s.spare, q)
	}
}

// release ends the turn. Call it exactly once per turn.
func (h hold[K]) release() {
	p := h.p
	p.mu.Lock()
	h.s.used -= h.n
	if h.sub != nil {
		h.sub.load -= h.n
		p.reorderLocked(h.s, h.sub)
	}
	p.grantLocked(h.s)
	p.unrefLocked(h.key, h.s)
	p.mu.Unlock()
}

func (p *pool[K]) grantLocked(s *sem) {
	for {
		// The next turn: the earliest waiter without a sub-key, or the
		// first of the sub-key due next, whichever came first between
		// the two kinds (a key's calls carry sub-keys or none alike).
		var w *waiter
		var q *subQueue
		switch {
		case len(s.waiters) > 0 && (len(s.order) == 0 || s.waiters[0].seq < s.order[0].waiters[0].seq):
			w = s.waiters[0]
		case len(s.order) > 0:
			q = s.order[0]
			w = q.waiters[0]
		default:
			return
		}
		if s.used+w.n > p.cap {
			return
		}
		if q != nil {
			q.waiters = q.waiters[1:]
			p.reorderLocked(s, q)
		} else {
			s.waiters = s.waiters[1:]
		}
		s.waiting -= w.n
		s.used += w.n
		w.done = true
		close(w.ready)
	}
}

func (p *pool[K]) unrefLocked(key K, s *sem) {
	s.refs--
	if s.refs == 0 {
		p.dropLocked(key, s)
	}
}

// dropLocked forgets key's semaphore, which nothing holds or waits for,
// and keeps it for reuse.
func (p *pool[K]) dropLocked(key K, s *sem) {
	if p.m[key] != s {
		return
	}
	delete(p.m, key)
	if len(p.free) < maxFree {
		// Clean, keeping what the next key reuses.
		*s = sem{subs: s.subs, order: s.order[:0], spare: s.spare}
		p.free = append(p.free, s)
	}
}
