package rpcguard

import (
	"context"
	"errors"
	"sync"
)

var errQueueFull = errors.New("queue full")

// pool holds one weighted semaphore per key (a connection, an identity);
// a key's semaphore lives while calls hold or wait for it.
type pool struct {
	cap, queue int
	mu         sync.Mutex
	m          map[string]*sem
}

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

func (p *pool) acquire(ctx context.Context, key string, n int, onWait func()) (func(), error) {
	n = min(n, p.cap)
	p.mu.Lock()
	s := p.m[key]
	if s == nil {
		s = &sem{}
		p.m[key] = s
	}
	if len(s.waiters) == 0 && s.used+n <= p.cap {
		s.used += n
		s.refs++
		p.mu.Unlock()
		return p.releaser(key, s, n), nil
	}
	if s.waiting+n > p.queue {
		if s.refs == 0 {
			delete(p.m, key)
		}
		p.mu.Unlock()
		return nil, errQueueFull
	}
	w := &waiter{n: n, ready: make(chan struct{})}
	s.waiters = append(s.waiters, w)
	s.waiting += n
	s.refs++
	p.mu.Unlock()
	onWait()
	select {
	case <-w.ready:
		return p.releaser(key, s, n), nil
	case <-ctx.Done():
		p.mu.Lock()
		if w.done {
			// Granted as the context ended: give the turn back.
			p.mu.Unlock()
			p.releaser(key, s, n)()
			return nil, ctx.Err()
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
		return nil, ctx.Err()
	}
}

func (p *pool) releaser(key string, s *sem, n int) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			s.used -= n
			p.grantLocked(s)
			p.unrefLocked(key, s)
			p.mu.Unlock()
		})
	}
}

func (p *pool) grantLocked(s *sem) {
	for len(s.waiters) > 0 && s.used+s.waiters[0].n <= p.cap {
		w := s.waiters[0]
		s.waiters = s.waiters[1:]
		s.waiting -= w.n
		s.used += w.n
		w.done = true
		close(w.ready)
	}
}

func (p *pool) unrefLocked(key string, s *sem) {
	s.refs--
	if s.refs == 0 && p.m[key] == s {
		delete(p.m, key)
	}
}
