package lease

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Concurrency conformance of the lock-free structures: the pool word that
// the hot path spends with one compare-and-swap, the owner's refills and
// drains racing it, and the key map that the hot path reads without locks
// while keys are created and forgotten. The simulator is single-threaded
// and cannot see any of this. Each test races many goroutines on one key
// (or a few) for enough rounds that compare-and-swaps certainly lose races
// (each test reports how many did), and checks that admitted never exceeds
// what the leases held. Each runs in well under 5 s under -race.

// moreThreads runs the test with more threads than cores: the OS and the
// Go scheduler then preempt spenders between their load and their swap,
// the window a lost race needs.
func moreThreads(t *testing.T) {
	prev := runtime.GOMAXPROCS(4 * runtime.NumCPU())
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
}

// hammers is the number of goroutines spending on one key: more than the
// cores, so spends are preempted between their load and their swap.
func hammers() int { return max(8, 4*runtime.GOMAXPROCS(0)) }

// startTogether runs n copies of f at once and waits for them.
func startTogether(n int, f func(g int)) {
	var ready, done sync.WaitGroup
	gate := make(chan struct{})
	ready.Add(n)
	done.Add(n)
	for g := range n {
		go func() {
			defer done.Done()
			ready.Done()
			<-gate
			f(g)
		}()
	}
	ready.Wait()
	close(gate)
	done.Wait()
}

// lostRaces counts the compare-and-swaps on e's pool word that lost a race
// during f: a spend that had to retry. It watches the word through a
// second, instrumented spend loop, so the pool code under test is left as
// it is.
type raceCounter struct{ lost atomic.Int64 }

func (rc *raceCounter) take(e *entry, cost int64) bool {
	for {
		old := e.word.Load()
		if int64(old&poolMask) < cost {
			return false
		}
		if e.word.CompareAndSwap(old, old-uint64(cost)+admitUnit) {
			return true
		}
		rc.lost.Add(1)
	}
}

// TestPoolTakeNeverOverAdmits: many goroutines spend one pool with the hot
// path's take while the owner credits it a token at a time (a refill
// landing under the spenders: every credit makes the compare-and-swap of a
// spend in progress lose). Exactly the tokens credited are admitted, no
// more, round after round. A quarter of the goroutines spend through an
// instrumented copy of the loop, only to show that races were lost in the
// run; the checked admissions include those of take itself.
func TestPoolTakeNeverOverAdmits(t *testing.T) {
	// Rounds go on until races were certainly lost (or a cap on slow
	// machines, where one round already loses some).
	const minRounds, maxRounds, wantLost, initial, credits = 2, 8, 200, 20000, 20000
	moreThreads(t)
	n := hammers()
	var rc raceCounter
	rounds := 0
	for round := 0; round < maxRounds && (round < minRounds || rc.lost.Load() < wantLost); round++ {
		rounds++
		e := &entry{}
		e.mu.Lock()
		e.creditLocked(initial)
		e.mu.Unlock()
		var admitted atomic.Int64
		var refilled atomic.Bool
		startTogether(n+1, func(g int) {
			if g == n { // the owner
				for range credits {
					e.mu.Lock()
					e.creditLocked(1)
					e.mu.Unlock()
				}
				refilled.Store(true)
				return
			}
			cost := int64(1 + g%3) // mixed costs: a big spend may lose to small ones
			for {
				done := refilled.Load() // read before trying: nothing can arrive after a failure then
				var ok bool
				if g%4 == 3 {
					ok = rc.take(e, cost)
				} else {
					_, _, ok = e.take(cost, 0)
				}
				switch {
				case ok:
					admitted.Add(cost)
				case done:
					return
				default:
					runtime.Gosched()
				}
			}
		})
		left := e.tokens()
		if got := admitted.Load(); got+left != initial+credits {
			t.Fatalf("round %d: admitted %d tokens with %d left of the %d credited", round, got, left, initial+credits)
		}
		if left >= 3 { // every goroutine stops only when it cannot pay its cost
			t.Fatalf("round %d: %d tokens left although goroutines wanted them", round, left)
		}
	}
	if rc.lost.Load() == 0 && raceDetector {
		t.Fatal("no compare-and-swap lost a race: the test proves nothing on this machine")
	}
	t.Logf("%d lost compare-and-swaps in the instrumented quarter over %d rounds × %d goroutines", rc.lost.Load(), rounds, n)
}

