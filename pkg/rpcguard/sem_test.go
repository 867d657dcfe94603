package rpcguard

import (
	"context"
	"errors"
	"runtime"
	"testing"
)

// TestPoolIsFirstComeAndBounded: a call that does not fit waits behind
// earlier waiters, the queue refuses past its cap, a waiter that gives up
// lets the next ones in, and a key's state is gone once nothing holds it.
func TestPoolIsFirstComeAndBounded(t *testing.T) {
	p := pool{cap: 10, queue: 10, m: map[string]*sem{}}
	ctx := context.Background()
	waits := 0
	onWait := func() { waits++ }
	r1, err := p.acquire(ctx, "c", 8, onWait)
	if err != nil {
		t.Fatal(err)
	}
	// 5 does not fit beside 8: it waits; then 2 would fit but must not
	// pass the waiter.
	big := make(chan func())
	go func() {
		r, err := p.acquire(ctx, "c", 5, func() {})
		if err != nil {
			t.Error(err)
		}
		big <- r
	}()
	waitFor(t, &p, "c", 5)
	cctx, cancel := context.WithCancel(ctx)
	small := make(chan error)
	go func() {
		_, err := p.acquire(cctx, "c", 2, func() {})
		small <- err
	}()
	waitFor(t, &p, "c", 7)
	// The queue holds 7 of its 10 units: 4 more are refused.
	if _, err := p.acquire(ctx, "c", 4, onWait); !errors.Is(err, errQueueFull) {
		t.Fatalf("past the queue: %v, want errQueueFull", err)
	}
	cancel()
	if err := <-small; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	r1()
	r2 := <-big
	r2()
	// Units are clamped to the cap: a call as large as the whole cap runs.
	r3, err := p.acquire(ctx, "c", 50, onWait)
	if err != nil {
		t.Fatal(err)
	}
	r3()
	r3() // idempotent
	if len(p.m) != 0 {
		t.Fatalf("state left behind: %v", p.m)
	}
}

func waitFor(t *testing.T, p *pool, key string, waiting int) {
	t.Helper()
	for {
		p.mu.Lock()
		s := p.m[key]
		got := s != nil && s.waiting == waiting
		p.mu.Unlock()
		if got {
			return
		}
		// The waiter goroutine enqueues itself promptly; yield to it.
		select {
		case <-t.Context().Done():
			t.Fatal("test ended")
		default:
		}
		runtime.Gosched()
	}
}
