package rpcguard

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"testing"

	"google.golang.org/grpc/peer"
)

// TestPoolIsFirstComeAndBounded: a call that does not fit waits behind
// earlier waiters, the queue refuses past its cap, a waiter that gives up
// lets the next ones in, and a key's state is gone once nothing holds it.
func TestPoolIsFirstComeAndBounded(t *testing.T) {
	p := pool[string]{cap: 10, queue: 10, m: map[string]*sem{}}
	ctx := context.Background()
	waits := 0
	onWait := func() { waits++ }
	r1, err := p.acquire(ctx, "c", 8, onWait)
	if err != nil {
		t.Fatal(err)
	}
	// 5 does not fit beside 8: it waits; then 2 would fit but must not
	// pass the waiter.
	big := make(chan hold[string])
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
	r1.release()
	r2 := <-big
	r2.release()
	// Units are clamped to the cap: a call as large as the whole cap runs.
	r3, err := p.acquire(ctx, "c", 50, onWait)
	if err != nil {
		t.Fatal(err)
	}
	r3.release()
	if len(p.m) != 0 {
		t.Fatalf("state left behind: %v", p.m)
	}
}

func waitFor(t *testing.T, p *pool[string], key string, waiting int) {
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

// TestAdmitEndsOnce: the function Admit returns ends the call's turn once
// however often it is called, so a second call cannot hand the turn of a
// semaphore reused for another connection back.
func TestAdmitEndsOnce(t *testing.T) {
	g, err := New(Options{PerConnection: 2, Identity: func(context.Context) string { return "id" }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}})
	done, err := g.Admit(ctx, "/s/m", nil)
	if err != nil {
		t.Fatal(err)
	}
	other := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2}})
	done()
	held, err := g.admit(other, "/s/m", nil) // may reuse the first one's semaphores
	if err != nil {
		t.Fatal(err)
	}
	done()
	if s := g.conns.m[connKey(other)]; s == nil || s.used != 1 {
		t.Fatalf("the second connection's semaphore after the first's done ran twice: %+v, want 1 unit used", s)
	}
	if s := g.ids.m["id"]; s == nil || s.used != 1 {
		t.Fatalf("the identity's semaphore after the first's done ran twice: %+v, want 1 unit used", s)
	}
	held.end()
	if len(g.conns.m) != 0 || len(g.ids.m) != 0 {
		t.Fatalf("state left behind: %v %v", g.conns.m, g.ids.m)
	}
}

// TestConnectionKey: a TCP connection is keyed by its address value (one
// per connection in gRPC's transport), so two connections from equal
// address text are still two; other addresses are keyed by their text.
func TestConnectionKey(t *testing.T) {
	a := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5000}
	b := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5000}
	on := func(addr net.Addr) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{Addr: addr})
	}
	if connKey(on(a)) != connKey(on(a)) || connKey(on(a)) == connKey(on(b)) {
		t.Error("a TCP connection's key is not its address value")
	}
	if k := connKey(on(dummyAddr("x"))); k != "x" {
		t.Errorf("key %v of another address, want its text", k)
	}
	if k := connKey(context.Background()); k != "" {
		t.Errorf("key %v without a peer, want \"\"", k)
	}
}

type dummyAddr string

func (d dummyAddr) Network() string { return "dummy" }
func (d dummyAddr) String() string  { return string(d) }

