package luascripts

import "sync"

// GenJump is how far a data set's write generation jumps past the highest
// one its caller has seen when its born sentinel is written (a re-birth, or
// a missing sentinel stamped): writes of the lost history that other
// callers saw (at most GenJump beyond this caller's view) then do not
// re-birth the data set a second time. See lib.lua, Rollback.
const GenJump = 1 << 32

// Generations is what one process has seen of its data sets: per born
// sentinel (Keys.Born: one per Redis, or one per hash slot on a cluster),
// the highest write generation a script reply showed. The scripts take it
// with every call and re-birth a data set whose stored generation is below
// it (restored from an older snapshot, or a replica promoted while it
// lagged: see lib.lua, Rollback). Safe for concurrent use.
type Generations struct {
	mu   sync.Mutex
	seen map[string]int64 // guarded by mu: born sentinel -> highest generation seen
	// onRebirth is called (outside mu) for every reply that re-birthed a
	// data set; guarded by mu.
	onRebirth func(born string, bornUS int64)
}

// NewGenerations returns a view that has seen nothing.
func NewGenerations() *Generations { return &Generations{seen: map[string]int64{}} }

// Seen is the highest generation of the data set of sentinel born seen
// so far (0: none).
func (g *Generations) Seen(born string) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[born]
}

// OnRebirth sets f to be called, outside any lock, for every script reply
// that re-birthed a data set, with its sentinel and its new birth (µs,
// Redis time). nil removes it.
func (g *Generations) OnRebirth(f func(born string, bornUS int64)) {
	g.mu.Lock()
	g.onRebirth = f
	g.mu.Unlock()
}

// note records a reply's generation of the data set of sentinel born, and
// reports a re-birth (at nowUS, the reply's Redis time).
func (g *Generations) note(born string, gen int64, reborn bool, nowUS int64) {
	g.mu.Lock()
	if gen > g.seen[born] {
		g.seen[born] = gen
	}
	f := g.onRebirth
	g.mu.Unlock()
	if reborn && f != nil {
		f(born, nowUS)
	}
}
