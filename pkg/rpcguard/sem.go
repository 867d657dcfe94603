package rpcguard

import (
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
type sem struct {
	used, waiting int
	waiters       []*waiter
	refs          int
}

type waiter struct {
	n     int
	ready chan struct{}
	done  bool // granted (under pool.mu)
}

// hold is a turn granted by a pool; release ends it, once.
type hold[K comparable] struct {
	p   *pool[K]
	key K
	s   *sem
	n   int
}

// acquire waits for n units of key's semaphore (n is clamped to the cap)
// and returns the turn, or errQueueFull when key's queue holds its cap, or
// ctx's error when ctx ends first. onWait is called when the call has to
// wait.
func (p *pool[K]) acquire(ctx context.Context, key K, n int, onWait func()) (hold[K], error) {
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
	if len(s.waiters) == 0 && s.used+n <= p.cap {
		s.used += n
		s.refs++
		p.mu.Unlock()
		return hold[K]{p, key, s, n}, nil
	}
	if s.waiting+n > p.queue {
		if s.refs == 0 {
			p.dropLocked(key, s)
		}
		p.mu.Unlock()
		return hold[K]{}, errQueueFull
	}
	w := &waiter{n: n, ready: make(chan struct{})}
	s.waiters = append(s.waiters, w)
	s.waiting += n
	s.refs++
	p.mu.Unlock()
	onWait()
	select {
	case <-w.ready:
		return hold[K]{p, key, s, n}, nil
	case <-ctx.Done():
		p.mu.Lock()
		if w.done {
			// Granted as the context ended: give the turn back.
			p.mu.Unlock()
			hold[K]{p, key, s, n}.release()
			return hold[K]{}, ctx.Err()
		}
		for i, x := range s.waiters {
			if x == w {
				s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
				break
			}
		}
		s.waiting -= n
		p.grantLocked(s) // a large head leaving may let the next ones in
		p.unrefLocked(key, s)
		p.mu.Unlock()
		return hold[K]{}, ctx.Err()
	}
}

// release ends the turn. Call it exactly once per turn.
func (h hold[K]) release() {
	p := h.p
	p.mu.Lock()
	h.s.used -= h.n
	p.grantLocked(h.s)
	p.unrefLocked(h.key, h.s)
	p.mu.Unlock()
}

func (p *pool[K]) grantLocked(s *sem) {
	for len(s.waiters) > 0 && s.used+s.waiters[0].n <= p.cap {
		w := s.waiters[0]
		s.waiters = s.waiters[1:]
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
		*s = sem{}
		p.free = append(p.free, s)
	}
}