// grantAll answers every report of b with what it wants, capped at most
// (a region with a deep bucket and a 5 s TTL), applies it at now and
// returns the tokens granted.
func grantAll(t *testing.T, tb *Table, now time.Time, b *Batch, most int64) int64 {
	t.Helper()
	if b == nil {
		return 0
	}
	var total int64
	gs := make([]*sluicev1.Grant, len(b.Reports))
	for i, r := range b.Reports {
		n := min(r.Want, most)
		total += n
		gs[i] = &sluicev1.Grant{
			Key: r.Key, Seq: r.Seq, Granted: n, TtlMs: testTTL.Milliseconds(),
			RegionRate: 1000, RegionBurst: 10000, LiveInstances: 1, Limit: 10000,
			Mode: "lease", OnFailure: "closed", Tier: "pro",
		}
	}
	if err := tb.Apply(now, b, gs); err != nil {
		t.Errorf("Apply: %v", err)
	}
	return total
}

// vclock is a virtual clock the owner advances while spenders read it.
type vclock struct{ us atomic.Int64 }

func (c *vclock) now() time.Time      { return t0.Add(time.Duration(c.us.Load()) * time.Microsecond) }
func (c *vclock) add(d time.Duration) { c.us.Add(d.Microseconds()) }

// TestAllowRacesRefillAndExpiry: many goroutines spend one key through both
// hot paths (Allow and the clock-free allowFast) while one owner refills it
// with acquires and syncs, drains the excess, and lets leases expire (the
// pool emptied under the spenders). Whatever interleaving happens, the
// tokens admitted never exceed the tokens granted, and they equal exactly
// what the table books as spent, which is what its reports tell the region.
func TestAllowRacesRefillAndExpiry(t *testing.T) {
	moreThreads(t)
	// The owner moves the virtual clock a lease TTL every 97 rounds, and a
	// starved machine can run it tens of thousands of rounds while the
	// spenders wait for a core: an hour of virtual time went by once, the
	// key was forgotten as idle and the books below could not be read. The
	// race under test is spending against refill and expiry, not
	// forgetting, so the key never idles out.
	tb := newTestTable(t, func(o *TableOptions) { o.IdleTimeout = 100_000 * time.Hour })
	key := quota.Key{Tenant: "acme", Class: "hot"}
	var clk vclock
	var admitted, granted atomic.Int64
	stop := make(chan struct{})
	ownerDone := make(chan struct{})
	go func() { // the owner: the only goroutine that refills, drains or expires
		defer close(ownerDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			now := clk.now()
			switch {
			case i%97 == 0:
				// Jump past the deadline: Expire drains the pool while
				// spenders race it.
				clk.add(testTTL + time.Millisecond)
				tb.Expire(clk.now())
			case i%5 == 0:
				syncs, release := tb.PrepareSync(now)
				for _, b := range syncs {
					granted.Add(grantAll(t, tb, now, b, 64))
				}
				if release != nil {
					tb.Failed(now, release)
				}
			default:
				if b, _ := tb.PrepareAcquire(now, key, 1); b != nil {
					granted.Add(grantAll(t, tb, now, b, 64))
				}
			}
			clk.add(time.Millisecond)
			tb.Expire(clk.now())
			runtime.Gosched()
		}
	}()
	n := hammers()
	const target = 20000 // tokens the spenders admit together before they stop
	startTogether(n, func(g int) {
		for i := 0; admitted.Load() < target; i++ {
			cost := int64(1 + (g+i)%2)
			if g%2 == 0 {
				if _, _, _, ok := tb.allowFast(key, cost, tb.instant(clk.now())); ok {
					admitted.Add(cost)
				} else {
					runtime.Gosched() // let the owner refill
				}
				continue
			}
			d, act, err := tb.Allow(clk.now(), key, cost)
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed && (act == ActNone || act == ActRefill) {
				admitted.Add(cost)
			} else {
				runtime.Gosched()
			}
		}
	})
	close(stop)
	<-ownerDone
	st := state(t, tb, key)
	t.Logf("admitted %d of %d granted; %d in the pool; spent %d", admitted.Load(), granted.Load(), st.Tokens, st.Spent)
	if admitted.Load() > granted.Load() {
		t.Fatalf("admitted %d tokens, the region granted %d", admitted.Load(), granted.Load())
	}
	if st.Spent != admitted.Load() {
		t.Fatalf("spenders admitted %d tokens, the table books %d spent", admitted.Load(), st.Spent)
	}
	if admitted.Load() == 0 || granted.Load() == 0 {
		t.Fatal("nothing was granted or admitted: the race never happened")
	}
}

