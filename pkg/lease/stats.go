package lease

import "sort"

// Decision counts are kept per key in atomics (the hot path's admitted
// count rides in the pool word) and folded, on demand, into totals per
// (class, tier): at every PrepareSync, when a key is forgotten, and when
// Counts is read. Folding keeps the totals monotonic across forgotten keys
// and keeps the 32-bit admitted count from wrapping unseen (that would take
// 2^32 admissions of one key between two folds). A key's counts are
// attributed to the tier it had when they were folded: the region's, or
// until the region names one, TableOptions.Tier's.

type statsLabels struct{ class, tier string }

// DecisionCount is the number of decisions of one kind for one class and
// tier since the table was created.
type DecisionCount struct {
	Class, Tier string // Tier is "unknown" until the region or TableOptions.Tier names it
	Result      Result
	Degraded    bool
	N           uint64
}

const unknownTier = "unknown"

// foldLocked adds e's counts since its last fold to the totals. Caller
// holds statsMu.
func (t *Table) foldLocked(e *entry) {
	tier := e.info.Load().tierName()
	if tier == "" && t.opts.Tier != nil {
		tier = t.opts.Tier(e.key())
	}
	if tier == "" {
		tier = unknownTier
	}
	lbl := statsLabels{class: e.class.Value(), tier: tier}
	tot := t.totals[lbl]
	add := func(i int, n uint64) {
		if n == 0 {
			return
		}
		if tot == nil {
			tot = new([resultSlots]uint64)
			t.totals[lbl] = tot
		}
		tot[i] += n
	}
	adm := uint32(e.word.Load() >> 32)
	add(slot(ResultAllowed, false), uint64(adm-e.foldedAdmitted))
	e.foldedAdmitted = adm
	if c := e.rare.Load(); c != nil {
		for i := range c.results {
			v := c.results[i].Load()
			add(i, v-c.folded[i])
			c.folded[i] = v
		}
	}
}

func (t *Table) foldAll() {
	entries := t.keys.entries()
	t.statsMu.Lock()
	defer t.statsMu.Unlock()
	for _, e := range entries {
		if !e.has(removedFlag) {
			t.foldLocked(e)
		}
	}
}

// Counts returns the decision totals, sorted by class, tier, result and
// degraded. Only non-zero counts are listed.
func (t *Table) Counts() []DecisionCount {
	t.foldAll()
	t.statsMu.Lock()
	defer t.statsMu.Unlock()
	var out []DecisionCount
	for lbl, tot := range t.totals {
		for i, n := range tot {
			if n == 0 {
				continue
			}
			out = append(out, DecisionCount{Class: lbl.class, Tier: lbl.tier, Result: Result(i / 2), Degraded: i%2 == 1, N: n})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		switch {
		case a.Class != b.Class:
			return a.Class < b.Class
		case a.Tier != b.Tier:
			return a.Tier < b.Tier
		case a.Result != b.Result:
			return a.Result < b.Result
		}
		return !a.Degraded && b.Degraded
	})
	return out
}
