package regionsync

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// Rises: reporting a demand rise between epochs.
//
// A region reports a key's demand once per epoch, so a region whose demand
// for a key jumps (users failing over to it, a shift of traffic) runs on
// its old grant for up to an epoch before the allocator even hears of it,
// and then for the round trips of the shift. Between epochs the region
// leader therefore reads, every NudgeSpacing, the state of the keys it
// watches, and starts a round at once (like a nudge from the global
// leader, with the same spacing) when one of them asks for materially more
// than it holds and than the region last reported (Risen). Watched are the
// keys of the last report that hold a grant or whose demand reached half
// the region's static share: the keys that are or may become contended,
// at most MaxWatched, so the cost is a few state reads per contended key
// per epoch, never one per active key.

// MaxWatched bounds the keys a region leader watches for rises.
const MaxWatched = 256

// riseShare is the least rise, as a share of the region's static share of
// the key, that is worth a report between epochs.
const riseShare = 0.1

// watched is what the leader remembers of a watched key: the demand rate
// it last reported.
type watched struct {
	key      quota.Key
	reported float64
}

// noteWatched records, from a report just built, the keys to watch and the
// demand each reported.
func (l *Leader) noteWatched(reads []KeyRead, demand []float64) {
	l.watch = l.watch[:0]
	for i, r := range reads {
		if len(l.watch) == MaxWatched {
			break
		}
		if r.State.GrantExpiryUS > 0 || r.State.LeaseDemand >= r.StaticRate/2 {
			l.watch = append(l.watch, watched{key: r.Key, reported: demand[i]})
		}
	}
}

// Watched is the keys to read between epochs (in the last report's order),
// for Risen.
func (l *Leader) Watched() []quota.Key {
	out := make([]quota.Key, len(l.watch))
	for i, w := range l.watch {
		out[i] = w.key
	}
	return out
}

// Risen says whether the states read between epochs (reads, for keys of
// Watched) show a key whose live leases ask for more than both the rate
// the region refills it at and the demand last reported, by more than a
// tenth of the region's static share and more than the noise of a demand
// reading (three standard deviations of a Poisson count over half an
// epoch): worth a report now.
func (l *Leader) Risen(epoch time.Duration, reads []KeyRead) bool {
	half := max(epoch.Seconds()/2, 1e-3)
	reported := make(map[quota.Key]float64, len(l.watch))
	for _, w := range l.watch {
		reported[w.key] = w.reported
	}
	for _, r := range reads {
		d := r.State.LeaseDemand
		base := max(reported[r.Key], r.State.Rate)
		if d > base+max(riseShare*r.StaticRate, 3*math.Sqrt(d/half)) {
			return true
		}
	}
	return false
}
