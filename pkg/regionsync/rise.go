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
// than it holds and than the region last reported (Moved). Watched are the
// keys of the last report that hold a grant or whose demand reached half
// the region's static share: the keys that are or may become contended,
// at most MaxWatched, so the cost is a few state reads per contended key
// per epoch, never one per active key. The report carries each risen
// key's reading over one epoch (Report): its window since the epoch
// report may be under half an epoch, from which the allocator takes no
// reading.

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
// for Moved.
func (l *Leader) Watched() []quota.Key {
	out := make([]quota.Key, len(l.watch))
	for i, w := range l.watch {
		out[i] = w.key
	}
	return out
}

// Moved says whether the states read between epochs (reads, for keys of
// Watched and Fresh) are worth a report now: whether one key asks for
// more than both the rate the region refills it at and the demand last
// reported, by more than a tenth of the region's static share and more
// than the noise of a demand reading (three standard deviations of a
// Poisson count over half an epoch) (rose), and whether one key that holds
// a grant asks for less than both the grant's rate and the demand last
// reported, by as much (fell). What a key asks for is its live leases'
// rates now plus its strict path's decisions per second over the last
// epoch report's window: the strict path keeps counts, not rates, and a
// count over the few milliseconds since that report is noise (2 decisions
// in 125 ms of a steady 20/s read as 16/s). Judged on its leases alone, a
// strict key granted its demand always looked fallen, and the report that
// started cut its grant. So a strict key's own moves are read at the
// epoch reports.
//
// A region whose key fell is a donor the allocator does not know of yet:
// its report lowers its grant, and its acknowledgement frees the capacity
// for the regions whose targets rose (the allocator nudges them,
// pkg/hierarchy nudge.go), up to an epoch before its epoch report would. A key without a grant holds the region's
// static share, which the allocator counts whatever its demand, so its
// fall frees nothing by itself and is left to the epoch report. Both tests
// compare with the demand last reported, so a steady key (its demand as
// reported, whatever its grant) moves neither way.
func (l *Leader) Moved(epoch time.Duration, reads []KeyRead) (rose, fell bool) {
	half := max(epoch.Seconds()/2, 1e-3)
	reported := l.risenFrom()
	for _, r := range reads {
		l.took(r)
		d := r.State.LeaseDemand + l.last[r.Key].strict
		rose = rose || risen(half, d, r, reported[r.Key])
		fell = fell || fallen(half, d, r, reported[r.Key])
	}
	return rose, fell
}

// risen is Moved's test of a rise for one key read as r asking for d: more
// than both the rate it refills at and the demand last reported, beyond a
// tenth of the static share and three standard deviations of a Poisson
// count over half an epoch (half, seconds).
func risen(half, d float64, r KeyRead, reported float64) bool {
	base := max(reported, r.State.Rate)
	return d > base+max(riseShare*r.StaticRate, 3*math.Sqrt(d/half))
}

// fallen is Moved's test of a fall for one key read as r asking for d: it
// holds a grant, and d is less than both the grant's rate and the demand
// last reported, beyond a tenth of the static share and three standard
// deviations of a Poisson count over half an epoch at the lower of the
// two (the rate it falls from).
func fallen(half, d float64, r KeyRead, reported float64) bool {
	if r.State.GrantExpiryUS <= 0 {
		return false
	}
	top := min(reported, r.State.Rate)
	return d < top-max(riseShare*r.StaticRate, 3*math.Sqrt(top/half))
}

// risenFrom is the demand each watched key last reported, for risen and
// fallen.
func (l *Leader) risenFrom() map[quota.Key]float64 {
	reported := make(map[quota.Key]float64, len(l.watch))
	for _, w := range l.watch {
		reported[w.key] = w.reported
	}
	return reported
}