// TestAdmittedCallAllocatesNothing: what the interceptors do per call
// (weigh it, take and end its connection's and identity's turns)
// allocates nothing once the semaphores exist.
func TestAdmittedCallAllocatesNothing(t *testing.T) {
	g, err := New(Options{Identity: func(context.Context) string { return "id" }, Rules: map[string]Rule{
		"/s/m": {Units: func(req any) int { return 1 }, Max: 10, Bound: "b"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}})
	n := testing.AllocsPerRun(200, func() {
		tr, err := g.admit(ctx, "/s/m", ctx)
		if err != nil {
			t.Fatal(err)
		}
		tr.end()
	})
	if n != 0 {
		t.Errorf("%v allocations per admitted call, want 0", n)
	}
}

// TestPoolGrantsWhatFitsAtOnce: a release or a waiter giving up grants
// every waiter at the head of the queue that fits, exactly up to the cap,
// before it returns; idle semaphores are kept for reuse up to maxFree,
// clean.
func TestPoolGrantsWhatFitsAtOnce(t *testing.T) {
	p := pool[string]{cap: 10, queue: 20, m: map[string]*sem{}}
	ctx := context.Background()
	acquired := func(n int) hold[string] {
		t.Helper()
		h, err := p.acquire(ctx, "c", n, func() { t.Errorf("%d units waited beside %d of 10", n, p.m["c"].used) })
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	r1, r2 := acquired(5), acquired(5) // exactly the cap
	type result struct {
		h   hold[string]
		err error
	}
	wait := func(ctx context.Context, n int) chan result {
		ch := make(chan result, 1)
		go func() {
			h, err := p.acquire(ctx, "c", n, func() {})
			ch <- result{h, err}
		}()
		return ch
	}
	state := func() (used, waiting int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.m["c"].used, p.m["c"].waiting
	}
	// A large waiter heads the queue, a small one waits behind it.
	bigCtx, giveUp := context.WithCancel(ctx)
	big := wait(bigCtx, 8)
	waitFor(t, &p, "c", 8)
	small := wait(ctx, 5)
	waitFor(t, &p, "c", 13)
	// Releasing 5 lets the small one fit exactly, but it may not pass the
	// large one; when the large one gives up, the small one is granted
	// before the large one's call returns.
	r1.release()
	if used, waiting := state(); used != 5 || waiting != 13 {
		t.Fatalf("after a release behind a large head: %d used, %d waiting; want 5, 13", used, waiting)
	}
	giveUp()
	if r := <-big; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the large waiter: %v, want context.Canceled", r.err)
	}
	if used, waiting := state(); used != 10 || waiting != 0 {
		t.Fatalf("after the head gave up: %d used, %d waiting; want 10, 0", used, waiting)
	}
	r3 := <-small
	if r3.err != nil {
		t.Fatal(r3.err)
	}
	// A release grants a waiter that fits exactly up to the cap at once.
	next := wait(ctx, 5)
	waitFor(t, &p, "c", 5)
	r2.release()
	select {
	case r := <-next:
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.h.release()
	default:
		if used, waiting := state(); used != 10 || waiting != 0 {
			t.Fatalf("after a release: %d used, %d waiting; want the waiter of 5 granted", used, waiting)
		}
		(<-next).h.release()
	}
	r3.h.release()
	if len(p.m) != 0 || len(p.free) != 1 {
		t.Fatalf("after every turn ended: %d semaphores, %d kept free; want 0, 1", len(p.m), len(p.free))
	}

	// Idle semaphores are kept up to maxFree, clean, and reused.
	var holds []hold[string]
	for i := range maxFree + 2 {
		h, err := p.acquire(ctx, strconv.Itoa(i), 1, func() {})
		if err != nil {
			t.Fatal(err)
		}
		holds = append(holds, h)
	}
	if len(p.free) != 0 {
		t.Fatalf("%d semaphores kept free while every one is in use", len(p.free))
	}
	for _, h := range holds {
		h.release()
	}
	if len(p.m) != 0 || len(p.free) != maxFree {
		t.Fatalf("%d semaphores, %d kept free; want 0, %d", len(p.m), len(p.free), maxFree)
	}
	for _, s := range p.free {
		if s.used != 0 || s.waiting != 0 || s.refs != 0 || len(s.waiters) != 0 {
			t.Fatalf("a semaphore kept free is not clean: %+v", s)
		}
	}
}

// TestWaiterGivingUpLeavesTheQueue: a waiter behind the head that gives
// up takes nothing from the units in use and leaves the queue, whose room
// it frees.
func TestWaiterGivingUpLeavesTheQueue(t *testing.T) {
	p := pool[string]{cap: 10, queue: 10, m: map[string]*sem{}}
	ctx := context.Background()
	held, err := p.acquire(ctx, "c", 8, func() {})
	if err != nil {
		t.Fatal(err)
	}
	head := make(chan hold[string], 1)
	go func() {
		h, err := p.acquire(ctx, "c", 5, func() {})
		if err != nil {
			t.Error(err)
		}
		head <- h
	}()
	waitFor(t, &p, "c", 5)
	behindCtx, giveUp := context.WithCancel(ctx)
	behind := make(chan error, 1)
	go func() {
		_, err := p.acquire(behindCtx, "c", 2, func() {})
		behind <- err
	}()
	waitFor(t, &p, "c", 7)
	giveUp()
	if err := <-behind; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter that gave up: %v", err)
	}
	p.mu.Lock()
	s := p.m["c"]
	used, waiting, waiters := s.used, s.waiting, len(s.waiters)
	p.mu.Unlock()
	if used != 8 || waiting != 5 || waiters != 1 {
		t.Fatalf("after a waiter gave up: %d used, %d waiting in %d waiters; want 8, 5 in 1", used, waiting, waiters)
	}
	held.release()
	(<-head).release()
	if len(p.m) != 0 {
		t.Fatalf("state left behind: %v", p.m)
	}
}

