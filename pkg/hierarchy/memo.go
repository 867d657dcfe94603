package hierarchy

import (
	"fmt"
	"math"
)

// Targets are recomputed only when an input changed. A contended key's
// targets are worked out by Allocate and again before every grant a
// region's report answers for it (retarget), up to 1 + R times per epoch,
// while in a steady epoch most of those calls see exactly the inputs of
// the one before. computeTargets therefore remembers, per block, the
// inputs its water-fill and burst split read besides the key's config,
// and skips them when every one is bit-for-bit what it was: the targets
// it wrote then are still in targetRate/targetBurst and are what it
// would write again. The inputs are
//
//   - which regions are silent (a bit per region), since that picks the
//     regions the rate is filled over;
//   - the capacity and burst pool left after the silent regions, which
//     carry the time (their grants' expiry against now) and their
//     summaries;
//   - the reporting regions' demand estimates, which every report and
//     every region's report count move;
//   - a generation of everything else: the key's limit (SetLimit
//     forgets its block's memo), the regions' config (SetRegions) and
//     their lapse states (lapsed, returning: heard, confer, LapseDurable,
//     BecomeLeader), each of which bumps Allocator.targetGen.
//
// Every other write of a block's targets (newBlock, a key no longer
// contended, freeBlock, compactBlocks) forgets its memo. The memo changes
// no decision: TestTargetMemoMatchesRecomputation recomputes on every hit
// and compares to the bit, TestTargetMemoDecidesAsRecomputing compares
// every output with an Allocator that never remembers (memoOff). It costs
// 16 + 8·(R+2) bytes per block (72 with 5 regions).
type targetMemo struct {
	gen    uint64 // Allocator.targetGen when recorded; 0: none recorded
	silent uint64 // bit i: region i silent (MaxRegions <= 64)
}

// memoStride is the number of floats a block's memo holds: capacity,
// pool, then the reporting regions' demands in region order.
func (a *Allocator) memoStride() int { return a.nr + 2 }

// sharesChanged is called whenever a region's config or lapse state
// changes: every block's memo is forgotten, and whether loadShares may
// take its short way is decided anew.
func (a *Allocator) sharesChanged() {
	a.targetGen++
	a.plainRegions = true
	for i := range a.regions {
		if rs := &a.regions[i]; rs.Drained || rs.lapsed || rs.returning {
			a.plainRegions = false
		}
	}
}

// forgetTargets forgets block b's memo.
func (a *Allocator) forgetTargets(b int32) {
	if int(b) < len(a.memo) {
		a.memo[b].gen = 0
	}
}

// growMemo gives blocks 0..nb-1 a memo slot each.
func (a *Allocator) growMemo(nb int) {
	for len(a.memo) < nb {
		a.memo = append(a.memo, targetMemo{})
		a.memoIn = append(a.memoIn, make([]float64, a.memoStride())...)
	}
}

// resetMemo forgets every memo and lays them out for nb blocks of the
// current region count.
func (a *Allocator) resetMemo(nb int) {
	a.memo = make([]targetMemo, nb)
	a.memoIn = make([]float64, nb*a.memoStride())
	a.sharesChanged()
}

// targetsCurrent reports whether block b's targets were computed from
// exactly these inputs (see targetMemo).
func (a *Allocator) targetsCurrent(b int32, silent uint64, capacity, pool float64, dem []float64) bool {
	if a.memoOff || int(b) >= len(a.memo) {
		return false
	}
	m := &a.memo[b]
	if m.gen != a.targetGen || m.silent != silent {
		return false
	}
	in := a.memoIn[int(b)*a.memoStride():]
	if !sameBits(in[0], capacity) || !sameBits(in[1], pool) {
		return false
	}
	in = in[2 : 2+len(dem)]
	for j, d := range dem {
		if !sameBits(in[j], d) {
			return false
		}
	}
	return true
}

// rememberTargets records the inputs block b's targets were just
// computed from.
func (a *Allocator) rememberTargets(b int32, silent uint64, capacity, pool float64, dem []float64) {
	if int(b) >= len(a.memo) {
		return
	}
	a.memo[b] = targetMemo{gen: a.targetGen, silent: silent}
	in := a.memoIn[int(b)*a.memoStride():]
	in[0], in[1] = capacity, pool
	copy(in[2:2+len(dem)], dem)
}

func sameBits(x, y float64) bool { return math.Float64bits(x) == math.Float64bits(y) }

// memoCheck, when set (by tests), recomputes the targets on every memo
// hit and counts the hits whose targets differ in any bit from the
// recomputation.
type memoCheck struct {
	hits, mismatches int
	first            string // the first mismatch
}

func (c *memoCheck) verify(a *Allocator, k, b int32, recompute func()) {
	c.hits++
	base := int(b) * a.nr
	var was [2 * MaxRegions]float64
	copy(was[:a.nr], a.targetRate[base:base+a.nr])
	copy(was[a.nr:2*a.nr], a.targetBurst[base:base+a.nr])
	recompute()
	for i := 0; i < a.nr; i++ {
		r, bu := a.targetRate[base+i], a.targetBurst[base+i]
		if sameBits(r, was[i]) && sameBits(bu, was[a.nr+i]) {
			continue
		}
		if c.mismatches == 0 {
			c.first = fmt.Sprintf("key %s region %s: remembered targets %v/%v, recomputed %v/%v",
				a.keys[k], a.regions[i].Name, was[i], was[a.nr+i], r, bu)
		}
		c.mismatches++
		return
	}
}
