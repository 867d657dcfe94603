package regionsync

import (
	"github.com/sluicehq/sluice/pkg/quota"
)

// Fresh keys: a new hot key reported between epochs.
//
// The rise watch (rise.go) reads only the keys the last report watched, so
// a key that starts being hot between two epoch reports (a new tenant's
// burst of traffic, the first seconds of a key) waits for the next epoch
// report to reach the allocator, up to an epoch on its static share while
// the other regions' shares of it go unused. The scripts mark such a key
// into its slot's candidate set within a mark interval of its demand
// reaching half the static share (select.go); a mark of a key the set did
// not hold adds a member. So between epochs, with the rise watch's reads,
// the leader reads the set's size, and only when it grew the marks since
// its last look: the keys among them it neither reports nor watches are
// fresh, and their states are read and judged as a rise from nothing
// (Moved, with no demand reported). A steady region (its candidates marked
// again and again, none added) costs one ZCARD per look.
//
// Only a single Redis is looked at this way: on a cluster the candidate
// sets are one per hash slot, and reading 16,384 sizes every NudgeSpacing
// would cost more than the epoch reports; there a fresh key waits for the
// next epoch report, as before. What is missed (a trim between two looks
// that removed as many members as were added, a mark that lands just
// before the look that records the size) is reported by the next epoch
// report: the watch changes when a key is reported, never which keys are.

// FreshWatch remembers the candidate set's size between looks. The zero
// value is ready: its first look only records. Not safe for concurrent
// use.
type FreshWatch struct {
	card   int64 // the set's size at the last look
	lastUS int64 // Redis time of the last look (µs); 0: none yet
}

// Look records a look at the candidate set, whose size is card at nowUS
// (Redis time), and says whether to read its marks, and those of scores
// from sinceUS on: only when the set grew since the last look, from that
// look's time.
func (f *FreshWatch) Look(card, nowUS int64) (read bool, sinceUS int64) {
	read = f.lastUS > 0 && card > f.card
	sinceUS = f.lastUS
	f.card, f.lastUS = card, nowUS
	return read, sinceUS
}

// Reset forgets the last look: a new leadership, or a look that failed.
func (f *FreshWatch) Reset() { *f = FreshWatch{} }

// Fresh is the keys of marked (read from the candidate set) that the
// leader neither reports (selected) nor watches, each once, at most
// MaxWatched: the keys a look between epochs reads the states of.
func (l *Leader) Fresh(marked []quota.Key) []quota.Key {
	var out []quota.Key
	seen := make(map[quota.Key]bool)
	for _, w := range l.watch {
		seen[w.key] = true
	}
	for _, k := range marked {
		if len(out) == MaxWatched {
			break
		}
		if _, sel := l.sel[k]; sel || seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, k)
	}
	return out
}