// TestKeyMapRacesCreateAndForget: spenders create a few keys at once and
// spend them while the owner forgets idle keys (their pools drained into
// the final report) and refills the rest. A key never has two live entries
// (each spender that creates a key at the same moment gets the same one),
// a spender holding a stale entry cannot spend from it once it is
// forgotten, and in total no more is admitted than was granted.
func TestKeyMapRacesCreateAndForget(t *testing.T) {
	moreThreads(t)
	tb := newTestTable(t, func(o *TableOptions) { o.IdleTimeout = 2 * time.Millisecond })
	const nkeys = 6
	keys := make([]quota.Key, nkeys)
	for i := range keys {
		keys[i] = quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "hot"}
	}
	var clk vclock
	var admitted, granted, forgotten atomic.Int64
	stop := make(chan struct{})
	ownerDone := make(chan struct{})
	go func() {
		defer close(ownerDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			clk.add(time.Millisecond)
			now := clk.now()
			syncs, release := tb.PrepareSync(now)
			for _, b := range syncs {
				granted.Add(grantAll(t, tb, now, b, 16))
			}
			if release != nil {
				forgotten.Add(int64(len(release.Reports)))
				tb.Failed(now, release)
			}
			for _, k := range keys {
				if b, _ := tb.PrepareAcquire(now, k, 1); b != nil {
					granted.Add(grantAll(t, tb, now, b, 16))
				}
			}
			runtime.Gosched()
		}
	}()
	n := hammers()
	const perSpender = 3000
	var dupes atomic.Int64
	startTogether(n, func(g int) {
		for i := range perSpender {
			// Spenders move from key to key in step, so a key goes idle,
			// is forgotten, and is created again by several at once.
			k := keys[(i/200+g%2)%nkeys]
			e, err := tb.entryFor(clk.now(), k)
			if err != nil {
				t.Error(err)
				return
			}
			if cur := tb.keys.lookupFresh(k); cur != nil && cur != e && !e.has(removedFlag) && !cur.has(removedFlag) {
				dupes.Add(1)
			}
			if _, _, _, ok := tb.allowFast(k, 1, tb.instant(clk.now())); ok {
				admitted.Add(1)
				continue
			}
			d, act, err := tb.Allow(clk.now(), k, 1)
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed && (act == ActNone || act == ActRefill) {
				admitted.Add(1)
			} else {
				runtime.Gosched() // let the owner refill
			}
		}
	})
	close(stop)
	<-ownerDone
	t.Logf("admitted %d of %d granted; %d keys forgotten and re-created", admitted.Load(), granted.Load(), forgotten.Load())
	if dupes.Load() != 0 {
		t.Fatalf("%d times a key had two live entries", dupes.Load())
	}
	if admitted.Load() > granted.Load() {
		t.Fatalf("admitted %d tokens, the region granted %d", admitted.Load(), granted.Load())
	}
	// Every admission of a forgotten entry is folded into the table's
	// counts when it is removed; the live ones are read from their pool
	// words. Cost is 1, so requests are tokens.
	var counted uint64
	for _, c := range tb.Counts() {
		if c.Result == ResultAllowed && !c.Degraded {
			counted += c.N
		}
	}
	if counted != uint64(admitted.Load()) {
		t.Fatalf("spenders admitted %d requests, the table counted %d", admitted.Load(), counted)
	}
	if forgotten.Load() == 0 || admitted.Load() == 0 {
		t.Fatalf("forgot %d keys, admitted %d: the race never happened", forgotten.Load(), admitted.Load())
	}
}

// TestFirstDecisionsOfAKeyAreAllCounted: goroutines denied at once on a
// key none was denied on before (its counts are made on first use) are all
// counted, and all their tokens reported as denied.
func TestFirstDecisionsOfAKeyAreAllCounted(t *testing.T) {
	moreThreads(t)
	tb := newTestTable(t)
	const rounds = 5000
	n := hammers()
	for i := range rounds {
		key := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
		allow(t, tb, t0, key, 1) // makes the key, not its counts
		startTogether(n, func(int) { tb.Exhausted(t0, key, 1) })
	}
	want := uint64(rounds * n)
	var counted uint64
	for _, c := range tb.Counts() {
		counted += c.N
	}
	var reported int64
	syncs, _ := tb.PrepareSync(t0.Add(time.Second))
	for _, b := range syncs {
		for _, r := range b.Reports {
			reported += r.Denied
		}
	}
	if counted != want || reported != int64(want) {
		t.Fatalf("%d rounds of %d goroutines denied at once on a new key: %d denials counted, %d tokens reported denied; want %d",
			rounds, n, counted, reported, want)
	}
}
