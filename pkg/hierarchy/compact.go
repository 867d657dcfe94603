package hierarchy

import "github.com/sluicehq/sluice/pkg/quota"

// compactMin is the number of key slots (or blocks) below which the
// Allocator never renumbers them: small tables are not worth the work.
var compactMin = 1024 // a variable so tests can compare with an Allocator that never compacts

// compactLocked renumbers the key slots, and the fencing blocks, densely
// once at most a quarter of them is in use, so the Allocator's memory
// follows the keys it holds rather than the most it ever held (freed slots
// are reused, but slices and maps never shrink by themselves). Each
// renumbering costs O(slots) and happens only after three quarters of the
// slots were freed, so it is O(1) amortized per RemoveKey or freed block.
// Outputs do not change: only internal indices move. a.mu is held.
func (a *Allocator) compactLocked() {
	if n := len(a.keys); n >= compactMin && len(a.keyIndex) < n/4 {
		a.compactKeys()
	}
	if n := len(a.blockKey); n >= compactMin && n-len(a.freeBlocks) < n/4 {
		a.compactBlocks()
	}
}

// compactKeys gives the live keys slots 0..n-1 in their current order.
func (a *Allocator) compactKeys() {
	nr := a.nr
	live := len(a.keyIndex)
	remap := make([]int32, len(a.keys)) // old slot -> new, -1 when free
	keys := make([]quota.Key, 0, live)
	limits := make([]KeyLimit, 0, live)
	keyLive := make([]bool, 0, live)
	blockOf := make([]int32, 0, live)
	seenStamp := make([]uint32, 0, live)
	seenPos := make([]int32, 0, live)
	named := make([]int64, 0, live)
	grantEnd := make([]int64, 0, live)
	demand := make([]float64, 0, live*nr)
	sburst := make([]float64, 0, live*nr)
	lastObs := make([]uint32, 0, live*nr)
	wantAt := make([]int64, 0, live*nr)
	wantDem := make([]float64, 0, live*nr)
	index := make(map[quota.Key]int32, live)
	for old := range a.keys {
		if !a.keyLive[old] {
			remap[old] = -1
			continue
		}
		k := int32(len(keys))
		remap[old] = k
		index[a.keys[old]] = k
		keys = append(keys, a.keys[old])
		limits = append(limits, a.limits[old])
		keyLive = append(keyLive, true)
		blockOf = append(blockOf, a.blockOf[old])
		seenStamp = append(seenStamp, a.seenStamp[old])
		seenPos = append(seenPos, a.seenPos[old])
		named = append(named, a.named[old])
		grantEnd = append(grantEnd, a.grantEnd[old])
		demand = append(demand, a.demand[old*nr:(old+1)*nr]...)
		sburst = append(sburst, a.sburst[old*nr:(old+1)*nr]...)
		lastObs = append(lastObs, a.lastObs[old*nr:(old+1)*nr]...)
		wantAt = append(wantAt, a.wantAt[old*nr:(old+1)*nr]...)
		wantDem = append(wantDem, a.wantDem[old*nr:(old+1)*nr]...)
	}
	a.keys, a.limits, a.keyLive, a.blockOf = keys, limits, keyLive, blockOf
	a.seenStamp, a.seenPos, a.named, a.grantEnd = seenStamp, seenPos, named, grantEnd
	a.demand, a.sburst, a.lastObs = demand, sburst, lastObs
	a.wantAt, a.wantDem = wantAt, wantDem
	a.keyIndex = index
	a.freeKeys = nil
	for b, k := range a.blockKey {
		if k >= 0 {
			a.blockKey[b] = remap[k]
		}
	}
	active := a.active[:0]
	for _, k := range a.active {
		if nk := remap[k]; nk >= 0 {
			active = append(active, nk)
		}
	}
	a.active = active
	for i := range a.regions {
		po := a.regions[i].prevOrder
		for j, k := range po {
			if k >= 0 {
				po[j] = remap[k]
			}
		}
	}
	a.byRank, a.rankDirty = nil, true
	a.reportIdx = nil
	a.dropRemovedGrants()
}

// dropRemovedGrants takes the grants for removed keys out of the answers
// kept for retries, into new slices, so a region that stopped reporting
// does not keep every key it was ever granted alive. A retry answered
// without such a grant is still safe: a region that applied it keeps it
// until it expires, and one that never received it runs on what it held.
func (a *Allocator) dropRemovedGrants() {
	for i := range a.regions {
		rs := &a.regions[i]
		n := 0
		for _, g := range rs.answer {
			if _, ok := a.keyIndex[g.Key]; ok {
				n++
			}
		}
		if n == len(rs.answer) {
			continue
		}
		kept := make([]Grant, 0, n)
		for _, g := range rs.answer {
			if _, ok := a.keyIndex[g.Key]; ok {
				kept = append(kept, g)
			}
		}
		rs.answer = kept
	}
}

// compactBlocks gives the blocks in use numbers 0..n-1 in their current
// order.
func (a *Allocator) compactBlocks() {
	nr := a.nr
	used := len(a.blockKey) - len(a.freeBlocks)
	blockKey := make([]int32, 0, used)
	contended := make([]bool, 0, used)
	transfer := make([]inFlight, 0, used)
	summaries := make([]summary, 0, used*nr)
	targetRate := make([]float64, 0, used*nr)
	targetBurst := make([]float64, 0, used*nr)
	fences := make([][]fence, len(a.fences))
	for i := range fences {
		fences[i] = make([]fence, 0, used)
	}
	for old, k := range a.blockKey {
		if k < 0 {
			continue
		}
		a.blockOf[k] = int32(len(blockKey))
		blockKey = append(blockKey, k)
		contended = append(contended, a.blockContended[old])
		transfer = append(transfer, a.transfer[old])
		summaries = append(summaries, a.summaries[old*nr:(old+1)*nr]...)
		targetRate = append(targetRate, a.targetRate[old*nr:(old+1)*nr]...)
		targetBurst = append(targetBurst, a.targetBurst[old*nr:(old+1)*nr]...)
		for i := range fences {
			fences[i] = append(fences[i], a.fences[i][old])
		}
	}
	a.blockKey, a.blockContended, a.transfer = blockKey, contended, transfer
	a.summaries, a.targetRate, a.targetBurst = summaries, targetRate, targetBurst
	a.fences = fences
	a.freeBlocks = nil
	a.resetMemo(len(a.blockKey))
}