// TestWaiterGrantedAsItGivesUpGivesTheTurnBack: a waiter whose turn is
// granted as its context ends, and that sees the end first, gives the
// granted units back; the units in use are again those of the turns held.
// Which of the two a waiter sees is select's random choice, so the test
// repeats until it saw both.
func TestWaiterGrantedAsItGivesUpGivesTheTurnBack(t *testing.T) {
	p := pool[string]{cap: 2, queue: 2, m: map[string]*sem{}}
	ctx := context.Background()
	stays, err := p.acquire(ctx, "c", 1, func() {})
	if err != nil {
		t.Fatal(err)
	}
	gaveUp, served := 0, 0
	for gaveUp == 0 || served == 0 {
		if gaveUp+served == 10000 {
			t.Fatalf("after %d waiters granted as they gave up, %d gave up and %d were served; want both", gaveUp+served, gaveUp, served)
		}
		other, err := p.acquire(ctx, "c", 1, func() {})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		// onWait runs after the waiter queued and before it waits: the
		// release grants it the unit, then its context ends, so both are
		// ready when it looks.
		h, err := p.acquire(wctx, "c", 1, func() { other.release(); cancel() })
		switch {
		case err == nil:
			served++
			h.release()
		case errors.Is(err, context.Canceled):
			gaveUp++
		default:
			t.Fatal(err)
		}
		p.mu.Lock()
		s := p.m["c"]
		used, waiting := s.used, s.waiting
		p.mu.Unlock()
		if used != 1 || waiting != 0 {
			t.Fatalf("after a waiter granted as it gave up (%v): %d units used, %d waiting; want the 1 held, 0", err, used, waiting)
		}
	}
	stays.release()
	if len(p.m) != 0 {
		t.Fatalf("state left behind: %v", p.m)
	}
}

// TestAnIdentitysConnectionsShareItsTurns: calls carrying sub-keys (an
// identity's connections) share the key's cap: a connection flooding it
// does not queue another's calls behind its own. A call of a connection
// with fewer units than every waiting one goes at once when it fits, and
// otherwise takes the next turn; each connection's own calls keep their
// order; the state is gone once nothing holds it.
func TestAnIdentitysConnectionsShareItsTurns(t *testing.T) {
	p := pool[string]{cap: 10, queue: 100, m: map[string]*sem{}}
	ctx := context.Background()
	take := func(sub string, n int) hold[string] {
		t.Helper()
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		h, err := p.acquireFor(cctx, "id", sub, n, cancel) // a wait gives up at once
		if err != nil {
			t.Fatalf("%s: %d units waited (%v)", sub, n, err)
		}
		return h
	}
	waitTurn := func(sub string, n int) chan hold[string] {
		ch := make(chan hold[string], 1)
		go func() {
			h, err := p.acquireFor(ctx, "id", sub, n, func() {})
			if err != nil {
				t.Error(err)
			}
			ch <- h
		}()
		return ch
	}
	granted := func(ch chan hold[string]) (hold[string], bool) {
		select {
		case h := <-ch:
			return h, true
		default:
			return hold[string]{}, false
		}
	}
	// The flood holds 8 of 10 units and has 5-unit calls waiting.
	f1, f2 := take("flood", 4), take("flood", 4)
	var floodWaits []chan hold[string]
	for i := range 3 {
		floodWaits = append(floodWaits, waitTurn("flood", 5))
		waitFor(t, &p, "id", 5*(i+1))
	}
	// Another connection's call that fits goes at once.
	g1 := take("good", 1)
	g1.release()
	// One that does not fit (10 of 10 held) takes the next turn, ahead
	// of the flood's waiting calls.
	g2 := take("good", 2) // 10 of 10
	good := waitTurn("good", 3)
	waitFor(t, &p, "id", 18)
	g2.release() // 8 held: nothing fits yet (3 and 5 need more)
	if _, ok := granted(good); ok {
		t.Fatal("a call was granted past the cap")
	}
	f1.release() // 4 held: the good call's turn, then no flood call fits
	h := <-good
	for i, ch := range floodWaits {
		if _, ok := granted(ch); ok {
			t.Fatalf("flood call %d was granted beside the good one", i)
		}
	}
	h.release()
	f2.release() // the flood's calls, in their order: two fit
	first, second := <-floodWaits[0], <-floodWaits[1]
	if _, ok := granted(floodWaits[2]); ok {
		t.Fatal("a call was granted past the cap")
	}
	first.release()
	second.release()
	third := <-floodWaits[2]
	third.release()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.m) != 0 {
		t.Fatalf("state left behind: %v", p.m)
	}
}
